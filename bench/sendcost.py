"""The event loop's CPU per streamed response: a bare ``context.write`` beside the guarded one.

    .venv/bin/python -m bench.sendcost                      # 20,000 responses each, 3 rounds
    .venv/bin/python -m bench.sendcost --responses 50000 --rounds 5

What a live follower costs the server per response, apart from reading and pacing: one gRPC
server in this process streams small responses (a few events' worth) to a blocking client in a
thread, as fast as the client reads them, on the server's event loop (uvloop, through
``sessionlog.startup``), and the loop thread's CPU (``time.thread_time``, user +
system) is read around the handler. ``bare`` awaits ``context.write`` in the handler;
``guarded`` writes through ``StreamLimiter``'s write, as every follow stream does (Since,
FollowSessions, Changes), with a notifier so that shutdown could interrupt it. The rounds
alternate the two (bare, guarded, bare, ...) so that a busy machine weighs on both alike; the
medians and the spread are printed. docs/benchmarks.md (issue 33, live tail) has figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import grpc

from sessionlog.service.limits import StreamLimiter
from sessionlog.service.notifier import Notifier
from sessionlog.startup import run_event_loop

PAYLOAD = b"x" * 400
"""About the size of a response carrying a few short events."""
MODES = ("bare", "guarded")


async def _stream(mode: str, responses: int, spent: list[float]) -> None:
    """Stream ``responses`` responses in ``mode``; the loop thread's CPU seconds go to
    ``spent``."""
    limiter = StreamLimiter(notifier=Notifier())

    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> None:
        started = time.thread_time()
        for _ in range(responses):
            if mode == "bare":
                await context.write(PAYLOAD)
            else:
                await limiter._write(context, PAYLOAD)
        spent.append(time.thread_time() - started)

    server = grpc.aio.server()
    method = grpc.unary_stream_rpc_method_handler(handler)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.SendCost", {"Stream": method}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await asyncio.to_thread(_read_all, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


def _read_all(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        for _ in channel.unary_stream("/bench.SendCost/Stream")(b""):
            pass


def measure(responses: int, rounds: int) -> dict[str, list[float]]:
    """Microseconds of loop CPU per response, per mode, one figure per round."""
    found: dict[str, list[float]] = {mode: [] for mode in MODES}
    previous = sys.getswitchinterval()  # the server's, which run_event_loop sets
    try:
        for _ in range(rounds):
            for mode in MODES:
                spent: list[float] = []
                run_event_loop(_stream(mode, responses, spent))  # uvloop, as the server runs
                found[mode].append(spent[0] / responses * 1e6)
    finally:
        sys.setswitchinterval(previous)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=20_000, help="responses per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode, alternated")
    args = parser.parse_args(argv)
    found = measure(args.responses, args.rounds)
    print(f"{args.responses:,} responses of {len(PAYLOAD)} bytes per run, {args.rounds} rounds")
    print("mode     loop µs/response: median  (min-max)")
    for mode, figures in found.items():
        print(
            f"{mode:8} {statistics.median(figures):24.1f}  ({min(figures):.1f}-{max(figures):.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
