"""Case 14: appends to other sessions while long sessions are deleted, the deletes in one write
transaction beside the tombstone and its chunks (``storage.purge``), in one run.

In this process, with no gRPC: a store is filled with ``delete_sessions`` long sessions of
``delete_events`` events in all and copied, so both kinds of delete start from the same bytes. On
each copy a thread appends one event at a time (synced, as the server does) to other sessions
while the main thread deletes the long sessions one after another: at once (``PURGE_FROM``
above their length: what every delete did before issue 35), or by tombstone and then every
chunk to the end. After each delete it waits as long as the delete took, so the run is a row of
spans of equal length in time order: quiet, delete, quiet, delete, ..., quiet. The row is the
appends made during the deletes (from a delete's start to its end, the last chunk's for the
chunked one): their p50 and p99, and the longest append, which is how long the writer was held;
beside them, the appends of the ``quiet_s`` seconds before the first delete and those of the
quiet spans after each.

The noise is measured, not assumed: each delete span's p99 is read against the p99s of the
quiet spans, each as long as a delete (the ``quiet_s`` before the first delete is cut into spans
as long as the deletes' mean). Interleaving them in time puts a drift of the machine's load on
both sides alike. The verdict is a rank test (Mann-Whitney's, one-sided): U counts the
(delete, quiet) pairs of spans in which the delete's p99 is the higher (a tie half), and p is
the share of all ways of labelling the same p99s "delete" or "quiet" whose U is at least as
high (every way when there are at most ``EXACT_LABELLINGS``, else ``SAMPLED_LABELLINGS`` drawn
with a fixed seed). "Unchanged within noise" is *met* when p >= ``LEVEL``: the deletes' p99s do
not stand above the quiet ones more than chance puts them; *not met* otherwise (the deletes
raise the p99, at that level). With no effect at all, it misses one time in twenty. The note
gives U as a share of the pairs (about 0.5 when the deletes change nothing, 1.0 when every
delete span is worse than every quiet one) and p. It cannot tell "unchanged" from "too noisy to
see": on a busy machine the quiet spans' p99s spread over milliseconds, and only a delete that
stands out of that spread is seen.
"""

from __future__ import annotations

import itertools
import math
import random
import shutil
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import Measurement, Settings, percentile
from bench.report import Row
from sessionlog.defaults import NOSYNC
from sessionlog.storage import purge
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event, EventType

FILL_BATCH = 2_000
"""Events per append while filling the long sessions (untimed)."""
CASE = "14 appends to others during deletes (chunked)"
ONE_STEP = "the same during one-transaction deletes"
MIN_SPAN_S = 0.2
"""No span is shorter than this (a one-transaction delete takes a fraction of a second)."""
LEVEL = 0.05
"""The rank test's level: "not met" when chance alone would put the deletes' p99s this high
less often than this."""
EXACT_LABELLINGS = 200_000
"""Up to this many ways of labelling the spans, the rank test counts them all."""
SAMPLED_LABELLINGS = 20_000
"""Beyond ``EXACT_LABELLINGS``, the rank test draws this many (seeded: a run's verdict is
reproducible from its figures)."""


def budget_seconds(events: int) -> float:
    """What case 14 adds to the run's time budget for ``events`` deleted in all: its paced
    purge under continuous appends takes about 0.1-0.2 ms an event, and the quiet spans after
    the deletes as long again."""
    return events / 2_000


def long_id(k: int) -> str:
    """The id of the k-th long session."""
    return f"long-{k}"


