"""What bounding list pages by bytes costs: ListSessions and paged DeriveMessages on two servers,
the code before the change (a tree given by ``--old``) and this checkout, timed in turns.

    git archive COMMIT server | tar -x -C /tmp/old
    python -m bench.pagebytes --old /tmp/old [--sessions N] [--pairs N] [--json PATH]

Setup (untimed): two servers (``sessionlog serve``, one process each, synced commits), one on
the old tree (``PYTHONPATH=OLD/server``), one on this checkout, each over its own temp folder
filled alike: ``--sessions`` sessions, each with one event carrying a 200-byte state and a
usage, and one session of ``MESSAGES`` messages. Every reply fits the 4 MiB default limit on
both sides, so both answer the same pages: the difference is the byte accounting alone.

Timed, one client, one call at a time, ``--pairs`` rounds of old then new (the order alternates
every round): per round and side, the median wall time of ``PASSES`` passes over every page of
each read (ListSessions with page_size 1000, basic and full view; DeriveMessages paged by 1000
over the long session). Reported: per read and side the median over the rounds and the
spread (lowest and highest round), and new / old of the medians. Every pass must list exactly
what was written; anything else stops the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from bench import procs
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
PREFIX = "pb-"
LONG = "long-session"
MESSAGES = 5000
PASSES = 3
CALL_TIMEOUT = 120.0

Read = Callable[[grpc.Channel], int]
"""One pass of a read over a server: how many items it listed."""


def fill(address: str, count: int) -> None:
    with grpc.insecure_channel(address) as channel:
        append = channel.unary_unary(f"{SERVICE}/Append")
        for i in range(count):
            event = event_pb2.Event(type=event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE)
            event.data.update({"content": "ok"})
            event.state_delta.update({"note": "s" * 200, "i": i})
            event.usage.model = "m"
            event.usage.input_tokens = 100 + i
            event.usage.output_tokens = 10
            request = pb.AppendRequest(session_id=f"{PREFIX}{i:06d}", events=[event])
            append(request.SerializeToString(), timeout=CALL_TIMEOUT)
        for start in range(0, MESSAGES, 500):
            events = [event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE) for _ in range(500)]
            for n, event in enumerate(events):
                event.data.update({"content": f"message {start + n}"})
            request = pb.AppendRequest(session_id=LONG, events=events)
            append(request.SerializeToString(), timeout=CALL_TIMEOUT)


def listing(view: int) -> Read:
    def read(channel: grpc.Channel) -> int:
        call = channel.unary_unary(f"{SERVICE}/ListSessions")
        token, listed = "", 0
        while True:
            request = pb.ListSessionsRequest(
                page_size=1000,
                page_token=token,
                prefix=PREFIX,
                view=view,  # type: ignore[arg-type]
            )
            reply = pb.ListSessionsResponse.FromString(
                call(request.SerializeToString(), timeout=CALL_TIMEOUT)
            )
            listed += len(reply.sessions)
            token = reply.next_page_token
            if not token:
                return listed

    return read


def derive_pages(channel: grpc.Channel) -> int:
    call = channel.unary_unary(f"{SERVICE}/DeriveMessages")
    token, listed = "", 0
    while True:
        request = pb.DeriveMessagesRequest(session_id=LONG, page_size=1000, page_token=token)
        reply = pb.DeriveMessagesResponse.FromString(
            call(request.SerializeToString(), timeout=CALL_TIMEOUT)
        )
        listed += len(reply.messages)
        token = reply.next_page_token
        if not token:
            return listed


def timed(channel: grpc.Channel, read: Read, expected: int) -> float:
    """The median seconds of ``PASSES`` passes (after one untimed pass)."""
    read(channel)
    seconds = []
    for _ in range(PASSES):
        started = time.perf_counter()
        listed = read(channel)
        seconds.append(time.perf_counter() - started)
        if listed != expected:
            raise SystemExit(f"a pass listed {listed} items, not {expected}")
    return statistics.median(seconds)


@contextlib.contextmanager
def server(name: str, tree: Path | None, work: Path) -> Iterator[procs.ServerProcess]:
    """A server on ``tree``'s code (None: this checkout), over a folder of its own."""
    argv = [
        str(procs.VENV_BIN / "sessionlog"),
        "serve",
        "--data",
        str(work / name),
        "--listen",
        "127.0.0.1:{port}",
        "--workers",
        "1",
        "--log-level",
        "warning",
    ]
    if tree is not None:
        argv = ["env", f"PYTHONPATH={tree / 'server'}", *argv]
    with procs.running(name, argv, work / f"{name}.log") as running:
        yield running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="a tree holding the old server/")
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reads: dict[str, tuple[Read, int]] = {
        "ListSessions basic, page 1000": (listing(pb.SESSION_VIEW_BASIC), args.sessions),
        "ListSessions full, page 1000": (listing(pb.SESSION_VIEW_FULL), args.sessions),
        "DeriveMessages paged by 1000": (derive_pages, MESSAGES),
    }
    rounds: dict[str, dict[str, list[float]]] = {r: {"old": [], "new": []} for r in reads}
    with tempfile.TemporaryDirectory(prefix="bench-pagebytes-") as folder:
        work = Path(folder)
        with server("old", args.old, work) as old, server("new", None, work) as new:
            for running in (old, new):
                fill(running.address, args.sessions)
            channels = {
                "old": grpc.insecure_channel(old.address),
                "new": grpc.insecure_channel(new.address),
            }
            try:
                for pair in range(args.pairs):
                    order = ("old", "new") if pair % 2 == 0 else ("new", "old")
                    for side in order:
                        for name, (read, expected) in reads.items():
                            rounds[name][side].append(timed(channels[side], read, expected))
            finally:
                for channel in channels.values():
                    channel.close()
    report = {}
    print(f"{args.pairs} pairs, {args.sessions:,} sessions; ms per pass: median [lowest-highest]")
    for name, sides in rounds.items():
        medians = {side: statistics.median(s) * 1000 for side, s in sides.items()}
        spread = {side: (min(s) * 1000, max(s) * 1000) for side, s in sides.items()}
        ratio = medians["new"] / medians["old"]
        report[name] = {"median_ms": medians, "spread_ms": spread, "new_over_old": ratio}
        print(
            f"{name:32} old {medians['old']:8.1f} [{spread['old'][0]:.1f}-{spread['old'][1]:.1f}]"
            f"  new {medians['new']:8.1f} [{spread['new'][0]:.1f}-{spread['new'][1]:.1f}]"
            f"  new/old {ratio:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
