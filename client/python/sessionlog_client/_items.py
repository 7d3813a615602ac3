"""What the framework backends share (pure): keeping a JSON value in event data exactly, and
which events a log still shows once its replaces and hides are applied.

A ``Struct`` holds every number as a double and nests at most 24 levels (SPEC §3), so a value
is stored as an object only when it comes back from :func:`struct_to_dict` as itself; anything
else (a whole float such as ``1.0``, an int past 2^53, deep nesting) is stored as its JSON text
under the key with ``_json`` appended. Either way the value read back equals the value given.

Session ids built from a framework's names escape each part with :func:`escape`.
"""

from __future__ import annotations

import bisect
import json
import json.scanner
import operator
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from sessionlog_client.v1.event_pb2 import Event

T = TypeVar("T")

TAIL_PAGE_MIN = 32
"""The fewest events a last-N read asks for per page: a hide takes entries out of view, so a
page of exactly N events would often need a second one."""
TAIL_PAGE_MAX = 1000
"""ListEvents' largest page."""
_SEQ = operator.attrgetter("seq")


def put_exact(data: dict[str, Any], key: str, value: Any) -> None:
    """Store ``value`` in ``data`` as its JSON text, under ``key`` with ``_json`` appended."""
    data[f"{key}_json"] = json.dumps(value, ensure_ascii=False, allow_nan=False)


def get_exact(event: Event, key: str) -> tuple[bool, Any]:
    """``(True, value)`` for what :func:`put_exact` stored under ``key``; ``(False, None)``
    when the event holds nothing there."""
    text = event.data.fields.get(f"{key}_json")
    if text is None or text.WhichOneof("kind") != "string_value":
        return False, None
    return True, loads(text.string_value)


_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # stub: a decoder


def loads(text: str) -> Any:
    """``json.loads(text)``, in one call of the C scanner when ``text`` is one JSON value with
    nothing around it (all :func:`put_exact` writes): a whole-history read parses thousands of
    items, and ``json.loads`` spends more on its two whitespace matches and its wrappers than
    on a short item. Anything else (whitespace around the value, trailing data, no value) goes
    to ``json.loads``, which returns or raises exactly as it always would.
    """
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def position(event: Event) -> int:
    """A replace's (or hide's) position is its start_seq, any other event's its seq (SPEC §4)."""
    if event.surface_op.WhichOneof("kind") == "replace":
        return int(event.surface_op.replace.start_seq)
    return int(event.seq)


def in_view(events: Iterable[Event]) -> list[Event]:
    """The events no later replace or hide covers, in position order (ties in seq order).

    The server's shadowing rule (SPEC §4, and Hide in the README), applied to every event and
    not only the surface ones: a backend keeps framework items the server does not show (a
    reasoning item) in bookkeeping events, and a hide over them must take them out of view too.
    Walks the log from its newest event back, keeping the positions the ranges seen so far cover
    (merged intervals), so the cost is about n log n, not events times ranges. A log with no
    replace or hide is in view whole, in seq order, and costs one look at each event's op.
    """
    ordered = sorted(events, key=_SEQ)
    if not any(e.HasField("surface_op") and _replaces(e) for e in ordered):
        return ordered  # the common log: nothing replaced or hidden (an op's presence is cheap)
    ranges = [_range(e) if _replaces(e) else None for e in ordered]
    covered = _Covered()
    shown: list[tuple[int, int, Event]] = []
    for event, rng in zip(reversed(ordered), reversed(ranges), strict=True):
        where = int(event.seq) if rng is None else rng[0]
        if not covered.holds(where):
            shown.append((where, int(event.seq), event))
        if rng is not None:
            covered.add(*rng)
    shown.sort(key=lambda held: (held[0], held[1]))
    return [held[2] for held in shown]


def _replaces(event: Event) -> bool:
    return bool(event.surface_op.WhichOneof("kind") == "replace")


def known_from(tail: Iterable[Event]) -> int:
    """The lowest position whose view a tail of the log (every event from its lowest seq on)
    decides; 0 for an empty tail.

    An unread event is older than every read one, so only a read replace or hide can cover it:
    the read events are in view or not exactly as in the whole log, and an unread event sits at
    a position below the tail's first seq. Ranges that reach down to that seq, or to one that an
    earlier such range reached, cover every unread event between, so the view from the lowest of
    them on is known; below it an unread event may still show.
    """
    seqs = [int(e.seq) for e in tail]
    if not seqs:
        return 0
    start = min(seqs)
    ranges = sorted(
        (_range(e) for e in tail if e.surface_op.WhichOneof("kind") == "replace"), reverse=True
    )
    lowered = True
    while lowered:
        lowered = False
        for low, high in ranges:
            if low < start <= high + 1:
                start, lowered = low, True
    return start


def tail_page_size(limit: int) -> int:
    """The page size of a read of the latest ``limit`` entries, newest first."""
    return min(max(limit + 1, TAIL_PAGE_MIN), TAIL_PAGE_MAX)


