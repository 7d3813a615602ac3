"""The pure core: validate events, shadow by position, order the surface, project to messages.

No grpc, no lmdb, no clock, no I/O: events in, surface and messages out. Everything here works on
the generated protobuf messages and is deterministic, so the whole of SPEC §3-6 is testable in
memory.

Invariants the fold relies on (the writer guarantees them):
- events arrive in seq order, dense from 0;
- a replace event at seq n has start_seq <= stop_seq and start_seq <= n.

Shadowing (SPEC §4). The position of a replace is its start_seq, of any other event its seq. A
replace R with range [a, b] hides every earlier event (seq < R.seq) whose position is in [a, b].
The surface is the unshadowed surface events, stably sorted by position.

Hide (EVENT_TYPE_HIDE, beyond SPEC §2). A hide event carries a replace range and shadows exactly
as a replace does, but it is not a surface type: it hides its range and takes no place on the
surface. It is the one non-surface type that carries a surface_op, and it must: a hide without a
replace range fails with INVALID_SURFACE_OP. It counts as a replace in replace_generation.

Why the memo can be extended event by event: a plain event at seq n has position n, greater than
every position before it (positions never exceed seqs), so it goes at the end. A replace at seq n
hides exactly the currently visible events with position in [a, b], which, the surface being sorted
by position, is one contiguous slice; the replace takes that slice's place (a hide just removes
the slice). Events already hidden
stay hidden (shadowing is a union), so nothing ever needs to come back.
"""

from __future__ import annotations

import math
import operator
import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from heapq import heappush, heapreplace
from typing import NamedTuple

from google.protobuf.message import DecodeError
from google.protobuf.struct_pb2 import ListValue, Struct, Value

from sessionlog import errors, mirrors, wire
from sessionlog.v1.event_pb2 import Event, EventType, Usage
from sessionlog.v1.message_pb2 import Message, Role

SURFACE_TYPES = frozenset(
    {
        EventType.EVENT_TYPE_SYSTEM_MESSAGE,
        EventType.EVENT_TYPE_USER_MESSAGE,
        EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
        EventType.EVENT_TYPE_TOOL_RESULT,
    }
)
KNOWN_TYPES = frozenset(v for v in EventType.values() if v != EventType.EVENT_TYPE_UNSPECIFIED)
ROLE_OF_TYPE = {
    EventType.EVENT_TYPE_SYSTEM_MESSAGE: Role.ROLE_SYSTEM,
    EventType.EVENT_TYPE_USER_MESSAGE: Role.ROLE_USER,
    EventType.EVENT_TYPE_ASSISTANT_MESSAGE: Role.ROLE_ASSISTANT,
    EventType.EVENT_TYPE_TOOL_RESULT: Role.ROLE_TOOL,
}
TYPE_OF_ROLE = {role: type_ for type_, role in ROLE_OF_TYPE.items()}
HIDE = EventType.EVENT_TYPE_HIDE
"""The type that hides a range from the surface and adds nothing: it must carry a replace op."""

STRING_FIELDS = ("content", "reasoning_content", "tool_call_id", "name")
MAX_SESSION_ID_BYTES = 235


@dataclass(frozen=True)
class Limits:
    """Per-event limits checked at append (SPEC §3 rule 4)."""

    max_event_bytes: int = 1 << 20
    """Largest serialized Event accepted, counted as sent with its time (seq adds at most 11)."""
    max_data_depth: int = 24
    """Deepest nesting of objects and lists in data; data itself is level 1."""


DEFAULT_LIMITS = Limits()


class Violation(NamedTuple):
    """The first rule an event breaks, with the rule's number so later checks keep SPEC order."""

    rule: int
    error: errors.SessionLogError


# -- session ids --------------------------------------------------------------------------------


_ASCII_SESSION_ID = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_SESSION_ID_BYTES - 1}}}")
"""The ids made of ASCII alone that SPEC §7 accepts: in ASCII, the letters and numbers are
exactly A-Z, a-z and 0-9, and no character is a combining mark."""


