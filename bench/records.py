"""Case 11, session records: ListSessions over many labelled sessions, filtered and ordered by
update time, against the plain listing by id.

    python -m bench.records [--sessions N] [--page-size N] [--json PATH]

Setup (untimed, reported): one server (``sessionlog serve``, synced commits) in a temp dir,
``--sessions`` sessions created with CreateSession, ``FILL_IN_FLIGHT`` calls in flight, each
with an owner (100 of them) and labels ``bucket`` (10 values) and ``team`` (``core`` on every
fiftieth session). Then every tenth session gets one append, so the update-time order is not
the creation order.

Timed, one client, one call at a time, ``PASSES`` passes each (after one untimed pass): every
page of each listing below, page_size ``--page-size``. sessions/s is the sessions listed over
the pass's wall time; "vs id" divides the plain listing's time per page by the row's. "first
page" is the p50 of the first page alone (what a console showing the newest sessions waits
for). Every pass must list exactly the sessions the filter selects, in its order; anything else
is an error of the row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from bench import procs
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
PREFIX = "c11-"
FILL_IN_FLIGHT = 64
PASSES = 3
CALL_TIMEOUT = 120.0


@dataclass
class Row:
    name: str
    filter: str
    order_by: str
    listed: int
    pages: int
    seconds_per_pass: float
    sessions_per_second: float
    page_ms_p50: float
    first_page_ms: float
    vs_id: float = 1.0
    error: str = ""


def session_id(i: int) -> str:
    return f"{PREFIX}{i:06d}"


def fields_of(i: int) -> dict[str, object]:
    labels = {"bucket": str(i % 10)}
    if i % 50 == 0:
        labels["team"] = "core"
    return {"labels": labels, "owner": f"user{i % 100}"}


async def fill(address: str, count: int) -> float:
    """Create the sessions, then append to every tenth; the seconds it took."""
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        create = channel.unary_unary(f"{SERVICE}/CreateSession")
        append = channel.unary_unary(f"{SERVICE}/Append")
        pending = iter(range(count))

        async def creator() -> None:
            for i in pending:
                request = pb.CreateSessionRequest(session_id=session_id(i), **fields_of(i))  # type: ignore[arg-type]
                await create(request.SerializeToString(), timeout=CALL_TIMEOUT)

        await asyncio.gather(*(creator() for _ in range(FILL_IN_FLIGHT)))
        touched = iter(range(0, count, 10))

        async def toucher() -> None:
            for i in touched:
                request = pb.AppendRequest(session_id=session_id(i))
                request.events.add(type=event_pb2.EVENT_TYPE_USER_MESSAGE).data.update({"x": 1})
                await append(request.SerializeToString(), timeout=CALL_TIMEOUT)

        await asyncio.gather(*(toucher() for _ in range(FILL_IN_FLIGHT)))
    return time.perf_counter() - started


def one_pass(
    call: grpc.UnaryUnaryMultiCallable, page_size: int, filter_text: str, order_by: str
) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    ids: list[str] = []
    token = ""
    while True:
        request = pb.ListSessionsRequest(
            page_size=page_size,
            page_token=token,
            prefix=PREFIX,
            filter=filter_text,
            order_by=order_by,
        )
        started = time.perf_counter()
        reply = pb.ListSessionsResponse.FromString(
            call(request.SerializeToString(), timeout=CALL_TIMEOUT)
        )
        latencies.append((time.perf_counter() - started) * 1000)
        ids += [s.session_id for s in reply.sessions]
        token = reply.next_page_token
        if not token:
            return latencies, ids


def measure(
    address: str,
    name: str,
    page_size: int,
    filter_text: str,
    order_by: str,
    check: Callable[[list[str]], str],
) -> Row:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"{SERVICE}/ListSessions")
        one_pass(call, page_size, filter_text, order_by)
        passes = []
        for _ in range(PASSES):
            started = time.perf_counter()
            latencies, ids = one_pass(call, page_size, filter_text, order_by)
            passes.append((time.perf_counter() - started, latencies, ids))
    seconds = statistics.median(p[0] for p in passes)
    latencies = [ms for p in passes for ms in p[1]]
    firsts = [p[1][0] for p in passes]
    ids = passes[-1][2]
    return Row(
        name=name,
        filter=filter_text,
        order_by=order_by or "session_id",
        listed=len(ids),
        pages=len(passes[-1][1]),
        seconds_per_pass=seconds,
        sessions_per_second=len(ids) / seconds if seconds else 0.0,
        page_ms_p50=statistics.median(latencies),
        first_page_ms=statistics.median(firsts),
        error=check(ids),
    )


def run(count: int, page_size: int) -> tuple[float, list[Row]]:
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        work = Path(tmp)
        with procs.sessionlog_server(work / "data", work / "server.log", workers=1) as server:
            fill_seconds = asyncio.run(fill(server.address, count))
            everyone = [session_id(i) for i in range(count)]
            bucket3 = [session_id(i) for i in range(count) if i % 10 == 3]
            core = [session_id(i) for i in range(0, count, 50)]
            owner7 = [session_id(i) for i in range(count) if i % 100 == 7]

            def exactly(want: list[str]) -> Callable[[list[str]], str]:
                return lambda got: "" if got == want else f"listed {len(got)}, expected {len(want)}"

            def same_set(want: list[str]) -> Callable[[list[str]], str]:
                def check(got: list[str]) -> str:
                    if len(got) != len(set(got)) or set(got) != set(want):
                        return f"listed {len(got)} ({len(set(got))} distinct), expected {len(want)}"
                    return ""

                return check

            asks = [
                ("by id (today's listing)", "", "", exactly(everyone)),
                ('by id, labels.bucket = "3" (10%)', 'labels.bucket = "3"', "", exactly(bucket3)),
                ('by id, labels.team = "core" (2%)', 'labels.team = "core"', "", exactly(core)),
                ('by id, owner = "user7" (1%)', 'owner = "user7"', "", exactly(owner7)),
                ("update_time desc", "", "update_time desc", same_set(everyone)),
                (
                    'by id, labels.bucket != "3" (90%, no index)',
                    'labels.bucket != "3"',
                    "",
                    exactly([x for x in everyone if x not in set(bucket3)]),
                ),
                (
                    'update_time desc, labels.bucket = "3"',
                    'labels.bucket = "3"',
                    "update_time desc",
                    same_set(bucket3),
                ),
            ]
            rows = [measure(server.address, n, page_size, f, o, c) for n, f, o, c in asks]
    base = rows[0].seconds_per_pass / max(1, rows[0].pages)
    for row in rows:
        per_page = row.seconds_per_pass / max(1, row.pages)
        row.vs_id = base / per_page if per_page else 0.0
    return fill_seconds, rows


def render(count: int, page_size: int, fill_seconds: float, rows: list[Row]) -> str:
    lines = [
        f"case 11: ListSessions over {count:,} labelled sessions, page {page_size} "
        f"(fill: {count:,} CreateSession + {count // 10:,} Append in {fill_seconds:.1f} s, "
        f"{count / fill_seconds:,.0f} creates/s)",
        f"{'listing':<42} {'listed':>8} {'pages':>6} {'s/pass':>8} {'sessions/s':>11} "
        f"{'page p50 ms':>12} {'first ms':>9} {'page vs id':>10}",
    ]
    for row in rows:
        lines.append(
            f"{row.name:<42} {row.listed:>8,} {row.pages:>6} {row.seconds_per_pass:>8.3f} "
            f"{row.sessions_per_second:>11,.0f} {row.page_ms_p50:>12.2f} {row.first_page_ms:>9.2f} "
            f"{row.vs_id:>9.2f}x" + (f"  ERROR: {row.error}" if row.error else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.records", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sessions", type=int, default=100_000, help="sessions to create")
    parser.add_argument("--page-size", type=int, default=1000, help="ListSessions page_size")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    fill_seconds, rows = run(args.sessions, args.page_size)
    print(render(args.sessions, args.page_size, fill_seconds, rows))
    if args.json is not None:
        payload = {
            "sessions": args.sessions,
            "page_size": args.page_size,
            "fill_seconds": fill_seconds,
        }
        payload["rows"] = [asdict(row) for row in rows]
        args.json.write_text(json.dumps(payload, indent=2))
    return 1 if any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
