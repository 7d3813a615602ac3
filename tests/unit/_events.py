"""Small builders for the Events the unit tests feed the fold.

Events are built the way a client would send them (seq 0) unless a seq is given; `log` numbers a
list of events 0, 1, 2, ... the way the writer would store them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sessionlog import errors
from sessionlog.fold import DEFAULT_LIMITS, Limits, admit, check_event
from sessionlog.v1.event_pb2 import Event, EventType

SYSTEM = EventType.EVENT_TYPE_SYSTEM_MESSAGE
USER = EventType.EVENT_TYPE_USER_MESSAGE
ASSISTANT = EventType.EVENT_TYPE_ASSISTANT_MESSAGE
TOOL_RESULT = EventType.EVENT_TYPE_TOOL_RESULT
TOOL_CALL = EventType.EVENT_TYPE_TOOL_CALL
TURN_START = EventType.EVENT_TYPE_TURN_START
TURN_END = EventType.EVENT_TYPE_TURN_END
STEP_START = EventType.EVENT_TYPE_STEP_START
STEP_END = EventType.EVENT_TYPE_STEP_END
REQUEST_HEADER = EventType.EVENT_TYPE_REQUEST_HEADER
HIDE = EventType.EVENT_TYPE_HIDE

SURFACE = (SYSTEM, USER, ASSISTANT, TOOL_RESULT)
BOOKKEEPING = (TOOL_CALL, TURN_START, TURN_END, STEP_START, STEP_END, REQUEST_HEADER)


def ev(
    type_: int = USER,
    data: Mapping[str, Any] | None = None,
    *,
    seq: int = 0,
    replace: tuple[int, int] | None = None,
    append_op: bool = False,
) -> Event:
    """One event; `replace=(start, stop)` sets a replace op, `append_op` an explicit append."""
    event = Event(seq=seq, type=type_)  # type: ignore[arg-type]  # tests also send unknown types
    if data:
        event.data.update(dict(data))
    if replace is not None:
        event.surface_op.replace.start_seq, event.surface_op.replace.stop_seq = replace
    elif append_op:
        event.surface_op.append.SetInParent()
    return event


def text(content: str, type_: int = USER, *, replace: tuple[int, int] | None = None) -> Event:
    """A surface event whose data is just {"content": content}."""
    return ev(type_, {"content": content}, replace=replace)


def log(events: Iterable[Event]) -> list[Event]:
    """The events numbered as the writer stores them: the n-th gets seq n."""
    numbered = []
    for seq, event in enumerate(events):
        copy = Event()
        copy.CopyFrom(event)
        copy.seq = seq
        numbered.append(copy)
    return numbered


def contents(events: Iterable[Event]) -> list[str]:
    """The data.content of each event, in order."""
    return [e.data.fields["content"].string_value for e in events]


def nested(depth: int, *, use_lists: bool = False) -> dict[str, object]:
    """A data object whose nesting is exactly `depth` levels, data itself being level 1."""
    inner: object = {} if not use_lists else []
    for _ in range(depth - 2):
        inner = [inner] if use_lists else {"k": inner}
    return {"k": inner} if depth > 1 else {}


def strict_error(
    events: Sequence[Event], next_seq: int = 0, limits: Limits = DEFAULT_LIMITS
) -> errors.SessionLogError | None:
    """The error a strict append of `events` at `next_seq` fails with, or None if it passes."""
    pre = [check_event(e, i, limits) for i, e in enumerate(events)]
    try:
        admit(events, pre, next_seq, lenient=False)
    except errors.SessionLogError as failure:
        return failure
    return None


def lenient(
    events: Sequence[Event], next_seq: int = 0, limits: Limits = DEFAULT_LIMITS
) -> tuple[list[int], list[tuple[int, str]]]:
    """The kept indices and the (index, reason) drops of a lenient append at `next_seq`."""
    pre = [check_event(e, i, limits) for i, e in enumerate(events)]
    kept, drops = admit(events, pre, next_seq, lenient=True)
    return kept, [(i, err.reason) for i, err in drops]