def latest(
    tail: Sequence[Event],
    more: bool,
    limit: int,
    shown: Callable[[Sequence[Event], int], list[T]],
) -> list[T] | None:
    """The latest ``limit`` entries of the log, from ``tail``, its newest events read newest
    first (``more`` when older ones are unread); None when only an older page can tell.

    ``shown(tail, start)`` is what a backend makes of the events in view from position
    ``start`` on, in order. Every entry from ``known_from(tail)`` on is decided by ``tail``
    alone, so once at least ``limit`` of them are known (or the whole log is read) the latest
    ``limit`` are final; a run of hides at the end just costs more pages.
    """
    start = known_from(tail) if more else 0
    entries = shown(tail, start)
    if start == 0 or len(entries) >= limit:
        return entries[-limit:] if limit > 0 else []
    return None


def newest(
    tail: Sequence[Event], more: bool, limit: int, entries_of: Callable[[Event], list[T]]
) -> list[T] | None:
    """``latest`` looking at as few events as decide the answer: the latest ``limit`` entries
    of the log from ``tail``, its newest events read newest first (none missing between them;
    ``more`` when older ones are unread); None when the whole of ``tail`` was walked and older
    events may still count (``latest`` then decides what it can from ``known_from``).

    ``entries_of(event)`` is what an event in view shows, in order (none, one or several). The
    walk goes back from the newest event: an event's view is final once it is passed, since
    only a later event can cover it, and an unread event sits at a position no higher than its
    seq, so it sorts before every entry at a position from that seq on (a tie goes to the
    higher seq). Once ``limit`` entries sit there, they are the latest. A log without replaces
    or hides stops after its newest ``limit`` item events, and the events before them are never
    decoded; a run of hides at the end is walked once, without sorting.
    """
    if limit <= 0:
        return []
    if not tail:
        return None if more else []
    covered = _Covered()
    final: list[tuple[int, int, list[T]]] = []  # (position, seq, entries), after every unread
    waiting: list[tuple[int, int, list[T]]] = []  # a replace's, which an older event may follow
    count, merged = 0, False
    last = len(tail) - 1
    for index, event in enumerate(tail):
        seq = int(event.seq)
        if event.HasField("surface_op") and _replaces(event):
            low, high = _range(event)
            if not covered.holds(low) and (shown := entries_of(event)):
                waiting.append((low, seq, shown))
            covered.add(low, high)
        elif not covered.holds(seq) and (shown := entries_of(event)):
            final.append((seq, seq, shown))  # at its seq: after every older event
            count += len(shown)
        if index == last:
            if more:
                return None
            final.extend(waiting)  # nothing older: every entry in view is known
            merged = merged or bool(waiting)
            break
        if waiting:
            below = int(tail[index + 1].seq)
            settled = [held for held in waiting if held[0] >= below]
            if settled:
                waiting = [held for held in waiting if held[0] < below]
                final.extend(settled)
                count += sum(len(held[2]) for held in settled)
                merged = True
        if count >= limit:
            break
    if merged:
        final.sort(key=lambda held: (held[0], held[1]), reverse=True)
    found = [entry for held in reversed(final) for entry in held[2]]
    return found[-limit:]


class _Covered:
    """A union of inclusive integer intervals, kept merged and sorted by start."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []

    def holds(self, point: int) -> bool:
        at = bisect.bisect_right(self._starts, point) - 1
        return at >= 0 and self._stops[at] >= point

    def add(self, start: int, stop: int) -> None:
        if stop < start:
            return
        first = bisect.bisect_left(self._stops, start - 1)  # the first interval it touches
        last = bisect.bisect_right(self._starts, stop + 1)  # one past the last it touches
        if first < last:
            start = min(start, self._starts[first])
            stop = max(stop, self._stops[last - 1])
        self._starts[first:last] = [start]
        self._stops[first:last] = [stop]


def _range(event: Event) -> tuple[int, int]:
    return int(event.surface_op.replace.start_seq), int(event.surface_op.replace.stop_seq)


def text_of(value: Any, parts: Mapping[str, str]) -> str | None:
    """The text a content value shows: a string as is; for a list, the text of each part whose
    ``type`` (or ``part_kind``) is a key of ``parts``, read from the field it names, joined by
    newlines; None when there is no text."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return None
    texts: list[str] = []
    for part in value:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        field = parts.get(part.get("type") or part.get("part_kind") or "")
        if field is not None and isinstance(part.get(field), str):
            texts.append(part[field])
    return "\n".join(texts) if texts else None


def escape(part: str) -> str:
    """``part`` in the characters a session id may hold, with no ``.``: letters, numbers,
    combining marks and ``-`` stay as they are; every other character (``_`` and ``.``
    included) becomes ``_`` and two hex digits per UTF-8 byte. ``unescape`` reverses it."""
    out: list[str] = []
    for ch in part:
        if ch == "-" or unicodedata.category(ch)[0] in "LNM":
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def unescape(part: str) -> str:
    """The string :func:`escape` made ``part`` from."""
    raw = bytearray()
    i = 0
    while i < len(part):
        if part[i] == "_":
            raw.append(int(part[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(part[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", "surrogatepass")
