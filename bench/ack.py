"""What ``--ack replica`` costs: the same appends with ``--ack local`` and ``--ack replica``
(K=1), side by side in one run.

Each mode gets a pair of its own, started fresh: a primary (``--workers 1``) and one replica of
it (``--replica-of``), both on this machine, so the two rows differ only in when the primary
replies: ``local`` once its own commit is synced (the replica follows behind), ``replica`` once
the replica also reports the change committed and synced on its side (``cluster.sync``). The
cases are case 2 (one event per call, 16 clients) and case 3 (100 events per call, 4 clients)
with the Python load clients; every acknowledged event is then checked as in those cases. The
server CPU column is the primary's; the replica's shows under other cores.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench import cases, procs
from bench.common import Measurement, Settings
from bench.report import Row

CASES = (cases.CONCURRENT, cases.BATCHED)
MODES = ("local", "replica")
KIND = "ack local"
"""The kind of each row: its ceiling column holds the same case with --ack local."""


@contextlib.contextmanager
def primary_and_replica(work: Path, mode: str) -> Iterator[procs.ServerProcess]:
    """A primary with ``--ack mode`` and one replica of it; yields the primary."""
    with procs.sessionlog_server(
        work / f"ack-{mode}-primary", work / f"ack-{mode}-primary.log", ["--ack", mode], workers=1
    ) as primary:
        replica_flags = ["--replica-of", primary.address]
        with procs.sessionlog_server(
            work / f"ack-{mode}-replica", work / f"ack-{mode}-replica.log", replica_flags, workers=1
        ):
            yield primary


SYNC_METRICS = ("sessionlog_sync_wait_seconds_count", "sessionlog_sync_timeouts_total")
"""The primary's counts of writes that waited for their replica, and of those that timed out
(absent, so zero, with --ack local)."""


def sync_counts(server: procs.ServerProcess) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    counts = dict.fromkeys(SYNC_METRICS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in counts:
                counts[sample.name] += sample.value
    return counts


def run_group(settings: Settings, work: Path, progress: Callable[[str], None]) -> list[Row]:
    """Each case under --ack local, then under --ack replica; one row per case."""
    measured: dict[tuple[str, int], Measurement] = {}
    for mode in MODES:
        progress(f"ack {mode}: starting a primary and its replica")
        with primary_and_replica(work, mode) as primary:
            for case in CASES:
                progress(f"case {case.label}, --ack {mode}")
                before = sync_counts(primary)
                result = cases.run_append(settings, primary, case)[1]
                after = sync_counts(primary)
                details = {**result.details, "ack": mode}
                details.update({name: after[name] - before[name] for name in SYNC_METRICS})
                measured[(mode, case.number)] = replace(
                    result, name=f"--ack {mode}", details=details
                )
    return [
        Row(
            f"9 ack replica: {case.label}",
            measured[("replica", case.number)],
            measured[("local", case.number)],
            KIND,
        )
        for case in CASES
    ]