def _event(text: str) -> Event:
    event = Event(type=EventType.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": text + " " + "x" * 200})
    return event


def _fill(path: Path, events: int, sessions: int) -> None:
    """``sessions`` long sessions of ``events`` events each, and the 20 others."""
    config = StoreConfig(durability=NOSYNC, map_size=8 << 30)
    store = Store(path, config)
    try:
        for k in range(sessions):
            for start in range(0, events, FILL_BATCH):
                count = min(FILL_BATCH, events - start)
                store.append(long_id(k), [_event(f"long {start + n}") for n in range(count)])
        for n in range(20):
            store.append(f"other-{n}", [_event("first")])
    finally:
        store.close()


def _measure(
    path: Path, label: str, chunked: bool, events: int, sessions: int, quiet_s: float
) -> Measurement:
    """Appends to others around the deletes of the long sessions, each delete followed by a
    quiet span as long as it (see the module doc)."""
    store = Store(path, StoreConfig(map_size=8 << 30))
    appends: list[tuple[int, int]] = []
    stop = threading.Event()

    def appender() -> None:
        n = 0
        while not stop.is_set():
            before = time.perf_counter_ns()
            store.append(f"other-{n % 20}", [_event(f"during {n}")])
            appends.append((before, time.perf_counter_ns()))
            n += 1

    saved = purge.PURGE_FROM
    purge.PURGE_FROM = min(saved, events) if chunked else events + 1
    thread = threading.Thread(target=appender, name="appender")
    deletes: list[tuple[int, int]] = []  # [start, end] of each delete
    quiets: list[tuple[int, int]] = []  # [start, end) of the quiet span after each
    calls_ns: list[int] = []
    chunks = 0
    try:
        for n in range(200):  # warm: the appender's path and the fold cache
            store.append(f"other-{n % 20}", [_event("warm")])
        thread.start()
        time.sleep(quiet_s)
        for k in range(sessions):
            started = time.perf_counter_ns()
            store.delete(long_id(k))
            calls_ns.append(time.perf_counter_ns() - started)
            chunks += store.purge_all()
            ended = time.perf_counter_ns()
            span_ns = max(ended - started, int(MIN_SPAN_S * 1e9))
            time.sleep(span_ns / 1e9)
            deletes.append((started, ended))
            quiets.append((ended + 1, ended + 1 + span_ns))
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        purge.PURGE_FROM = saved
        store.close()
    first_delete = deletes[0][0]
    span_ns = max(int(statistics.mean(e - s for s, e in deletes)), int(MIN_SPAN_S * 1e9))
    first = appends[0][0] if appends else first_delete
    leading = [(s, s + span_ns) for s in _span_starts(first, first_delete, span_ns)]
    before = _latencies(appends, first, first_delete)
    during = sorted((e - b) / 1e6 for b, e in appends if any(e >= s and b <= t for s, t in deletes))
    after = sorted(lat for s, t in quiets for lat in _latencies(appends, s, t))
    during_p99s = [_p99(appends, s, t + 1, overlapping=True) for s, t in deletes]
    quiet_p99s = [_p99(appends, s, t) for s, t in leading + quiets]
    deletes_p99s = [round(p, 2) for p in during_p99s if p is not None]
    noise_p99s = sorted(round(p, 2) for p in quiet_p99s if p is not None)
    seconds = sum(e - s for s, e in deletes) / 1e9
    measurement = Measurement(
        name=label, events=len(during), calls=len(during), seconds=seconds, client_cpu_seconds=0.0
    )
    measurement.set_latencies(during)
    pairs = len(deletes_p99s) * len(noise_p99s)
    p_value = rank_p(deletes_p99s, noise_p99s) if pairs else None
    measurement.details.update(
        long_events=events,
        long_sessions=sessions,
        delete_call_ms=round(max(calls_ns) / 1e6, 1),
        whole_delete_s=[round((e - s) / 1e9, 2) for s, e in deletes],
        chunks=chunks,
        quiet_p50_ms=percentile(before, 0.5),
        quiet_p99_ms=percentile(before, 0.99),
        quiet_max_ms=before[-1] if before else None,
        after_p50_ms=percentile(after, 0.5),
        after_p99_ms=percentile(after, 0.99),
        after_max_ms=after[-1] if after else None,
        span_s=round(span_ns / 1e9, 2),
        deletes_p99s_ms=deletes_p99s,
        noise_p99s_ms=noise_p99s,
        above_share=round(above(deletes_p99s, noise_p99s) / pairs, 2) if pairs else None,
        p_value=None if p_value is None else round(p_value, 3),
        met=p_value is not None and p_value >= LEVEL,
    )
    return measurement


def above(deletes: Sequence[float], quiet: Sequence[float]) -> float:
    """Mann-Whitney's U: the (delete, quiet) pairs in which the delete's value is the higher,
    a tie counting half."""
    return sum((d > q) + 0.5 * (d == q) for d in deletes for q in quiet)


def rank_p(deletes: Sequence[float], quiet: Sequence[float]) -> float:
    """The one-sided p of the rank test: the share of the ways of labelling the pooled values
    (as many "delete" as ``deletes``) whose U is at least the observed one. U is the labelled
    values' rank sum less its least possible value, so only rank sums are compared."""
    pooled = sorted([*deletes, *quiet])
    ranks = _midranks(pooled)
    rank_of = dict(zip(pooled, ranks, strict=True))
    observed = sum(rank_of[d] for d in deletes)
    k, n = len(deletes), len(pooled)
    if math.comb(n, k) <= EXACT_LABELLINGS:
        sums = [sum(chosen) for chosen in itertools.combinations(ranks, k)]
    else:
        draw = random.Random(14)
        sums = [sum(draw.sample(ranks, k)) for _ in range(SAMPLED_LABELLINGS)]
    return sum(total >= observed - 1e-9 for total in sums) / len(sums)


def _midranks(ordered: Sequence[float]) -> list[float]:
    """Ranks from 1 of sorted values, tied values sharing the mean of their ranks."""
    ranks: list[float] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[i]:
            j += 1
        ranks += [(i + j) / 2 + 1] * (j - i + 1)
        i = j + 1
    return ranks


def _latencies(appends: list[tuple[int, int]], start: int, stop: int) -> list[float]:
    """The sorted times (ms) of the appends that began in [start, stop) and ended before
    ``stop``."""
    return sorted((e - b) / 1e6 for b, e in appends if start <= b and e < stop)


def _p99(
    appends: list[tuple[int, int]], start: int, stop: int, overlapping: bool = False
) -> float | None:
    """The p99 of the appends within [start, stop), or with ``overlapping`` of every append
    that overlapped it (a delete's: the append it held began before it)."""
    if not overlapping:
        return percentile(_latencies(appends, start, stop), 0.99)
    return percentile(sorted((e - b) / 1e6 for b, e in appends if e >= start and b < stop), 0.99)


def _span_starts(first: int, stop: int, span_ns: int) -> list[int]:
    """The starts of the whole spans of ``span_ns`` that end at ``stop`` and begin at or after
    ``first``, latest last (the quiet time before the first delete, cut into spans)."""
    count = (stop - first) // span_ns
    return [stop - (count - k) * span_ns for k in range(count)]


def run_deletes(settings: Settings, work: Path) -> list[Row]:
    """One row: appends during the chunked deletes beside those during one-step deletes."""
    filled = work / "deletes-filled"
    events, sessions = settings.delete_events, settings.delete_sessions
    events //= sessions
    _fill(filled, events, sessions)
    rows = []
    try:
        copies = {}
        for name in ("one-step", "chunked"):
            copies[name] = work / f"deletes-{name}"
            shutil.copytree(filled, copies[name])
        quiet = settings.duration
        one = _measure(copies["one-step"], ONE_STEP, False, events, sessions, quiet)
        chunked = _measure(copies["chunked"], CASE, True, events, sessions, quiet)
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
    p99s, mine = d["noise_p99s_ms"], d["deletes_p99s_ms"]
    spread = f"{p99s[0]:.2f}-{p99s[-1]:.2f}" if p99s else "-"
    times = ", ".join(f"{s}" for s in d["whole_delete_s"])
    verdict = "met" if d["met"] else "not met"
    return (
        f"case 14, {measurement.name}: {d['long_sessions']} sessions of {d['long_events']:,} "
        f"events deleted one after another; the longest delete call {d['delete_call_ms']} ms, "
        f"each freed after {times} s ({d['chunks']} chunks in all); appends to others "
        f"p50/p99/max: before {_figures(d, 'quiet')}, during {_figures(during, 'during')}, "
        f"after {_figures(d, 'after')} ms; noise: the p99s of {len(p99s)} quiet spans of "
        f"{d['span_s']} s {spread} ms, of the deletes {', '.join(f'{p:.2f}' for p in mine)} ms "
        f"(above a quiet span's in {d['above_share']} of the pairs; rank test p = "
        f"{d['p_value']}): p99 unchanged within noise {verdict}"
    )


def _figures(details: dict[str, Any], when: str) -> str:
    """p50/p99/max of one span's appends, in ms ("-" where it had none)."""
    values = [details.get(f"{when}_{name}_ms") for name in ("p50", "p99", "max")]
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)
