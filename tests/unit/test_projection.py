"""SPEC §5: projecting surface events to chat messages, seeding, and the memoized projection."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog.fold import (
    SurfaceFold,
    check_event,
    derive_messages,
    event_from_message,
    fold_surface,
    project,
)
from sessionlog.v1.event_pb2 import Event
from sessionlog.v1.message_pb2 import Message, Role
from tests.unit._events import (
    ASSISTANT,
    BOOKKEEPING,
    SYSTEM,
    TOOL_RESULT,
    USER,
    ev,
    log,
    text,
)

ROLES = [
    (SYSTEM, Role.ROLE_SYSTEM),
    (USER, Role.ROLE_USER),
    (ASSISTANT, Role.ROLE_ASSISTANT),
    (TOOL_RESULT, Role.ROLE_TOOL),
]
STRING_FIELDS = ("content", "reasoning_content", "tool_call_id", "name")


def struct(value: dict[str, Any]) -> Struct:
    out = Struct()
    out.update(value)
    return out


def timed(event: Event, seconds: int = 1_700_000_000, nanos: int = 0) -> Event:
    event.time.seconds = seconds
    event.time.nanos = nanos
    return event


@pytest.mark.parametrize(("type_", "role"), ROLES)
def test_each_surface_type_projects_to_its_role(type_: int, role: int) -> None:
    """System, user and assistant keep their role; a tool result becomes ROLE_TOOL."""
    assert project(timed(text("x", type_))).role == role


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_bookkeeping_events_project_to_nothing(type_: int) -> None:
    """derive_messages skips bookkeeping events entirely."""
    events = log([text("a"), ev(type_, {"content": "hidden"}), text("b", ASSISTANT)])
    assert [m.content for m in derive_messages(events)] == ["a", "b"]


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_string_fields_are_copied(field: str) -> None:
    """Each of the four string fields is copied from data, the empty string included."""
    for value in ("hello", ""):
        message = project(timed(ev(ASSISTANT, {field: value})))
        assert message.HasField(field)
        assert getattr(message, field) == value


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_absent_or_null_string_field_stays_absent(field: str) -> None:
    """A missing key and a null value both leave the field unset (which "" does not)."""
    for data in ({}, {field: None}):
        message = project(timed(ev(TOOL_RESULT, data)))
        assert not message.HasField(field)


def test_tool_calls_and_metadata_default_to_empty() -> None:
    """Without tool_calls or metadata in data, the message has none."""
    message = project(timed(ev(ASSISTANT, {"content": "hi"})))
    assert list(message.tool_calls) == []
    assert not message.HasField("metadata")
    assert message.metadata == Struct()


def test_tool_calls_and_metadata_are_copied() -> None:
    """tool_calls (opaque objects, in order) and metadata are copied as they are."""
    calls: list[dict[str, Any]] = [
        {"id": "c1", "function": {"name": "ls", "arguments": "{}"}},
        {"id": "c2"},
    ]
    meta = {"content_parts": [{"type": "text", "text": "hi"}], "n": 1.5, "z": None}
    message = project(timed(ev(ASSISTANT, {"tool_calls": calls, "metadata": meta})))
    assert list(message.tool_calls) == [struct(c) for c in calls]
    assert message.metadata == struct(meta)


def test_created_at_is_the_event_time() -> None:
    """created_at is copied from the event's time, nanoseconds included."""
    message = project(timed(text("x"), seconds=1_234_567_890, nanos=123_456_789))
    assert message.created_at == Timestamp(seconds=1_234_567_890, nanos=123_456_789)


def test_other_keys_never_reach_the_message() -> None:
    """Keys other than the projected ones are dropped: the message holds only projected fields."""
    data = {"content": "x", "role": "system", "extra": {"a": 1}, "created_at": "2020", "seq": 3}
    message = project(timed(ev(USER, data)))
    expected = Message(role=Role.ROLE_USER, content="x")
    expected.created_at.CopyFrom(Timestamp(seconds=1_700_000_000))
    assert message == expected
    assert message.role == Role.ROLE_USER


def test_empty_assistant_message_still_projects() -> None:
    """An assistant event with no content and no tool calls is not filtered out."""
    events = log([text("q"), ev(ASSISTANT), ev(ASSISTANT, {"content": ""})])
    messages = derive_messages(events)
    assert [m.role for m in messages] == [Role.ROLE_USER, Role.ROLE_ASSISTANT, Role.ROLE_ASSISTANT]
    assert not messages[1].HasField("content")
    assert messages[2].HasField("content")
    assert messages[2].content == ""


def test_derive_messages_follows_the_surface() -> None:
    """derive_messages projects the folded surface, replacements in place."""
    events = log([text("sys", SYSTEM), text("a"), text("b"), text("sum", SYSTEM, replace=(1, 1))])
    assert [m.content for m in derive_messages(events)] == ["sys", "sum", "b"]


# -- seeding --------------------------------------------------------------------------------------


