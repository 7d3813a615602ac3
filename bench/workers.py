"""``--workers 1`` beside ``--workers N``: every write and tail case at both, and etcd beside N.

The server's default is one worker process per usable CPU (``--workers auto``); the bench's main
server runs ``--workers 1``, so that every other table stays what one process does. This group
starts a second server, ``--workers N`` with N the usable CPUs, on a data folder of its own, and
runs on it the cases where more processes could help:

- Append of one event, sequential and from 16 clients, and of 100 events from 4 clients, all
  through h2load (one process per client, hence one connection per client: the kernel spreads
  connections over the workers, and which worker holds each is read from /proc midway);
- the live tail with 1 and with 100 followers, the writer on worker 0 and the followers on the
  others (``bench.tail``: with one follower, every event crosses workers, woken through the
  doorbells and the change feed; the row says where each client landed).

The ``--workers 1`` figures are the main server's rows of the same cases when their groups ran
(``append``, ``etcd``, ``tail``), so nothing is measured twice; the missing ones are measured
here, on the main server. To fit the default run's budget, the cases measured here run for
``Settings.workers_duration`` (5 s by default, half the other cases' 10 s; the figures are rates
and percentiles of thousands of calls either way). etcd's Put and Txn rows stand beside the
N-worker figures: the etcd group's when it ran, else measured here. The server's CPU is the
whole process tree's (the supervisor and every worker), and each row also reads the writers'
commits and group sizes from the server's /metrics (summed over the workers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench import cases, etcd, procs, tail
from bench.common import Measurement, Settings
from bench.report import Row, WorkersRow


def etcd_writes(rows: list[Row]) -> dict[int, Measurement]:
    """etcd's write rows of the etcd group (Put and Txn, not Range), by puts per call."""
    return {
        row.ceiling.details["puts_per_call"]: row.ceiling
        for row in rows
        if "puts_per_call" in row.ceiling.details
    }


WRITE_CASES = (cases.SEQUENTIAL, cases.CONCURRENT, cases.BATCHED)
PEER_CASES = {cases.CONCURRENT.number: etcd.PUTS, cases.BATCHED.number: etcd.TXNS}
"""The etcd row beside each case's N-worker figure, by case number."""


def run_group(
    settings: Settings,
    work: Path,
    single: procs.ServerProcess,
    one_worker: dict[int, Measurement],
    tails: list[Measurement],
    peers: dict[int, Measurement],
    progress: Callable[[str], None],
    workers: int = 0,
) -> list[WorkersRow]:
    """Every write and tail case at one worker (``single``, the main server) and at ``workers``
    (default: the usable CPUs), with etcd beside the N-worker writes.

    ``one_worker``: the main server's h2load rows already measured, by case number; ``tails``:
    its live-tail rows; ``peers``: etcd's rows already measured (by puts per call). What is
    missing is measured here. Every case measured here runs ``settings.workers_duration``."""
    count = workers or procs.usable_cpus()
    settings = replace(settings, duration=settings.workers_duration or settings.duration)
    one = dict(one_worker)
    for case in WRITE_CASES:
        if case.number not in one:
            progress(f"case {case.label} (h2load, --workers 1)")
            one[case.number] = cases.run_append_h2load(settings, single, case, work)[1]
    one_tail = {m.details["followers"]: m for m in tails}
    for followers in settings.tail_followers:
        if followers not in one_tail:
            progress(f"case 5 live tail, {followers} follower(s), --workers 1")
            one_tail[followers] = tail.run_tail(settings, single, followers)

    many: dict[int, Measurement] = {}
    many_tail: dict[int, Measurement] = {}
    progress(f"starting sessionlog --workers {count}")
    with procs.sessionlog_server(
        work / f"data-workers-{count}", work / "server-workers.log", workers=count
    ) as server:
        for case in WRITE_CASES:
            progress(f"case {case.label} (h2load, --workers {count})")
            many[case.number] = cases.run_append_h2load(settings, server, case, work)[1]
        for followers in settings.tail_followers:
            progress(f"case 5 live tail, {followers} follower(s), --workers {count}")
            many_tail[followers] = tail.run_tail(settings, server, followers)

    peer = dict(peers)
    wanted = [c for c in PEER_CASES.values() if c.puts_per_call not in peer]
    if wanted and not etcd.unavailable():
        progress(f"starting etcd ({etcd.version() or 'etcd'}) for the rows beside --workers N")
        with etcd.etcd_server(work / "etcd-workers") as peer_etcd:
            for write in wanted:
                progress(f"{write.label}")
                peer[write.puts_per_call] = etcd.run_writes(settings, peer_etcd, write, work)

    rows = []
    for case in WRITE_CASES:
        beside = PEER_CASES.get(case.number)
        rows.append(
            WorkersRow(
                case.label,
                one[case.number],
                many[case.number],
                peer.get(beside.puts_per_call) if beside else None,
            )
        )
    for followers in settings.tail_followers:
        plural = "s" if followers > 1 else ""
        rows.append(
            WorkersRow(
                f"5 live tail {tail.RATE:,.0f} ap/s, {followers} follower{plural}",
                one_tail[followers],
                many_tail[followers],
            )
        )
    return rows