def check_session_id(session_id: str) -> None:
    """Raise InvalidSessionId unless the id follows SPEC §7. The message never echoes the id."""
    if session_id.isascii() and _ASCII_SESSION_ID.fullmatch(session_id):
        return  # the usual id, checked in one match; anything else takes the full walk below
    size = len(session_id.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_SESSION_ID_BYTES:
        raise errors.InvalidSessionId(
            f"a session id must be 1 to {MAX_SESSION_ID_BYTES} bytes of UTF-8; this one has {size}",
            length=size,
        )
    first = session_id[0]
    if not (first == "_" or unicodedata.category(first)[0] in "LN"):
        raise errors.InvalidSessionId(
            "a session id must start with a letter, a number or '_'", position=0
        )
    for i, ch in enumerate(session_id[1:], start=1):
        if ch in "_.-" or unicodedata.category(ch)[0] in "LNM":
            continue
        raise errors.InvalidSessionId(
            "a session id may hold only letters, numbers, combining marks, '_', '.' and '-'; "
            f"character {i} (counting from 0) is {ch!r}, not one of them",
            position=i,
        )


# -- validation (SPEC §3) -----------------------------------------------------------------------


def replace_range(event: Event) -> tuple[int, int] | None:
    """The (start_seq, stop_seq) an event replaces, or None for an append."""
    if event.surface_op.WhichOneof("kind") == "replace":
        r = event.surface_op.replace
        return r.start_seq, r.stop_seq
    return None


def position(event: Event) -> int:
    """Where an event stands on the surface: a replace at its start_seq, anything else at seq."""
    rng = replace_range(event)
    return event.seq if rng is None else rng[0]


def check_event(
    event: Event, index: int, limits: Limits = DEFAULT_LIMITS, *, size: int | None = None
) -> Violation | None:
    """Check every rule of SPEC §3 that does not depend on the seq the event will get.

    Returns the first violation in rule order, or None. Rule 3's "start_seq must not point past
    the event's own seq" needs the seq and is checked by :func:`admit`. ``size`` is the event's
    serialized size when the caller already knows it (say, having serialized the event with the
    time it will be stored with); by default it is computed.
    """
    event_type = event.type
    if event_type not in KNOWN_TYPES:
        return Violation(
            1,
            errors.UnknownEventType(
                f"event {index} has type {event_type}, which is not a known event type",
                index=index,
                type=event_type,
            ),
        )
    surface = event_type in SURFACE_TYPES
    op = event.surface_op.WhichOneof("kind") if event.HasField("surface_op") else None
    if event_type == HIDE:
        if op != "replace":
            return Violation(
                3,
                errors.InvalidSurfaceOp(
                    f"event {index} is an EVENT_TYPE_HIDE and must carry a surface_op.replace "
                    "naming the range [start_seq, stop_seq] it hides",
                    index=index,
                ),
            )
    elif op and not surface:
        return Violation(
            2,
            errors.SurfaceOpOnNonSurfaceEvent(
                f"event {index} is a {EventType.Name(event_type)}, a bookkeeping type, and may not "
                "carry a surface_op; only message and tool-result events (and hides) may",
                index=index,
            ),
        )
    if op == "replace":
        replace = event.surface_op.replace
        start, stop = replace.start_seq, replace.stop_seq
        if start > stop:
            verb = "hides" if event_type == HIDE else "replaces"
            return Violation(
                3,
                errors.InvalidSurfaceOp(
                    f"event {index} {verb} [{start}, {stop}]: start_seq must not exceed stop_seq",
                    index=index,
                    start_seq=start,
                    stop_seq=stop,
                ),
            )
    # data's own values and their kinds, read once for rule 4's walk and rule 5's shapes
    top, kinds = _top_values(event.data)
    problem = _time_problem(event) or _data_problem(top, kinds, limits.max_data_depth)
    if problem is None and event.HasField("state_delta"):
        problem = _state_delta_problem(event.state_delta, limits.max_data_depth)
    if problem:
        return _unserializable(index, problem)
    if size is None:
        size = event.ByteSize()
    violation = _size_and_shape(event_type, top, kinds, index, size, limits)
    if violation is not None:
        return violation
    if event.HasField("usage"):
        bad = usage_problem(event.usage)
        if bad is not None:
            field, why = bad
            return Violation(
                5,
                errors.InvalidUsage(
                    f"event {index}: usage.{field} {why}", index=index, field=f"usage.{field}"
                ),
            )
    seq = event.seq
    if seq != 0:
        return Violation(
            6,
            errors.SeqAssignedByServer(
                f"event {index} carries seq {seq}; leave seq 0, the server assigns it",
                index=index,
                seq=seq,
            ),
        )
    return None


PLAIN_TYPES = KNOWN_TYPES - {HIDE}
"""The types a plain event (``check_plain_event``) may have: a hide needs its surface_op."""


def check_plain_event(
    event_type: int, data: Struct, index: int, limits: Limits, size: int
) -> Violation | None:
    """:func:`check_event` for a plain event: one of ``PLAIN_TYPES``, maybe data, and no other
    field at all (no seq, time, surface_op, usage, state_delta, redaction or unknown field),
    as the caller knows from its bytes (``wire.plain_event_type``). The same verdict, with the
    rules such an event cannot break left out: the common event of an append, checked for
    about half the cost. ``size`` is its serialized size as stored."""
    fields = data.fields
    seen = {key: fields[key].WhichOneof("kind") for key in fields}
    if (
        _STRING_KIND_SET.issuperset(seen.values())
        and _OBJECT_FIELDS.isdisjoint(seen)
        and size <= limits.max_event_bytes
        and limits.max_data_depth >= 1
    ):
        return None  # strings and nulls: JSON as they are, each projected field of its shape
    top, kinds = _top_values(data)
    problem = _data_problem(top, kinds, limits.max_data_depth)
    if problem:
        return _unserializable(index, problem)
    return _size_and_shape(event_type, top, kinds, index, size, limits)


def doubtful_events(bodies: Sequence[bytes], limits: Limits, extra: int) -> list[int]:
    """The events of a batch, given as serialized (``SerializeToString``), that are not shown in
    bulk to be plain events :func:`check_plain_event` accepts at once; their indices, in order.
    Every other event is such an event (a type of ``PLAIN_TYPES`` below 128, data of strings and
    nulls and no ``tool_calls`` or ``metadata`` key, nothing else, at most the size limit with
    ``extra`` bytes of time added), so its verdict is None, as ``check_event``'s would be.

    What shows it, for the whole batch at once: the batch parsed as ``mirrors.PlainEvents``
    keeps everything (nothing of the event is unknown to a plain event, no value of another
    kind), each event starts with its type's two bytes, the largest is within the limit, and
    none of a few byte strings occurs anywhere in the batch: the names of the object fields
    (bytes that hold no such key hold no such field) and an empty Value's bytes (a value of no
    kind, the one value that parses as a plain one and is refused). A doubt about the batch is
    narrowed to the events it concerns; a false doubt (such bytes inside a string) only costs
    the caller the check of that event one by one."""
    count = len(bodies)
    if not count or limits.max_data_depth < 1:
        return list(range(count))
    joined = wire.length_delimited(_PLAIN_EVENTS_FIELD, bodies)
    try:
        plain = mirrors.PlainEvents.FromString(joined)
    except DecodeError:
        return list(range(count))
    plain.DiscardUnknownFields()
    doubts: set[int] = set()
    if plain.ByteSize() != len(joined):
        sizes = [event.ByteSize() for event in plain.events]
        doubts.update(i for i, body in enumerate(bodies) if sizes[i] != len(body))
    if not _PLAIN_PREFIXES.issuperset(map(_FIRST_TWO, bodies)):
        doubts.update(i for i, body in enumerate(bodies) if body[:2] not in _PLAIN_PREFIXES)
    largest = limits.max_event_bytes - extra
    if max(map(len, bodies)) > largest:
        doubts.update(i for i, body in enumerate(bodies) if len(body) > largest)
    for marker in _DOUBTFUL_BYTES if b"\x00" in joined else _DOUBTFUL_NAMES:
        if marker in joined:
            doubts.update(i for i, body in enumerate(bodies) if marker in body)
    return sorted(doubts)


def _top_values(data: Struct) -> tuple[dict[str, Value], dict[str, str | None]]:
    """data's own values by key (in the map's order) and the kind of each."""
    fields = data.fields
    top: dict[str, Value] = {}
    kinds: dict[str, str | None] = {}
    for key in fields:
        value = top[key] = fields[key]
        kinds[key] = value.WhichOneof("kind")
    return top, kinds


def _unserializable(index: int, problem: str) -> Violation:
    return Violation(
        4,
        errors.UnserializableEventData(
            f"event {index} cannot be stored as JSON: {problem}", index=index
        ),
    )


def _size_and_shape(
    event_type: int,
    top: dict[str, Value],
    kinds: dict[str, str | None],
    index: int,
    size: int,
    limits: Limits,
) -> Violation | None:
    """Rule 4's size limit, then rule 5's shapes of a surface event's projected fields."""
    if size > limits.max_event_bytes:
        return Violation(
            4,
            errors.EventTooLarge(
                f"event {index} is {size} bytes; the limit is {limits.max_event_bytes} bytes",
                index=index,
                size=size,
                limit=limits.max_event_bytes,
            ),
        )
    if event_type in SURFACE_TYPES:
        field = _misshapen_field(top, kinds)
        if field:
            return Violation(
                5,
                errors.InvalidMessageField(
                    f"event {index}: data.{field} has the wrong type ({_FIELD_SHAPES[field]})",
                    index=index,
                    field=field,
                ),
            )
    return None


def admit(
    events: Sequence[Event],
    prechecked: Sequence[Violation | None],
    next_seq: int,
    *,
    lenient: bool,
    ranges: Sequence[tuple[int, int] | None] | None = None,
) -> tuple[list[int], list[tuple[int, errors.SessionLogError]]]:
    """Decide which events of an append are written, given the seq the first one would get.

    Strict: raise the first failure (SPEC order: rules 1-2, then rule 3 with the seq, then 4-6).
    Lenient: drop each failing event (later events then take the freed seqs) and report it.
    Returns the indices kept and the (index, error) of each drop. ``ranges`` are the events'
    ``replace_range``s when the caller already read them.
    """
    if ranges is None:
        ranges = [replace_range(event) for event in events]
    if not any(prechecked) and not any(ranges) and len(ranges) == len(prechecked):
        return list(range(len(ranges))), []  # no violation and no replace: nothing can fail
    kept: list[int] = []
    drops: list[tuple[int, errors.SessionLogError]] = []
    seq = next_seq
    for index, (rng, pre) in enumerate(zip(ranges, prechecked, strict=True)):
        failure = _first_failure(rng, pre, seq, index)
        if failure is None:
            kept.append(index)
            seq += 1
        elif lenient:
            drops.append((index, failure))
        else:
            raise failure
    return kept, drops


def _first_failure(
    rng: tuple[int, int] | None, pre: Violation | None, seq: int, index: int
) -> errors.SessionLogError | None:
    if pre is not None and pre.rule < 3:
        return pre.error
    if rng is not None and rng[0] > seq:
        return errors.InvalidSurfaceOp(
            f"event {index} would get seq {seq} but replaces from {rng[0]}: a replace cannot "
            "point at the future",
            index=index,
            start_seq=rng[0],
            seq=seq,
        )
    return None if pre is None else pre.error


def _time_problem(event: Event) -> str | None:
    if not event.HasField("time"):
        return None
    t = event.time
    # RFC 3339 covers years 0001 to 9999.
    if not -62135596800 <= t.seconds <= 253402300799 or not 0 <= t.nanos <= 999_999_999:
        return "time is outside the range of a valid timestamp (years 0001 to 9999)"
    return None


def _data_problem(
    top: dict[str, Value], kinds: dict[str, str | None], max_depth: int
) -> str | None:
    """Why data cannot round-trip as JSON, or None. data itself is level 1.

    ``top`` holds data's values by key (in the map's order) and ``kinds`` the kind of each, read
    once by the caller. Only objects and lists are pushed, so flat data costs one pass over
    ``kinds``. Nested Structs are read as ``fields[key]`` per key: the Mapping mixin's
    ``values()`` is several times slower on protobuf maps, and iterates in the same order.
    """
    if max_depth < 1:
        return _TOO_DEEP.format(max_depth)
    stack: list[tuple[Struct | ListValue, int]] = []
    for key, kind in kinds.items():
        if kind not in _SCALAR_KINDS:
            problem = _value_problem(top[key], kind, 2, stack)
            if problem:
                return problem
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return _TOO_DEEP.format(max_depth)
        if isinstance(node, Struct):
            fields = node.fields
            values: Iterable[Value] = [fields[key] for key in fields]
        else:
            values = node.values
        for value in values:
            kind = value.WhichOneof("kind")
            if kind not in _SCALAR_KINDS:
                problem = _value_problem(value, kind, depth + 1, stack)
                if problem:
                    return problem
    return None


def _value_problem(
    value: Value, kind: str | None, child_depth: int, stack: list[tuple[Struct | ListValue, int]]
) -> str | None:
    """Check one non-string value; push an object or list to walk at ``child_depth``."""
    if kind == "number_value":
        if not math.isfinite(value.number_value):
            return "a number is NaN or infinite"
    elif kind == "struct_value":
        stack.append((value.struct_value, child_depth))
    elif kind == "list_value":
        stack.append((value.list_value, child_depth))
    elif kind is None:
        return "a value has no kind set (not null, number, string, bool, object or list)"
    return None


def _state_delta_problem(delta: Struct, max_depth: int) -> str | None:
    """Why a state_delta cannot round-trip as JSON, or None: the rules of data, same depth."""
    fields = delta.fields
    top = {key: fields[key] for key in fields}
    kinds: dict[str, str | None] = {key: value.WhichOneof("kind") for key, value in top.items()}
    problem = _data_problem(top, kinds, max_depth)
    return None if problem is None else f"in state_delta, {problem}"


_TOO_DEEP = "objects and lists are nested deeper than {} levels"
_SCALAR_KINDS = frozenset({"string_value", "bool_value", "null_value"})
"""Value kinds that can never break JSON: nothing to check."""
_FIELD_SHAPES = {
    **dict.fromkeys(STRING_FIELDS, "a string or null"),
    "tool_calls": "a list of objects",
    "metadata": "an object",
}
_STRING_KINDS = ("string_value", "null_value")
_STRING_KIND_SET = frozenset(_STRING_KINDS)
_OBJECT_FIELDS = frozenset(_FIELD_SHAPES) - frozenset(STRING_FIELDS)
"""The projected fields that must not be strings (``tool_calls``, ``metadata``)."""


_PLAIN_EVENTS_FIELD = mirrors.PlainEvents.DESCRIPTOR.fields_by_name["events"].number
_PLAIN_PREFIXES = frozenset(
    Event(type=EventType.Name(event_type)).SerializeToString()
    for event_type in PLAIN_TYPES
    if event_type < 0x80
)
"""The first two bytes of a plain event of each type below 128: the type's tag and value."""
_EMPTY_VALUE = Struct(fields={"k": Value()}).SerializeToString()[-2:]
"""A data entry's value of no kind, as it ends the entry: the value's tag and a zero length."""
assert all(len(prefix) == 2 for prefix in _PLAIN_PREFIXES), "the time goes after two bytes"
_DOUBTFUL_NAMES = tuple(sorted(name.encode() for name in _OBJECT_FIELDS))
_DOUBTFUL_BYTES = (*_DOUBTFUL_NAMES, _EMPTY_VALUE)
"""What ``doubtful_events`` looks for in a batch's bytes: the empty value only where a zero byte
occurs at all (``in`` looks for one byte much faster than for two)."""
assert _EMPTY_VALUE.endswith(b"\x00")
_FIRST_TWO = operator.itemgetter(slice(0, 2))


def _misshapen_field(top: dict[str, Value], kinds: dict[str, str | None]) -> str | None:
    """The first projected field (in SPEC order) present with the wrong type, or None."""
    for key in STRING_FIELDS:
        if key in kinds and kinds[key] not in _STRING_KINDS:
            return key
    if "tool_calls" in kinds and (
        kinds["tool_calls"] != "list_value"
        or any(
            item.WhichOneof("kind") != "struct_value"
            for item in top["tool_calls"].list_value.values
        )
    ):
        return "tool_calls"
    if "metadata" in kinds and kinds["metadata"] != "struct_value":
        return "metadata"
    return None


# -- the fold (SPEC §4, §6) ---------------------------------------------------------------------


def fold_surface(events: Iterable[Event]) -> list[Event]:
    """The surface by the definition in SPEC §4, computed from scratch.

    The reference the memoized :class:`SurfaceFold` must always agree with; O(events x replaces).
    Hides are among the replaces (they shadow) but, not being surface types, never visible.
    """
    log = list(events)
    replaces = [(e.seq, *rng) for e in log if (rng := replace_range(e)) is not None]
    visible = [
        e
        for e in log
        if e.type in SURFACE_TYPES
        and not any(r_seq > e.seq and a <= position(e) <= b for r_seq, a, b in replaces)
    ]
    return sorted(visible, key=position)


def surface_tail(
    events_desc: Iterable[Event], limit: int, before: int | None = None
) -> list[Event]:
    """The last ``limit`` entries of the surface with position below ``before`` (None: no bound),
    in surface order, from the log's events given newest first, read only as far as needed.

    ``events_desc`` must be a log's events in descending seq, starting at its last event (the
    view's end) with none left out. Why the walk may stop early (SPEC §4): when an event at seq s
    is reached, every event that could shadow it has a larger seq and has already been seen, so
    whether it is visible is known; and every event not yet seen has a position at most its seq,
    so at most s, and if visible, at a position no replace seen so far covers: at most u, the
    largest position up to s left uncovered. Visible entries never share a position (a replace
    hides the event at its start and any earlier replace from there), so once u is below the
    position of the ``limit``-th candidate, nothing unseen can enter the page. (Looking at u,
    not s, is what stops the walk right after a summary over the start of a long log.)

    Cost: the events from the view's end down to the page's first entry, or to the replace that
    hides what lies below it (and the event that proves it), whatever the length of the log.
    """
    return walk_back(events_desc, limit, before)[0] if limit > 0 else []


@dataclass(frozen=True)
class TailWalk:
    """Where a backwards walk stopped, so that the page before can go on from there instead of
    walking from the view's end again (see :func:`walk_back`)."""

    next_seq: int
    """The events below this seq are not read yet (0: none is left)."""
    hidden: tuple[tuple[int, int], ...]
    """The replace ranges read so far, merged, cut to positions below ``next_seq`` (the only
    ones an unread event can have)."""
    pending: tuple[Event, ...]
    """Visible entries read but left out of the page, below it: they belong to earlier pages."""


def walk_back(
    events_desc: Iterable[Event],
    limit: int,
    before: int | None = None,
    resume: TailWalk | None = None,
) -> tuple[list[Event], TailWalk]:
    """:func:`surface_tail`, and where its walk stopped. With ``resume`` (the walk a page before
    position ``before`` left), ``events_desc`` starts at ``resume.next_seq - 1`` instead of the
    view's end and the page is the same as a walk from the end would find. ``limit`` must be
    at least 1."""
    if limit < 1:
        raise ValueError(f"a page holds at least one entry, not {limit}")
    hidden = _Ranges()
    page: list[tuple[int, int, Event]] = []  # a min-heap of (position, seq, event), <= limit
    left: list[Event] = []  # visible entries below the page, for the pages before it

    def offer(event: Event, pos: int) -> None:
        if len(page) < limit:
            heappush(page, (pos, event.seq, event))
        elif (pos, event.seq) > page[0][:2]:
            left.append(heapreplace(page, (pos, event.seq, event))[2])
        else:
            left.append(event)

    next_seq: int | None = None
    if resume is not None:
        for start, stop in resume.hidden:
            hidden.add(start, stop)
        for event in resume.pending:
            offer(event, position(event))
    for event in events_desc:
        seq = event.seq
        if len(page) == limit and hidden.uncovered_at_or_below(seq) < page[0][0]:
            next_seq = seq + 1
            break
        rng = replace_range(event)
        pos = seq if rng is None else rng[0]
        if (
            event.type in SURFACE_TYPES
            and (before is None or pos < before)
            and not hidden.covers(pos)
        ):
            offer(event, pos)
        if rng is not None:
            hidden.add(*rng)
    stopped = 0 if next_seq is None else next_seq
    walk = TailWalk(stopped, hidden.below(stopped), tuple(left))
    return [event for _, _, event in sorted(page, key=lambda entry: entry[:2])], walk


class _Ranges:
    """A union of closed integer ranges, kept as sorted disjoint (start, stop) pairs."""

    __slots__ = ("_starts", "_stops")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []

    def covers(self, value: int) -> bool:
        i = bisect_right(self._starts, value) - 1
        return i >= 0 and self._stops[i] >= value

    def below(self, limit: int) -> tuple[tuple[int, int], ...]:
        """The ranges cut to the integers below ``limit``."""
        return tuple(
            (start, min(stop, limit - 1))
            for start, stop in zip(self._starts, self._stops, strict=True)
            if start < limit
        )

    def uncovered_at_or_below(self, value: int) -> int:
        """The largest integer <= ``value`` in no range (-1 when every one from 0 is covered).
        Ranges are kept merged when they touch, so the one below a covering range is free."""
        i = bisect_right(self._starts, value) - 1
        if i >= 0 and self._stops[i] >= value:
            return self._starts[i] - 1
        return value

    def add(self, start: int, stop: int) -> None:
        starts, stops = self._starts, self._stops
        lo = bisect_left(stops, start - 1)  # the first range ending at or after start - 1
        hi = bisect_right(starts, stop + 1)  # one past the last starting at or before stop + 1
        if lo < hi:
            start, stop = min(start, starts[lo]), max(stop, stops[hi - 1])
        starts[lo:hi] = [start]
        stops[lo:hi] = [stop]


class SurfaceFold:
    """The surface of one session, extended one event at a time.

    ``count`` and ``replace_generation`` are the memo key of SPEC §6: a plain append adds to the
    end in O(1); a replace splices the slice it hides in O(log n + moved). Each surface entry also
    memoizes its projected, serialized Message, so deriving again after nothing changed projects
    nothing.
    """

    __slots__ = ("_events", "_positions", "_projected", "count", "replace_generation", "state")

    def __init__(self) -> None:
        self.count = 0
        self.replace_generation = 0
        self._positions: list[int] = []
        self._events: list[Event] = []
        self._projected: list[bytes | None] = []
        self.state: dict[str, Value] = {}
        """The session's state after ``count`` events (see :func:`fold_state`), folded along."""

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    def add(self, event: Event) -> None:
        """Fold in the next event of the log; its seq must equal ``count``."""
        if event.seq != self.count:
            raise ValueError(f"fold expected seq {self.count}, got {event.seq}")
        self.count += 1
        if event.HasField("state_delta"):
            apply_state_delta(self.state, event.state_delta)
        hide = event.type == HIDE
        if event.type not in SURFACE_TYPES and not hide:
            return
        rng = replace_range(event)
        if rng is None:
            self._positions.append(event.seq)
            self._events.append(event)
            self._projected.append(None)
            return
        self.replace_generation += 1
        start, stop = rng
        lo = bisect_left(self._positions, start)
        hi = bisect_right(self._positions, stop)
        if hide:
            del self._positions[lo:hi], self._events[lo:hi], self._projected[lo:hi]
            return
        self._positions[lo:hi] = [start]
        self._events[lo:hi] = [event]
        self._projected[lo:hi] = [None]

    @property
    def surface(self) -> list[Event]:
        return list(self._events)

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self._events]

    def messages(self) -> list[Message]:
        return [project(e) for e in self._events]

    def tail(self, from_seq: int) -> tuple[list[int], list[bytes]]:
        """Seqs and projected messages of the entries at the end whose seq is at least
        ``from_seq``: every message those events added, when no replace came after them.
        O(entries returned)."""
        events, memo = self._events, self._projected
        start = len(events)
        while start > 0 and events[start - 1].seq >= from_seq:
            start -= 1
        for i in range(start, len(events)):
            if memo[i] is None:
                memo[i] = project(events[i]).SerializeToString(deterministic=True)
        return [e.seq for e in events[start:]], memo[start:]  # type: ignore[return-value]

    def page(self, limit: int, before: int | None = None) -> tuple[list[Event], list[bytes]]:
        """The last ``limit`` entries with position below ``before`` (None: no bound) and their
        serialized Messages: what :func:`surface_tail` returns for the same log, served from
        the memo in O(log n + limit)."""
        end = len(self._events) if before is None else bisect_left(self._positions, before)
        start = max(0, end - limit) if limit > 0 else end
        memo = self._projected
        for i in range(start, end):
            if memo[i] is None:
                memo[i] = project(self._events[i]).SerializeToString(deterministic=True)
        return self._events[start:end], memo[start:end]  # type: ignore[return-value]

    def projected(self) -> list[bytes]:
        """Each surface entry's Message, serialized; projected once per entry and memoized.

        Returns a new list (the entries are shared): the memo keeps changing as events are
        added, and a caller's earlier result must not change with it.
        """
        memo = self._projected
        out: list[bytes] = []
        for i, cached in enumerate(memo):
            if cached is None:
                cached = memo[i] = project(self._events[i]).SerializeToString(deterministic=True)
            out.append(cached)
        return out


