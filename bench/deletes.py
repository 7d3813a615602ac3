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

The noise is measured, not assumed: the p99 of each delete span is read against the p99s of
the quiet spans, each as long as a delete: one after each delete, and as many as fit in the
quiet time before the first delete (at least ``LEAD_MS_PER_EVENT`` per event of a long session,
so that some fit before any page was freed). Interleaving them in time puts a drift of the
machine's load on both sides alike. Two questions are asked of those p99s, both by a rank test
(Mann-Whitney's), which assumes nothing of their distribution:
- do the deletes raise the p99? U counts the (delete, quiet) pairs of spans in which the
  delete's p99 is the higher (a tie half), and p is the share of all the ways of labelling the
  same p99s "delete" or "quiet" whose U is at least as high (every way when there are at most
  ``EXACT_LABELLINGS``, else ``SAMPLED_LABELLINGS`` drawn with a fixed seed). p < ``LEVEL``:
  they do, and the verdict is *not met*;
- by how much at most? The ratio of the deletes' p99 to the quiet spans' (Hodges-Lehmann's
  estimate: the median of the pairs' ratios) and its upper confidence bound at 1 - ``LEVEL``
  (the largest ratio the same test would not refuse). The verdict is *met* when that bound is
  at most ``MARGIN`` (the deletes raise the p99 by 20% at most, at that confidence), and
  *inconclusive* when neither holds: the spans spread too much to tell (a busy machine).
With no effect at all the first question answers "not met" one time in twenty. The note also
gives U as a share of the pairs: about 0.5 when the deletes change nothing, 1.0 when every
delete span is worse than every quiet one. The one-transaction deletes, in the same run, show
what the test sees when a delete holds appends (their spans are only as long as the delete,
which holds the one append that waits for it).
"""

from __future__ import annotations

import bisect
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
less often than this; also 1 - the confidence of the bound on their ratio."""
MARGIN = 1.2
"""The most the deletes may raise the appends' p99 (a ratio) and still read as unchanged: "met"
needs the ratio's upper confidence bound at or below it."""
LEAD_MS_PER_EVENT = 0.6
"""The quiet time before the first delete is at least this much per event of a long session
(one paced delete under appends took 0.1-0.4 ms an event), so that a quiet span or two fit
before any delete has freed a page."""
EXACT_LABELLINGS = 200_000
"""Up to this many ways of labelling the spans, the rank test counts them all."""
SAMPLED_LABELLINGS = 20_000
"""Beyond ``EXACT_LABELLINGS``, the rank test draws this many (seeded: a run's verdict is
reproducible from its figures)."""


def budget_seconds(events: int) -> float:
    """What case 14 adds to the run's time budget for ``events`` deleted in all: its paced
    purge under continuous appends takes 0.1-0.4 ms an event, the quiet spans after the deletes
    as long again, and the quiet time before the first delete ``LEAD_MS_PER_EVENT`` per event
    of one of the sessions."""
    return events / 1_000


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
        time.sleep(max(quiet_s, events * LEAD_MS_PER_EVENT / 1e3))  # see LEAD_MS_PER_EVENT
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
    during_p99s = [_p99(appends, s, t + 1) for s, t in deletes]
    quiet_p99s = [_p99(appends, s, t) for s, t in leading + quiets]
    deletes_p99s = [p for p in during_p99s if p is not None]
    noise_p99s = sorted(p for p in quiet_p99s if p is not None)
    seconds = sum(e - s for s, e in deletes) / 1e9
    measurement = Measurement(
        name=label, events=len(during), calls=len(during), seconds=seconds, client_cpu_seconds=0.0
    )
    measurement.set_latencies(during)
    pairs = len(deletes_p99s) * len(noise_p99s)
    p_value = rank_p(deletes_p99s, noise_p99s) if pairs else None
    ratio, bound = ratio_bound(deletes_p99s, noise_p99s) if pairs else (None, None)
    if p_value is None or ratio is None or bound is None:
        verdict = "not measured"
    elif p_value < LEVEL:
        verdict = "not met"
    else:
        verdict = "met" if bound <= MARGIN else "inconclusive"
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
        deletes_p99s_ms=[round(p, 2) for p in deletes_p99s],
        noise_p99s_ms=[round(p, 2) for p in noise_p99s],
        leading_spans=len(leading),
        above_share=round(above(deletes_p99s, noise_p99s) / pairs, 2) if pairs else None,
        p_value=p_value,
        ratio=None if ratio is None else round(ratio, 2),
        ratio_bound=None if bound is None else round(bound, 2),
        verdict=verdict,
        met=verdict == "met",
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
        return sum(total >= observed - 1e-9 for total in sums) / len(sums)
    draw = random.Random(14)
    sums = [sum(draw.sample(ranks, k)) for _ in range(SAMPLED_LABELLINGS)]
    # Drawn: the observed labelling counts as one more, so p is never 0 (at least 1 / 20,001).
    return (sum(total >= observed - 1e-9 for total in sums) + 1) / (len(sums) + 1)


def ratio_bound(deletes: Sequence[float], quiet: Sequence[float]) -> tuple[float, float]:
    """How many times the quiet spans' p99 the deletes' is, and the upper confidence bound of
    that ratio at 1 - ``LEVEL`` (both from the rank test, on logs: Hodges-Lehmann's estimate,
    the median of the pairs' log ratios, and the bound where the test would start to refuse a
    larger ratio: the u-th largest log ratio, u the largest U that chance alone stays under
    with probability ``LEVEL`` at most; infinity when no u does)."""
    logs = sorted(math.log(d) - math.log(q) for d in deletes for q in quiet)
    null = sorted(_null_u(len(deletes), len(quiet)))
    u = 0
    while u < len(logs) and bisect.bisect_right(null, u) / len(null) <= LEVEL:
        u += 1  # P(U <= u - 1) <= LEVEL still: a bound at the u-th largest holds
    estimate = math.exp(statistics.median(logs))
    return estimate, math.exp(logs[len(logs) - u]) if u else math.inf


def _null_u(k: int, m: int) -> list[int]:
    """U of every way of picking which k of k + m distinct values are the deletes (drawn, with
    a seed, past ``EXACT_LABELLINGS``)."""
    least = k * (k - 1) // 2
    if math.comb(k + m, k) <= EXACT_LABELLINGS:
        return [sum(c) - least for c in itertools.combinations(range(k + m), k)]
    draw = random.Random(14)
    return [sum(draw.sample(range(k + m), k)) - least for _ in range(SAMPLED_LABELLINGS)]


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


def _p99(appends: list[tuple[int, int]], start: int, stop: int) -> float | None:
    """The p99 of every append that overlapped [start, stop) (a delete's span holds the append
    that began before it; a quiet span is read the same way)."""
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
    verdict = d["verdict"]
    return (
        f"case 14, {measurement.name}: {d['long_sessions']} sessions of {d['long_events']:,} "
        f"events deleted one after another; the longest delete call {d['delete_call_ms']} ms, "
        f"each freed after {times} s ({d['chunks']} chunks in all); appends to others "
        f"p50/p99/max: before {_figures(d, 'quiet')}, during {_figures(during, 'during')}, "
        f"after {_figures(d, 'after')} ms; noise: the p99s of {len(p99s)} quiet spans of "
        f"{d['span_s']} s {spread} ms, of the deletes {', '.join(f'{p:.2f}' for p in mine)} ms "
        f"(above a quiet span's in {d['above_share']} of the pairs; rank test p "
        f"{_p_text(d['p_value'])}; the deletes' p99 {d['ratio']}x the quiet spans', at most "
        f"{d['ratio_bound']}x at {1 - LEVEL:.0%}): p99 unchanged within noise {verdict}"
    )


def _p_text(p_value: float | None) -> str:
    """``= p`` to 4 places, or ``< 0.0001`` (a drawn p is never 0, but can be that small)."""
    if p_value is None:
        return "-"
    return "< 0.0001" if p_value < 0.0001 else f"= {p_value:.4f}"


def _figures(details: dict[str, Any], when: str) -> str:
    """p50/p99/max of one span's appends, in ms ("-" where it had none)."""
    values = [details.get(f"{when}_{name}_ms") for name in ("p50", "p99", "max")]
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)
