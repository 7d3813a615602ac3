"""Case 14: appends to other sessions while a long session is deleted, the delete in one write
transaction beside the tombstone and its chunks (``storage.purge``), in one run.

In this process, with no gRPC: a store is filled with one long session (``delete_events``
events) and copied, so both deletes start from the same bytes. On each copy a thread appends one
event at a time (synced, as the server does) to other sessions while the main thread deletes
the long session: at once (``PURGE_FROM`` above its length: what every delete did before issue
35), or by tombstone and then every chunk to the end. The row is the appends made from the
delete's start to its end (the last chunk's, for the chunked one): their p50 and p99, and the
longest append, which is how long the writer was held. Beside them, in the same run, the
appends of the ``quiet_s`` seconds before the delete and of as long after its end: the figures
without a delete that the ones during it are read against (the two tell the noise).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Measurement, Settings, percentile
from bench.report import Row
from sessionlog.defaults import NOSYNC
from sessionlog.storage import purge
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event, EventType

FILL_BATCH = 2_000
"""Events per append while filling the long session (untimed)."""
CASE = "14 appends to others during a delete (chunked)"
ONE_STEP = "the same during a one-transaction delete"


def _event(text: str) -> Event:
    event = Event(type=EventType.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": text + " " + "x" * 200})
    return event


def _fill(path: Path, events: int) -> None:
    config = StoreConfig(durability=NOSYNC, map_size=8 << 30)
    store = Store(path, config)
    try:
        for start in range(0, events, FILL_BATCH):
            count = min(FILL_BATCH, events - start)
            store.append("long", [_event(f"long {start + n}") for n in range(count)])
        for n in range(20):
            store.append(f"other-{n}", [_event("first")])
    finally:
        store.close()


def _measure(path: Path, label: str, chunked: bool, events: int, quiet_s: float) -> Measurement:
    """Appends to others around one delete of "long"; those before it (``quiet_s`` seconds of
    them) are the figures without a delete, for comparison."""
    store = Store(path, StoreConfig(map_size=8 << 30))
    spans: list[tuple[int, int]] = []
    stop = threading.Event()

    def appender() -> None:
        n = 0
        while not stop.is_set():
            before = time.perf_counter_ns()
            store.append(f"other-{n % 20}", [_event(f"during {n}")])
            spans.append((before, time.perf_counter_ns()))
            n += 1

    saved = purge.PURGE_FROM
    purge.PURGE_FROM = min(saved, events) if chunked else events + 1
    thread = threading.Thread(target=appender, name="appender")
    try:
        for n in range(200):  # warm: the appender's path and the fold cache
            store.append(f"other-{n % 20}", [_event("warm")])
        thread.start()
        time.sleep(quiet_s)
        started = time.perf_counter_ns()
        store.delete("long")
        tombstone = time.perf_counter_ns() - started
        chunks = store.purge_all()
        ended = time.perf_counter_ns()
        time.sleep(quiet_s)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        purge.PURGE_FROM = saved
        store.close()
    quiet = [(e - b) / 1e6 for b, e in spans if e < started]
    during = [(e - b) / 1e6 for b, e in spans if e >= started and b <= ended]
    after = [(e - b) / 1e6 for b, e in spans if b > ended]
    seconds = (ended - started) / 1e9
    measurement = Measurement(
        name=label, events=len(during), calls=len(during), seconds=seconds, client_cpu_seconds=0.0
    )
    measurement.set_latencies(during)
    quiet.sort()
    after.sort()
    measurement.details.update(
        long_events=events,
        delete_call_ms=round(tombstone / 1e6, 1),
        whole_delete_s=round(seconds, 2),
        chunks=chunks,
        quiet_p50_ms=percentile(quiet, 0.5),
        quiet_p99_ms=percentile(quiet, 0.99),
        quiet_max_ms=quiet[-1] if quiet else None,
        after_p50_ms=percentile(after, 0.5),
        after_p99_ms=percentile(after, 0.99),
        after_max_ms=after[-1] if after else None,
    )
    return measurement


def run_deletes(settings: Settings, work: Path) -> list[Row]:
    """One row: appends during the chunked delete beside those during a one-step delete."""
    filled = work / "deletes-filled"
    _fill(filled, settings.delete_events)
    rows = []
    try:
        copies = {}
        for name in ("one-step", "chunked"):
            copies[name] = work / f"deletes-{name}"
            shutil.copytree(filled, copies[name])
        events, quiet = settings.delete_events, settings.duration
        one = _measure(copies["one-step"], ONE_STEP, False, events, quiet)
        chunked = _measure(copies["chunked"], CASE, True, events, quiet)
        rows.append(Row(CASE, chunked, one, "one-step"))
    finally:
        for path in [filled, *(work / f"deletes-{n}" for n in ("one-step", "chunked"))]:
            shutil.rmtree(path, ignore_errors=True)
    return rows


def note(measurement: Measurement) -> str:
    """The figures of a case 14 row that the table has no column for."""
    d = measurement.details
    during = {"during_p50_ms": measurement.p50_ms, "during_p99_ms": measurement.p99_ms}
    during["during_max_ms"] = d.get("max_ms")
    return (
        f"case 14, {measurement.name}: {d['long_events']:,} events deleted; the delete call "
        f"{d['delete_call_ms']} ms, freed after {d['whole_delete_s']} s ({d['chunks']} chunks); "
        f"appends to others p50/p99/max: before {_figures(d, 'quiet')}, during "
        f"{_figures(during, 'during')}, "
        f"after {_figures(d, 'after')} ms"
    )


def _figures(details: dict[str, Any], when: str) -> str:
    """p50/p99/max of one span's appends, in ms ("-" where it had none)."""
    values = [details.get(f"{when}_{name}_ms") for name in ("p50", "p99", "max")]
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)
