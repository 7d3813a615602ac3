"""What the change records' chained checksums cost: the store's append path with them and
without them, side by side in one run.

In this process, with no gRPC: each row appends through ``Store.append`` (validation, the
writer thread, the commit) to a store of its own, once with checksums (what the server does)
and once with ``record_checksums`` off (records as written before checksums existed). Durable
rows show what a client sees (the fsync dominates); the nosync row shows the CPU cost itself.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Measurement, Settings, system_cpu_seconds
from bench.report import Row
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event, EventType

MAX_CALLS = 200_000
"""Bound on appends per measured window, whatever the duration."""


@dataclass(frozen=True)
class ChecksumCase:
    label: str
    events_per_call: int
    durable: bool


CASES = (
    ChecksumCase("8a checksums: append 1 event, synced", 1, True),
    ChecksumCase("8b checksums: append 100 events, synced", 100, True),
    ChecksumCase("8c checksums: append 1 event, nosync", 1, False),
)


def _events(count: int, call: int) -> list[Event]:
    out = []
    for i in range(count):
        event = Event(type=EventType.EVENT_TYPE_USER_MESSAGE)
        event.data.update({"content": f"call {call} event {i} " + "x" * 200, "n": i})
        out.append(event)
    return out


def _measure(settings: Settings, parent: Path, case: ChecksumCase, checksums: bool) -> Measurement:
    directory = Path(tempfile.mkdtemp(prefix="checksums-", dir=parent))
    config = StoreConfig(
        durability="sync" if case.durable else "nosync",
        record_checksums=checksums,
        map_size=4 << 30,
    )
    store = Store(directory / "data", config)
    try:
        calls = 0
        warm_end = time.perf_counter() + settings.warmup
        while time.perf_counter() < warm_end:
            store.append("warm", _events(case.events_per_call, calls))
            calls += 1
        latencies: list[float] = []
        system = system_cpu_seconds()
        cpu, started = time.process_time(), time.perf_counter()
        end = started + settings.duration
        while time.perf_counter() < end and len(latencies) < MAX_CALLS:
            batch = _events(case.events_per_call, len(latencies))
            before = time.perf_counter_ns()
            store.append("measured", batch)
            latencies.append((time.perf_counter_ns() - before) / 1e6)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        system_after = system_cpu_seconds()
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    measurement = Measurement(
        name="the same without checksums" if not checksums else case.label,
        events=len(latencies) * case.events_per_call,
        calls=len(latencies),
        seconds=seconds,
        client_cpu_seconds=cpu,
        system_cpu_seconds=None
        if system is None or system_after is None
        else system_after - system,
    )
    measurement.set_latencies(latencies)
    measurement.details.update(
        events_per_call=case.events_per_call, durable=case.durable, checksums=checksums
    )
    return measurement


def run_checksums(settings: Settings, parent: Path) -> list[Row]:
    """One row per case: with checksums (the server's way) beside without."""
    rows = []
    for case in CASES:
        with_them = _measure(settings, parent, case, True)
        without = _measure(settings, parent, case, False)
        rows.append(Row(case.label, with_them, without, "unchecked"))
    return rows
