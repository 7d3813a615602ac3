"""Run every benchmark and its ceiling, print one table, write it as JSON.

    python -m bench [--quick] [--json PATH] [--duration SECONDS] [--client-procs N]
                    [--stream-window N] [--only GROUP,...]

The default run takes a few minutes (hard limit 10 minutes), ``--quick`` about two (at most
2.5). Everything runs on 127.0.0.1 in a temp dir that is removed at the end, and every process
started here is stopped by its PID, on failure too.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType

from bench import (
    ack,
    appendload,
    cases,
    ceilings,
    checksums,
    deletes,
    derive,
    durability,
    etcd,
    frameworks,
    h2load,
    last,
    peer,
    procs,
    sessions,
    shards,
    streams,
    tail,
    workers,
)
from bench.common import Measurement, Settings
from bench.report import Results, Row, machine, render, write_json

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


class BudgetExceeded(Exception):
    """The run went past its time budget."""


GROUPS = (
    "append",
    "since",
    "tail",
    "derive",
    "sessions",
    "redis",
    "etcd",
    "workers",
    "checksums",
    "ack",
    "shards",
    "last",
    "stream",
    "frameworks",
    "durability",
    "deletes",
)
DEFAULT_GROUPS = tuple(g for g in GROUPS if g not in ("frameworks", "durability", "deletes"))
"""What runs without ``--only``: every group but frameworks (12), which starts Postgres and
fills its sessions through each framework's own API (minutes on its own), so it runs when asked
for (``--only frameworks``); so do durability, which starts a server per --durability mode, and
deletes (14), whose fill takes a minute or more."""
"""Case groups ``--only`` can pick: append = cases 1-3 (with h2load's rows when it is installed),
since = 4, tail = 5, derive = 6, sessions = 7, redis = the peer's rows (its XADD rows need the
append group, its XRANGE row the since group), etcd = the etcd peer beside sessionlog, both
driven by h2load (it runs its own sessionlog rows, reusing case 2's h2load row when the append
group ran), workers = cases 1-3 (h2load) and 5 at ``--workers 1`` and ``--workers N`` with etcd
beside N (reusing the rows the other groups measured), checksums = 8 (the store's append path
with and without change-record checksums, in this process), ack = 9 (cases 2 and 3 on a primary
with one replica, --ack local beside --ack replica), shards = 10 (16 clients through h2load
directly to one static group's primary, through HAProxy to it, and through HAProxy to two
groups, with HAProxy's CPU per call), last = 11 (the last 10 events and messages of a
1,000,000-event session beside Since from 0 and a full DeriveMessages: see ``bench.last``),
frameworks = 12 (the framework backends' calls per call beside SQLite, Redis and Postgres: see
``bench.frameworks``), stream = 13 (AppendStream and unary Append through the compiled appendload
at --workers 1 and 2, beside etcd's Put and Txn: see ``bench.streams``), durability = cases 1
and 2 through h2load on a server per --durability mode, each beside sync (``bench.durability``),
deletes = 14 (appends to other sessions while long sessions are deleted one after another, in
chunks beside in one transaction: see ``bench.deletes``; its fill takes a minute or more at full
size, so it runs when asked for)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, about two minutes")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    parser.add_argument(
        "--duration", type=float, help="measured seconds per timed case (0.5 to 30)"
    )
    parser.add_argument("--client-procs", type=int, help="processes for the concurrent load")
    parser.add_argument(
        "--stream-window", type=int, help="appends in flight per AppendStream stream (case 13)"
    )
    parser.add_argument("--tmp-dir", type=Path, help="parent of the temp dir (data, logs, LMDB)")
    parser.add_argument(
        "--only",
        type=lambda text: [g.strip() for g in text.split(",") if g.strip()],
        default=list(DEFAULT_GROUPS),
        help=f"comma-separated case groups to run, of: {', '.join(GROUPS)} "
        "(default: all but frameworks)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - set(GROUPS))
    if unknown:
        parser.error(f"unknown case group(s): {', '.join(unknown)}; pick from {', '.join(GROUPS)}")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings.quick() if args.quick else Settings.default()
    if args.duration is not None:
        settings = replace(settings, duration=min(max(args.duration, 0.5), 30.0))
        settings = replace(settings, workers_duration=settings.duration)
    if args.client_procs is not None:
        settings = replace(settings, client_processes=min(max(args.client_procs, 1), 16))
    if args.stream_window is not None:
        settings = replace(settings, stream_window=min(max(args.stream_window, 1), 1024))
    if "deletes" in args.only:
        extra = deletes.budget_seconds(settings.delete_events)
        settings = replace(settings, budget_seconds=settings.budget_seconds + extra)
    return settings


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measured(label: str, measurement: Measurement) -> Measurement:
    extra = f", {measurement.errors} errors" if measurement.errors else ""
    progress(
        f"  {label}: {measurement.events_per_second:,.0f} ev/s "
        f"(client {measurement.client_cores:.2f} cores{extra})"
    )
    return measurement


def run_all(settings: Settings, work: Path, groups: list[str]) -> Results:
    """Start the servers, run each chosen case next to its ceilings, stop the servers."""
    results = Results(rows=[], tails=[], derives=[], notes=[])
    redis_missing = peer.unavailable() if "redis" in groups else "not asked for"
    if "redis" in groups and redis_missing:
        results.notes.append(f"Redis rows skipped: {redis_missing}.")
    h2load_missing = h2load.unavailable() if {"append", "workers"} & set(groups) else "n/a"
    if "append" in groups:
        results.notes.append(h2load_note(h2load_missing))
    if "workers" in groups and h2load_missing:
        results.notes.append(f"--workers rows skipped: {h2load_missing}.")
    etcd_missing = etcd.unavailable() if "etcd" in groups else "not asked for"
    if "etcd" in groups and etcd_missing:
        results.notes.append(f"etcd rows skipped: {etcd_missing}.")
    stream_missing = appendload.unavailable() if "stream" in groups else "not asked for"
    if "stream" in groups and stream_missing:
        results.notes.append(f"case 13 (AppendStream) skipped: {stream_missing}.")
    one_worker: dict[int, Measurement] = {}
    """The main server's h2load append rows, by case number (the workers group reuses them)."""
    with ExitStack() as stack:
        progress("starting sessionlog (--workers 1) and echo servers")
        server = stack.enter_context(
            procs.sessionlog_server(work / "data", work / "server.log", workers=1)
        )
        echo = stack.enter_context(procs.echo_server(work / "echo.log"))
        redis = None
        if not redis_missing:
            progress("starting redis-server (appendfsync always)")
            redis = stack.enter_context(peer.redis_server(work / "redis"))
        rows = results.rows
        if "append" in groups:
            for case in (cases.SEQUENTIAL, cases.CONCURRENT, cases.BATCHED):
                progress(f"case {case.label}")
                load, result = cases.run_append(settings, server, case)
                measured("sessionlog", result)
                echo_result = measured("echo", ceilings.echo_unary(load, echo))
                if case is cases.BATCHED:
                    lmdb = measured("lmdb", ceilings.lmdb_commits(settings, work, 100))
                    rows.append(Row(case.label, result, lmdb, "lmdb"))
                rows.append(Row(case.label, result, echo_result, "echo"))
                if case is cases.SEQUENTIAL:
                    lmdb = measured("lmdb", ceilings.lmdb_commits(settings, work, 1))
                    rows.append(Row(case.label, result, lmdb, "lmdb"))
                    derived = ceilings.in_series(echo_result, lmdb)
                    rows.append(Row(case.label, result, derived, "derived"))
                if redis is not None and case is not cases.CONCURRENT:
                    peer_result = measured(
                        "redis", peer.xadd(settings, redis, case.clients, case.events_per_call)
                    )
                    rows.append(Row(case.label, result, peer_result, "redis"))
                if not h2load_missing and case is not cases.BATCHED:
                    progress(f"case {case.label} (h2load)")
                    h2, h2_result = cases.run_append_h2load(settings, server, case, work)
                    measured("sessionlog", h2_result)
                    one_worker[case.number] = h2_result
                    h2_echo = measured("echo", ceilings.echo_unary_h2load(h2, echo, work))
                    rows.append(Row(h2_result.name, h2_result, h2_echo, "echo"))
                    if case is cases.CONCURRENT:
                        via = ceilings.echo_unary_h2load(h2, echo, work, via_thread=True)
                        rows.append(
                            Row(h2_result.name, h2_result, measured("echo", via), "handoff")
                        )
                    if case is cases.SEQUENTIAL:
                        derived = ceilings.in_series(h2_echo, lmdb)
                        rows.append(Row(h2_result.name, h2_result, derived, "derived"))

        if "since" in groups:
            progress(f"case 4 since catch-up ({settings.since_events:,} events)")
            result = measured("sessionlog", cases.since_catch_up(settings, server))
            echo_stream = measured("echo", ceilings.echo_stream(settings, echo))
            rows.append(Row(result.name, result, echo_stream, "echo"))
            if redis is not None:
                peer_result = measured("redis", peer.xrange_catch_up(settings, redis))
                rows.append(Row(result.name, result, peer_result, "redis"))

        if not etcd_missing:
            results.etcd.extend(etcd_rows(settings, server, work, one_worker))

        if "tail" in groups:
            for followers in settings.tail_followers:
                progress(f"case 5 live tail, {followers} follower(s)")
                tail_result = tail.run_tail(settings, server, followers)
                progress(
                    f"  p50/p99 {tail_result.p50_ms or 0:.2f}/{tail_result.p99_ms or 0:.2f} ms "
                    f"(client {tail_result.client_cores:.2f} cores)"
                )
                results.tails.append(tail_result)

        if "workers" in groups and not h2load_missing:
            peers = workers.etcd_writes(results.etcd)
            results.workers.extend(
                workers.run_group(
                    settings, work, server, one_worker, results.tails, peers, progress
                )
            )

        if not stream_missing:
            peers = workers.etcd_writes(results.etcd)
            results.streams.extend(streams.run_group(settings, work, server, peers, progress))
            for stream_row in results.streams:
                for m in (stream_row.one, stream_row.many):
                    measured(m.name, m)

        if "sessions" in groups:
            count = settings.sessions_count
            progress(f"case 7 sessions: filling {count:,} x {settings.sessions_events} events")
            found = sessions.run_sessions(settings, server, count)
            for listing in found.listings:
                progress(
                    f"  {listing.name}: {listing.events_per_second:,.0f} sessions/s "
                    f"(page p50/p99 {listing.p50_ms or 0:.2f}/{listing.p99_ms or 0:.2f} ms)"
                )
            results.sessions = found
        if "frameworks" in groups:
            progress("case 12 framework backends beside SQLite, Redis and Postgres")
            results.frameworks.extend(frameworks.run_group(settings, server, work, progress))
        progress("stopping servers")
    if "derive" in groups:
        progress("case 6 derive messages (filling sessions, then restarting a server)")
        results.derives.extend(derive.run_derive(settings, work))
    if "last" in groups:
        progress(f"case 11 reads from the end (filling {settings.last_events:,} events)")
        results.last.extend(last.run_last(settings, work))
        for m in results.last:
            progress(f"  {m.name}: warm {m.details['warm_ms']:.2f} ms")
    if "checksums" in groups:
        progress("case 8 change-record checksums, with and without (in this process)")
        for row in checksums.run_checksums(settings, work):
            measured(row.case, row.sessionlog)
            measured("without", row.ceiling)
            results.rows.append(row)
    if "deletes" in groups:
        progress(
            f"case 14 appends during deletes (filling {settings.delete_sessions} sessions, "
            f"{settings.delete_events:,} events in all)"
        )
        for row in deletes.run_deletes(settings, work):
            for m in (row.sessionlog, row.ceiling):
                measured(m.name, m)
                results.notes.append(deletes.note(m))
            results.rows.append(row)
    if "ack" in groups:
        progress("case 9 --ack local beside --ack replica (a primary and one replica each)")
        for row in ack.run_group(settings, work, progress):
            measured(row.sessionlog.name, row.sessionlog)
            measured(row.ceiling.name, row.ceiling)
            results.rows.append(row)
    if "durability" in groups:
        durability_missing = durability.unavailable()
        if durability_missing:
            results.notes.append(f"durability rows skipped: {durability_missing}.")
        else:
            progress("durability modes: cases 1 and 2 (h2load) on a server per mode")
            results.rows.extend(durability.run_group(settings, work, progress))
    if "shards" in groups:
        shards_missing = shards.unavailable()
        if shards_missing:
            results.notes.append(f"case 10 (shards) skipped: {shards_missing}.")
        else:
            progress(f"case 10 shards: {shards.version() or 'haproxy'} in front of static groups")
            results.shards.extend(shards.run_group(settings, work, progress))
    return results


def etcd_rows(
    settings: Settings,
    server: procs.ServerProcess,
    work: Path,
    one_worker: dict[int, Measurement],
) -> list[Row]:
    """Start etcd; each sessionlog row through h2load, then the etcd row beside it; stop etcd.

    ``one_worker``: the h2load append rows measured already, by case number (case 2's when
    the append group ran); the ones measured here are added to it."""
    rows = []
    progress(f"starting etcd ({etcd.version() or 'etcd'}, default durability)")
    with etcd.etcd_server(work / "etcd") as peer_etcd:
        progress("etcd Put, 16 clients, beside case 2 (h2load)")
        concurrent = one_worker.get(cases.CONCURRENT.number)
        if concurrent is None:
            _, concurrent = cases.run_append_h2load(settings, server, cases.CONCURRENT, work)
            measured("sessionlog", concurrent)
            one_worker[cases.CONCURRENT.number] = concurrent
        put = measured("etcd", etcd.run_writes(settings, peer_etcd, etcd.PUTS, work))
        rows.append(Row(concurrent.name, concurrent, put, "etcd"))

        progress("etcd Txn of 100 Puts, 4 clients, beside case 3 (h2load)")
        _, batched = cases.run_append_h2load(settings, server, cases.BATCHED, work)
        measured("sessionlog", batched)
        one_worker[cases.BATCHED.number] = batched
        txn = measured("etcd", etcd.run_writes(settings, peer_etcd, etcd.TXNS, work))
        rows.append(Row(batched.name, batched, txn, "etcd"))

        progress(f"etcd Range page beside Since page, {etcd.PAGE_CLIENTS} clients (h2load)")
        page = measured(
            "sessionlog", cases.run_since_page_h2load(settings, server, etcd.PAGE_CLIENTS, work)
        )
        ranged = measured(
            "etcd",
            etcd.run_range_pages(
                settings, peer_etcd, etcd.PAGE_CLIENTS, settings.page_log_events, work
            ),
        )
        rows.append(Row(page.name, page, ranged, "etcd"))
    return rows


def h2load_note(missing: str) -> str:
    """What the (h2load) rows are, or why there are none."""
    if missing:
        return f"h2load rows skipped: {missing}; the 16-client target uses the Python client's row."
    return (
        f"(h2load) rows: {h2load.version() or 'h2load'}, the compiled load client, one process "
        "per client (-c1 -m1, each to its own session); its cpu cli is the h2load processes' "
        "CPU. Checked: every call HTTP 200, none failed, and each session grew by the calls "
        "h2load counted (one more in flight at its stop allowed); the 16-client target uses "
        "its row."
    )


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise BudgetExceeded in the main thread once ``seconds`` have passed; SIGTERM interrupts."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise BudgetExceeded(f"the run exceeded its {seconds:.0f} s budget")

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, expired), signal.signal(signal.SIGTERM, terminated)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    mode = "quick" if args.quick else "default"
    started = time.perf_counter()
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="sessionlog-bench-", dir=args.tmp_dir))
    try:
        with time_budget(settings.budget_seconds):
            results = run_all(settings, work, args.only)
    except (BudgetExceeded, procs.ServerFailed, RuntimeError) as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(results, settings, mode, info))
    write_json(args.json, results, settings, mode, info)
    progress(f"done in {time.perf_counter() - started:.0f} s; wrote {args.json}")
    return 1 if any(m.errors for m in results.measurements()) else 0


if __name__ == "__main__":
    sys.exit(main())
