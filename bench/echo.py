"""A bare gRPC echo server on the same stack as sessionlog: the ceiling of the transport.

    python -m bench.echo --listen 127.0.0.1:PORT

It is built like the sessionlog server (grpc.aio, generic handlers taking and returning raw
bytes, the same channel options, the standard health service) and does no work of its own:

- ``/bench.Echo/Unary`` returns the request bytes.
- ``/bench.Echo/Stream`` takes an event count N (ASCII digits) and streams SinceResponse messages
  holding N stored benchmark events, batched as Since batches them. The batches are built once
  per N and cached, so a timed stream measures only sending.

It stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from bench.common import since_batches, stored_event

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
MAX_MESSAGE_BYTES = 64 << 20
MAX_STREAM_EVENTS = 10_000_000

_batches: dict[int, list[bytes]] = {}


async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    count = int(request.decode() or "0")
    if not 0 <= count <= MAX_STREAM_EVENTS:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "count out of range")
    batches = _batches.get(count)
    if batches is None:
        batches = _batches[count] = since_batches([stored_event(seq) for seq in range(count)])
    for batch in batches:
        yield batch


async def serve(listen: str) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    handlers = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )
    server.add_generic_rpc_handlers((handlers,))
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"echo: cannot listen on {listen}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    asyncio.run(serve(parser.parse_args().listen))


if __name__ == "__main__":
    main()
