"""One client, one call at a time: the latency of a unary Append beside its floors (issues 32, 33).

    .venv/bin/python -m bench.onecall                    # 4 rounds of 2,000 calls per row
    .venv/bin/python -m bench.onecall --ab /tmp/old      # /tmp/old/server's server beside this one

A blocking grpc client (the way a framework backend calls) sends one call, waits for its reply,
sends the next. Rows: the bare echo server's ``Unary`` (the RPC floor) and ``UnaryViaThread``
(the floor plus one hand-off to a thread and back, what an append's trip to the writer costs
with no work), then GetSession and a one-event Append on ``sessionlog serve --workers 1``
(synced commits, the default), and beside them a bare py-lmdb synced commit of one 300-byte put
in this process (the sync floor). Every row is measured in rounds taken in turn (row 1, row 2,
..., row 1, row 2, ...), so a machine whose load drifts moves every row alike; the table gives
each row's median over all its calls, p99, the spread of the rounds' medians, and the server's
CPU per call (user + system, from /proc).

With ``--ab DIR``, a second sessionlog server runs from the ``server/`` folder of the checkout
``DIR`` (an older commit, unpacked with ``git archive``), and its rows are measured in the same
turns: old, new, old, new, ... That is how docs/benchmarks.md compares a change with its parent.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import lmdb

from bench.cases import next_seq
from bench.common import append_request, process_cpu_seconds
from bench.echo import UNARY, UNARY_VIA_THREAD
from bench.procs import REPO, ServerProcess, echo_server, running
from sessionlog.v1 import session_log_service_pb2 as pb

APPEND = "/sessionlog.v1.SessionLogService/Append"
GET_SESSION = "/sessionlog.v1.SessionLogService/GetSession"
WARMUP_CALLS = 200


@dataclass
class Row:
    """One row: what it calls, and what its rounds measured."""

    name: str
    call: Callable[[], object]
    pid: int | None
    """The server whose CPU is read around each round (None: in this process, not read)."""
    seconds: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)
    cpu: float = 0.0

    def run(self, calls: int) -> None:
        """One round of ``calls`` calls, one at a time."""
        before = process_cpu_seconds(self.pid) if self.pid else None
        taken = []
        for _ in range(calls):
            started = time.perf_counter()
            self.call()
            taken.append(time.perf_counter() - started)
        after = process_cpu_seconds(self.pid) if self.pid else None
        if before is not None and after is not None:
            self.cpu += after - before
        self.seconds.extend(taken)
        self.round_medians.append(statistics.median(taken))

    def line(self) -> str:
        ordered = sorted(self.seconds)
        p50 = statistics.median(ordered) * 1e3
        p99 = ordered[int(len(ordered) * 0.99)] * 1e3
        low, high = min(self.round_medians) * 1e3, max(self.round_medians) * 1e3
        cpu = f"{self.cpu / len(ordered) * 1e6:9.0f}" if self.pid else f"{'-':>9}"
        return f"{self.name:<34} {p50:6.3f} {p99:7.3f}   {low:.3f}-{high:.3f}   {cpu}"


def _sessionlog(
    data: Path, log: Path, source: Path | None
) -> contextlib.AbstractContextManager[ServerProcess]:
    """``sessionlog serve --workers 1`` from this checkout, or from ``source``'s server/."""
    path = [str((source or REPO) / "server")]
    argv = [
        "env",
        f"PYTHONPATH={os.pathsep.join(path)}",
        sys.executable,
        "-m",
        "sessionlog.cli",
        "serve",
        "--data",
        str(data),
        "--listen",
        "127.0.0.1:{port}",
        "--workers",
        "1",
        "--log-level",
        "warning",
    ]
    return running("sessionlog", argv, log)


@contextlib.contextmanager
def _lmdb_commit(folder: Path) -> Iterator[Callable[[], object]]:
    env = lmdb.open(str(folder), map_size=1 << 30, readahead=False)
    counter = iter(range(1 << 62))
    value = b"x" * 300

    def commit() -> None:
        with env.begin(write=True) as txn:
            txn.put(next(counter).to_bytes(8, "big"), value)

    try:
        yield commit
    finally:
        env.close()


def _server_rows(label: str, server: ServerProcess, stack: contextlib.ExitStack) -> list[Row]:
    channel = stack.enter_context(grpc.insecure_channel(server.address))
    append = channel.unary_unary(APPEND)
    get = channel.unary_unary(GET_SESSION)
    request = append_request(f"onecall-{label}", 1)
    append(request, timeout=30)  # the session exists from here on
    get_request = pb.GetSessionRequest(session_id=f"onecall-{label}").SerializeToString()
    return [
        Row(f"GetSession ({label})", lambda: get(get_request, timeout=30), server.pid),
        Row(f"Append 1 event ({label})", lambda: append(request, timeout=30), server.pid),
    ]


def measure(rounds: int, calls: int, old_source: Path | None) -> list[Row]:
    """Start the servers, warm every row up, then run ``rounds`` rounds of every row in turn."""
    with tempfile.TemporaryDirectory(prefix="onecall-") as work, contextlib.ExitStack() as stack:
        root = Path(work)
        echo = stack.enter_context(echo_server(root / "echo.log"))
        channel = stack.enter_context(grpc.insecure_channel(echo.address))
        unary, via_thread = channel.unary_unary(UNARY), channel.unary_unary(UNARY_VIA_THREAD)
        payload = append_request("echo", 1)
        rows = [
            Row("echo Unary", lambda: unary(payload, timeout=30), echo.pid),
            Row("echo UnaryViaThread", lambda: via_thread(payload, timeout=30), echo.pid),
        ]
        variants = [("new", None)] if old_source is None else [("old", old_source), ("new", None)]
        servers = {}
        for label, source in variants:
            (root / label).mkdir()
            servers[label] = stack.enter_context(
                _sessionlog(root / label, root / f"{label}.log", source)
            )
        per_server = [_server_rows(label, server, stack) for label, server in servers.items()]
        for same_call in zip(*per_server, strict=True):  # old, new side by side (and in turn)
            rows.extend(same_call)
        (root / "lmdb").mkdir()
        commit = stack.enter_context(_lmdb_commit(root / "lmdb"))
        rows.append(Row("bare py-lmdb synced commit", commit, None))
        for row in rows:
            for _ in range(WARMUP_CALLS):
                row.call()
        for _ in range(rounds):
            for row in rows:
                row.run(calls)
        for label, server in servers.items():
            _check_stored(server, f"onecall-{label}", 1 + WARMUP_CALLS + rounds * calls)
        return rows


def _check_stored(server: ServerProcess, session_id: str, appended: int) -> None:
    """Every acknowledged append is in the log: a timed row that failed calls would show."""
    with grpc.insecure_channel(server.address) as channel:
        stored = next_seq(channel, session_id)
    if stored != appended:
        raise RuntimeError(f"session {session_id} holds {stored} events, {appended} were appended")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per row, taken in turn")
    parser.add_argument("--calls", type=int, default=2000, help="calls per row and round")
    parser.add_argument("--ab", type=Path, default=None, metavar="DIR", help="an older checkout")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    rows = measure(args.rounds, args.calls, args.ab)
    print(
        f"{args.rounds} rounds x {args.calls} calls per row; load average before "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'row':<34} {'p50 ms':>6} {'p99 ms':>7}   {'round p50s':>11}   {'server CPU µs/call':>9}"
    )
    for row in rows:
        print(row.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