def full_message() -> Message:
    message = Message(
        role=Role.ROLE_ASSISTANT,
        content="answer",
        reasoning_content="because",
        tool_call_id="",
        name="bot",
    )
    message.tool_calls.add().update({"id": "c1", "args": {"path": "/tmp", "n": [1, 2]}})
    message.tool_calls.add().update({})
    message.metadata.update({"content_parts": [{"type": "text"}], "flag": True})
    message.created_at.CopyFrom(Timestamp(seconds=1_712_345_678, nanos=987_654_321))
    return message


@pytest.mark.parametrize(
    "message",
    [
        full_message(),
        Message(role=Role.ROLE_USER, content="hi", created_at=Timestamp(seconds=5, nanos=1000)),
        Message(role=Role.ROLE_USER, content="", created_at=Timestamp(seconds=5)),
        Message(role=Role.ROLE_TOOL, tool_call_id="c1", created_at=Timestamp(seconds=1, nanos=1)),
        Message(role=Role.ROLE_SYSTEM, created_at=Timestamp(seconds=-5, nanos=999_999_999)),
        Message(role=Role.ROLE_ASSISTANT, metadata=Struct(), created_at=Timestamp(seconds=9)),
        Message(role=Role.ROLE_USER),
    ],
)
def test_seed_then_project_round_trips(message: Message) -> None:
    """event_from_message then project gives back the message exactly, presence included."""
    event = event_from_message(message)
    assert event is not None
    back = project(event)
    assert back == message
    assert back.SerializeToString(deterministic=True) == message.SerializeToString(
        deterministic=True
    )
    for field in (*STRING_FIELDS, "metadata", "created_at"):
        assert back.HasField(field) == message.HasField(field)


def test_seeded_event_is_a_valid_append() -> None:
    """The event built from a message passes validation and carries the message time."""
    event = event_from_message(full_message())
    assert event is not None
    assert check_event(event, 0) is None
    assert event.type == ASSISTANT
    assert event.time == Timestamp(seconds=1_712_345_678, nanos=987_654_321)


@pytest.mark.parametrize("role", [Role.ROLE_UNSPECIFIED, 9])
def test_unknown_role_seeds_nothing(role: int) -> None:
    """A message of unspecified or unknown role maps to no event."""
    assert event_from_message(Message(role=role, content="x")) is None  # type: ignore[arg-type]


def test_seed_then_derive_returns_the_messages() -> None:
    """Seeding a conversation and folding it gives back every message in order."""
    messages = [
        Message(role=Role.ROLE_SYSTEM, content="be brief", created_at=Timestamp(seconds=1)),
        Message(role=Role.ROLE_USER, content="hi", created_at=Timestamp(seconds=2, nanos=5)),
        full_message(),
        Message(role=Role.ROLE_TOOL, content="ok", tool_call_id="c1", name="ls"),
    ]
    events = [event_from_message(m) for m in messages]
    assert all(e is not None for e in events)
    assert derive_messages(log(e for e in events if e is not None)) == messages


# -- the memoized projection ----------------------------------------------------------------------


def sample_log() -> list[Event]:
    return log(
        timed(e, seconds=100 + i)
        for i, e in enumerate(
            [
                text("sys", SYSTEM),
                text("a"),
                ev(ASSISTANT, {"tool_calls": [{"id": "c"}]}),
                text("r", TOOL_RESULT),
                text("sum", SYSTEM, replace=(1, 3)),
                text("b"),
            ]
        )
    )


def test_projected_equals_a_fresh_projection() -> None:
    """SurfaceFold.projected() is the serialized projection of the reference surface."""
    memo = SurfaceFold()
    events = sample_log()
    for i, event in enumerate(events, start=1):
        memo.add(event)
        fresh = [project(e).SerializeToString() for e in fold_surface(events[:i])]
        assert memo.projected() == fresh
        assert memo.messages() == [project(e) for e in fold_surface(events[:i])]


def test_projected_is_memoized() -> None:
    """A second call with nothing new returns the very same bytes objects."""
    memo = SurfaceFold()
    memo.extend(sample_log())
    first = memo.projected()
    second = memo.projected()
    assert len(first) == 3
    assert all(a is b for a, b in zip(first, second, strict=True))


def test_projected_keeps_entries_an_append_does_not_touch() -> None:
    """After a plain append, the earlier entries are reused; only the new one is projected."""
    memo = SurfaceFold()
    events = sample_log()
    memo.extend(events)
    before = memo.projected()
    memo.add(timed(ev(USER, {"content": "c"}, seq=6), seconds=200))
    assert memo.count == 7
    after = memo.projected()
    assert len(after) == len(before) + 1
    assert all(a is b for a, b in zip(before, after[:-1], strict=False))


def test_projected_result_is_not_changed_by_a_later_add() -> None:
    """A list returned by projected() is a snapshot: folding more events does not alter it."""
    memo = SurfaceFold()
    events = sample_log()
    memo.extend(events[:4])
    snapshot = memo.projected()
    copy = list(snapshot)
    memo.extend(events[4:])
    assert snapshot == copy
    assert all(isinstance(item, bytes) for item in snapshot)
