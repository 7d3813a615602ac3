"""Case 14: appends to other sessions while a long session is deleted, the delete in one write
transaction beside the tombstone and its chunks (``storage.purge``), in one run.

In this process, with no gRPC: a store is filled with one long session (``delete_events``
events) and copied, so both deletes start from the same bytes. On each copy a thread appends one
event at a time (synced, as the server does) to other sessions while the main thread deletes
the long session: at once (``PURGE_FROM`` above its length: what every delete did before issue
35), or by tombstone and then every chunk to the end. The row is the appends made from the
delete's start to its end (the last chunk's, for the chunked one): their p50 and p99, and the
longest append, which is how long the writer was held. Beside them, in the same run, the
appends of the ``quiet_s`` seconds before the delete and after its end: the figures without a
delete that the ones during it are read against.

The noise is measured, not assumed: the quiet time is cut into spans as long as the delete was
(the ``quiet_s`` before it, as many such spans as fit; after its end, ``NOISE_SPANS`` of them,
however long that takes), and the p99 of each span is taken. "Unchanged within noise" is
*met* when the p99 during the delete is no higher than the highest of those quiet p99s (it lies
within their spread, or below it), *not met* otherwise. With N quiet spans as alike as the
delete's, a span of no delete at all exceeds them all one time in N + 1: the verdict is a
check, not a proof, and a few runs tell more than one.
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
NOISE_SPANS = 4
"""Quiet spans after the delete, each as long as it (the noise its p99 is read against)."""
MIN_SPAN_S = 0.2
"""No span is shorter than this (a one-transaction delete takes a fraction of a second)."""


def budget_seconds(events: int) -> float:
    """What case 14 adds to the run's time budget: its paced purge under continuous appends
    takes about 0.1 ms an event, and the quiet spans after it NOISE_SPANS times as long."""
    return events / 1_000


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
    """Appends to others around one delete of "long"; those of the quiet spans before and after
    it are the figures without a delete, for comparison (see the module doc)."""
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
        span_ns = max(ended - started, int(MIN_SPAN_S * 1e9))
        time.sleep(max(quiet_s, NOISE_SPANS * span_ns / 1e9))
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        purge.PURGE_FROM = saved
        store.close()
    first = spans[0][0] if spans else started
    quiet = _latencies(spans, first, started)
    during = [(e - b) / 1e6 for b, e in spans if e >= started and b <= ended]
    after = _latencies(spans, ended + 1, ended + int(quiet_s * 1e9))
    noise = [_p99(spans, start, start + span_ns) for start in _span_starts(first, started, span_ns)]
    noise += [
        _p99(spans, ended + 1 + k * span_ns, ended + 1 + (k + 1) * span_ns)
        for k in range(NOISE_SPANS)
    ]
    noise_p99s = sorted(p for p in noise if p is not None)
    seconds = (ended - started) / 1e9
    measurement = Measurement(
        name=label, events=len(during), calls=len(during), seconds=seconds, client_cpu_seconds=0.0
    )
    measurement.set_latencies(during)
    during_p99 = percentile(sorted(during), 0.99)
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
        span_s=round(span_ns / 1e9, 2),
        noise_p99s_ms=[round(p, 2) for p in noise_p99s],
        met=bool(noise_p99s) and during_p99 is not None and during_p99 <= noise_p99s[-1],
    )
    return measurement


def _latencies(spans: list[tuple[int, int]], start: int, stop: int) -> list[float]:
    """The sorted times (ms) of the appends that began in [start, stop) and ended before
    ``stop``."""
    return sorted((e - b) / 1e6 for b, e in spans if start <= b and e < stop)


def _p99(spans: list[tuple[int, int]], start: int, stop: int) -> float | None:
    return percentile(_latencies(spans, start, stop), 0.99)


def _span_starts(first: int, stop: int, span_ns: int) -> list[int]:
    """The starts of the whole spans of ``span_ns`` that end at ``stop`` and begin at or after
    ``first``, latest last (the quiet time before the delete, cut into spans)."""
    count = (stop - first) // span_ns
    return [stop - (count - k) * span_ns for k in range(count)]


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
    p99s = d["noise_p99s_ms"]
    spread = f"{p99s[0]:.2f}-{p99s[-1]:.2f}" if p99s else "-"
    during_p99 = "-" if measurement.p99_ms is None else f"{measurement.p99_ms:.2f}"
    verdict = "met" if d["met"] else "not met"
    return (
        f"case 14, {measurement.name}: {d['long_events']:,} events deleted; the delete call "
        f"{d['delete_call_ms']} ms, freed after {d['whole_delete_s']} s ({d['chunks']} chunks); "
        f"appends to others p50/p99/max: before {_figures(d, 'quiet')}, during "
        f"{_figures(during, 'during')}, "
        f"after {_figures(d, 'after')} ms; noise: the p99s of {len(p99s)} quiet spans of "
        f"{d['span_s']} s {spread} ms, during {during_p99} ms: p99 unchanged within noise "
        f"{verdict}"
    )


def _figures(details: dict[str, Any], when: str) -> str:
    """p50/p99/max of one span's appends, in ms ("-" where it had none)."""
    values = [details.get(f"{when}_{name}_ms") for name in ("p50", "p99", "max")]
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)