# -- session state ------------------------------------------------------------------------------


def apply_state_delta(state: dict[str, Value], delta: Struct) -> None:
    """Merge one state_delta into ``state``: a top-level null deletes the key, any other value
    replaces it whole (shallow, as ADK's state_delta). The values are shared, not copied."""
    fields = delta.fields
    for key in fields:
        value = fields[key]
        if value.WhichOneof("kind") == "null_value":
            state.pop(key, None)
        else:
            state[key] = value


def fold_state(events: Iterable[Event]) -> Struct:
    """The state of a log, folded from scratch: every event's state_delta in seq order.

    Shadowing plays no part: an event a replace hides from the surface still changed the state
    (the state records what happened, the surface what the model sees next).
    """
    state: dict[str, Value] = {}
    for event in events:
        if event.HasField("state_delta"):
            apply_state_delta(state, event.state_delta)
    return state_struct(state)


def state_struct(state: dict[str, Value]) -> Struct:
    """A Struct of its own holding ``state`` (serialize it deterministically: map order)."""
    out = Struct()
    fields = out.fields
    for key, value in state.items():
        fields[key].CopyFrom(value)
    return out


# -- usage ledger -------------------------------------------------------------------------------

MAX_USAGE_TOKENS = (1 << 32) - 1
"""The largest token count one event's usage may report (per field): far above any call, and
small enough that a session's sums stay within the u64 they are stored as."""
MAX_MODEL_BYTES = 256


