"""A bare gRPC echo server on the same stack as sessionlog: the ceiling of the transport.

    python -m bench.echo --listen 127.0.0.1:PORT

It is built like the sessionlog server (grpc.aio, generic handlers taking and returning raw
bytes, the same channel options, the standard health service) and does no work of its own:

- ``/bench.Echo/Unary`` returns the request bytes.
- ``/bench.Echo/UnaryViaThread`` returns them too, but only once a worker thread has handed them
  back, the way the store's writer hands back appends: the handler awaits a future of the event
  loop, and the thread resolves everything it took in one ``call_soon_threadsafe``. It is the
  round trip every append makes to the writer thread (which must own the fsync, so that it never
  blocks the event loop) with no work on either side: what that hand-off alone costs.
- ``/bench.Echo/Stream`` takes an event count N (ASCII digits) and streams SinceResponse messages
  holding N stored benchmark events, batched as Since batches them. The batches are built once
  per N and cached, so a timed stream measures only sending.

It runs on the same event loop as sessionlog (``sessionlog.startup.run_event_loop``: uvloop, the
same GIL switch interval) and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import threading
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from bench.common import since_batches, stored_event
from sessionlog.startup import run_event_loop

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
UNARY_VIA_THREAD = f"/{SERVICE}/UnaryViaThread"
STREAM = f"/{SERVICE}/Stream"
MAX_MESSAGE_BYTES = 64 << 20
MAX_STREAM_EVENTS = 10_000_000

_batches: dict[int, list[bytes]] = {}


async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


_handoffs: queue.SimpleQueue[tuple[asyncio.Future[bytes], bytes]] = queue.SimpleQueue()


def _hand_back(loop: asyncio.AbstractEventLoop) -> None:
    """The worker thread, shaped like the store's writer: take everything queued, then hand the
    loop the whole batch in one ``call_soon_threadsafe`` (the writer does so once per commit
    group). A call that ended first (its client gone) cancelled its future: it is skipped."""
    while True:
        batch = [_handoffs.get()]
        while True:
            try:
                batch.append(_handoffs.get_nowait())
            except queue.Empty:
                break
        loop.call_soon_threadsafe(_resolve_all, [job for job in batch if not job[0].cancelled()])


def _resolve_all(batch: list[tuple[asyncio.Future[bytes], bytes]]) -> None:
    for future, request in batch:
        if not future.done():
            future.set_result(request)


async def unary_via_thread(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    _handoffs.put((future, request))
    return await future


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
            "UnaryViaThread": grpc.unary_unary_rpc_method_handler(unary_via_thread),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )
    server.add_generic_rpc_handlers((handlers,))
    loop = asyncio.get_running_loop()
    threading.Thread(target=_hand_back, args=(loop,), name="echo-handoff", daemon=True).start()
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
    run_event_loop(serve(parser.parse_args().listen))


if __name__ == "__main__":
    main()