def usage_problem(usage: Usage) -> tuple[str, str] | None:
    """(field, what is wrong with it) for a usage the ledger refuses, or None.

    The model is required (totals are kept per model; an unnamed model would pool unrelated
    calls), with no control characters. Cached tokens are part of the input and reasoning tokens
    part of the output, so neither may exceed its whole.
    """
    model = usage.model
    size = len(model.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_MODEL_BYTES:
        return "model", f"must be 1 to {MAX_MODEL_BYTES} bytes of UTF-8; it has {size}"
    if any(unicodedata.category(ch) == "Cc" for ch in model):
        return "model", "must not contain control characters"
    for name in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"):
        count = getattr(usage, name)
        if count > MAX_USAGE_TOKENS:
            return name, f"is {count}, over the limit of {MAX_USAGE_TOKENS} per event"
    if usage.cached_input_tokens > usage.input_tokens:
        return "cached_input_tokens", (
            f"is {usage.cached_input_tokens}, more than input_tokens ({usage.input_tokens}); "
            "cached tokens are counted within the input"
        )
    if usage.reasoning_tokens > usage.output_tokens:
        return "reasoning_tokens", (
            f"is {usage.reasoning_tokens}, more than output_tokens ({usage.output_tokens}); "
            "reasoning tokens are counted within the output"
        )
    return None


@dataclass(slots=True)
class ModelTotals:
    """The sums of the usages that named one model, and how many events carried one."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    event_count: int = 0

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_input_tokens += usage.cached_input_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.event_count += 1

    def plus(self, other: ModelTotals) -> ModelTotals:
        # Field by field, not a zip over values(): this runs in every append that carries usage.
        return ModelTotals(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.event_count + other.event_count,
        )

    def minus(self, other: ModelTotals) -> ModelTotals:
        return ModelTotals(*(a - b for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> tuple[int, int, int, int, int]:
        return (
            self.input_tokens,
            self.output_tokens,
            self.cached_input_tokens,
            self.reasoning_tokens,
            self.event_count,
        )


UsageByModel = dict[str, ModelTotals]
"""Totals keyed by model name."""


def fold_usage(events: Iterable[Event], start_seq: int = 0) -> UsageByModel:
    """The usage totals of a log: every event's usage summed per model, in seq order.

    Shadowing plays no part (tokens spent stay spent, whatever a replace or hide later does to
    the surface), so a compaction never lowers a total. Events with seq < ``start_seq`` are
    skipped: a fork's own usage starts at its parent_event_count.
    """
    totals: UsageByModel = {}
    for event in events:
        if event.seq >= start_seq and event.HasField("usage"):
            usage = event.usage
            totals.setdefault(usage.model, ModelTotals()).add(usage)
    return totals


def sum_usage(parts: Iterable[UsageByModel]) -> UsageByModel:
    """Several totals added model by model (a listing's page, a session tree)."""
    out: UsageByModel = {}
    for part in parts:
        for model, totals in part.items():
            mine = out.get(model)
            out[model] = totals.plus(ModelTotals()) if mine is None else mine.plus(totals)
    return out


def own_usage(totals: UsageByModel, inherited: UsageByModel) -> UsageByModel:
    """A fork's own usage: its totals less what it copied from its parent (models left with
    nothing of their own are dropped)."""
    out: UsageByModel = {}
    for model, whole in totals.items():
        copied = inherited.get(model)
        own = whole if copied is None else whole.minus(copied)
        if own.event_count:
            out[model] = own
    return out


def tree_usage(root: UsageByModel, descendants_own: Iterable[UsageByModel]) -> UsageByModel:
    """A session tree's usage: the root's whole totals plus each descendant's own usage.

    Each descendant counts only what it spent itself (``own_usage``): the events a fork copied
    were spent by an ancestor in the tree, which already counts them, so nothing is counted
    twice. Takes the descendants' usages, however they were found (fork children by
    parent_session_id today, sub-agent links later).
    """
    return sum_usage([root, *descendants_own])


# -- projection (SPEC §5) -----------------------------------------------------------------------


REDACTED_MARK = "redacted"
"""The metadata key (true) of a message projected from a redacted event (RedactEvents)."""


def project(event: Event) -> Message:
    """The message a surface event shows the model, field for field from its data."""
    message = Message(role=ROLE_OF_TYPE[event.type])
    if event.HasField("time"):  # stored events always have one; seeding relies on absent -> absent
        message.created_at.CopyFrom(event.time)
    fields = event.data.fields
    for key in STRING_FIELDS:
        if key in fields and fields[key].WhichOneof("kind") == "string_value":
            setattr(message, key, fields[key].string_value)
    if "tool_calls" in fields:
        message.tool_calls.extend(v.struct_value for v in fields["tool_calls"].list_value.values)
    if "metadata" in fields:
        message.metadata.CopyFrom(fields["metadata"].struct_value)
    if event.HasField("redacted"):  # its data is gone: say so, or it reads as an empty message
        message.metadata.update({REDACTED_MARK: True})
    return message


def derive_messages(events: Iterable[Event]) -> list[Message]:
    """The messages of a log, folded from scratch."""
    return [project(e) for e in fold_surface(events)]


def event_from_message(message: Message) -> Event | None:
    """The surface event that seeds a message (SPEC §5 Seed), or None for an unknown role.

    The event's time is the message's created_at, so seeding then deriving is lossless.
    """
    type_ = TYPE_OF_ROLE.get(message.role)
    if type_ is None:
        return None
    event = Event(type=type_)
    if message.HasField("created_at"):
        event.time.CopyFrom(message.created_at)
    fields = event.data.fields
    for key in STRING_FIELDS:
        if message.HasField(key):
            fields[key].string_value = getattr(message, key)
    if message.tool_calls:
        calls = fields["tool_calls"].list_value
        for call in message.tool_calls:
            calls.values.add().struct_value.CopyFrom(call)
    if message.HasField("metadata"):
        fields["metadata"].struct_value.CopyFrom(message.metadata)
    return event
