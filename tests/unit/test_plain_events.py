"""The plain-event paths of ``prepare_append`` (an event holding only a type and data, checked by
its data alone and stamped in its bytes; a batch of them vouched for in bulk by
``fold.doubtful_events``) give every event the verdict, bytes and replace range the full check
gives it, whatever the event holds."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.struct_pb2 import Value
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog import fold, mirrors, wire
from sessionlog.storage import preparing
from sessionlog.storage.preparing import prepare_append
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import BOOKKEEPING, HIDE, SURFACE, USER, ev, nested

NOW_NS = 1_767_225_600_123_456_789
LIMITS = fold.Limits(max_event_bytes=400, max_data_depth=4)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=12),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
data_keys = st.sampled_from(["content", "name", "tool_calls", "metadata", "other"])


@st.composite
def events(draw: st.DrawFn) -> Event:
    """An event as a client might send it: any type (unknown ones too), any data, and now and
    then each other field an event may carry."""
    event_type = draw(st.sampled_from([*SURFACE, *BOOKKEEPING, HIDE, 0, 99, 300]))
    data = draw(st.dictionaries(data_keys, json_values, max_size=3))
    event = ev(event_type, data)
    if draw(st.booleans()) and not data:
        event.data.SetInParent()  # an empty data present
    extra = draw(
        st.sampled_from(["", "", "", "seq", "time", "replace", "append", "usage", "delta", "red"])
    )
    if extra == "seq":
        event.seq = draw(st.integers(min_value=1, max_value=2**40))
    elif extra == "time":
        event.time.FromNanoseconds(draw(st.integers(min_value=0, max_value=NOW_NS)))
    elif extra == "replace":
        start = draw(st.integers(min_value=0, max_value=9))
        event.surface_op.replace.start_seq = start
        event.surface_op.replace.stop_seq = draw(st.integers(min_value=0, max_value=12))
    elif extra == "append":
        event.surface_op.append.SetInParent()
    elif extra == "usage":
        event.usage.input_tokens = draw(st.integers(min_value=0, max_value=10))
    elif extra == "delta":
        event.state_delta.update({"k": draw(json_values)})
    elif extra == "red":
        event.redacted.reason = "gone"
    return event


def _reference(batch: list[Event], keep_redacted: bool) -> list[tuple[object, ...]]:
    """Each event through the full check, as every event went before the plain path."""
    time_field = wire.event_time_field(NOW_NS)
    out: list[tuple[object, ...]] = []
    for index, original in enumerate(batch):
        event, violation, body = preparing._checked(
            original, index, LIMITS, NOW_NS, time_field, keep_redacted
        )
        verdict = None if violation is None else (violation.rule, violation.error.reason)
        message = None if violation is None else (str(violation.error), violation.error.metadata)
        out.append((verdict, message, b"" if violation else body, fold.replace_range(event)))
    return out


def _outcomes(prepared: Any) -> list[tuple[Any, ...]]:
    """Each event's verdict (rule and reason; message and metadata), stored bytes and replace
    range, as a prepared append holds them."""
    return [
        (
            None if v is None else (v.rule, v.error.reason),
            None if v is None else (str(v.error), v.error.metadata),
            body,
            rng,
        )
        for v, body, rng in zip(
            prepared.prechecked, prepared.bodies, prepared.replaces, strict=True
        )
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(events(), max_size=6), st.booleans())
def test_plain_path_agrees_with_the_full_check(batch: list[Event], keep_redacted: bool) -> None:
    """Verdicts (rule, reason and message), stored bytes and replace ranges match the full
    check's for every event, plain or not, and the caller's events are left unchanged."""
    before = [event.SerializeToString() for event in batch]
    prepared = prepare_append("s", batch, limits=LIMITS, now_ns=NOW_NS, keep_redacted=keep_redacted)
    got = _outcomes(prepared)
    assert got == _reference(batch, keep_redacted)
    assert [event.SerializeToString() for event in batch] == before


# -- a batch vouched for in bulk (fold.doubtful_events) -------------------------------------------

MARKERS = ["metadata", "tool_calls", "\x12\x00", "a\x12\x00b", "\x12", ""]
"""Strings whose bytes are those the bulk check looks for, or close to them."""
plain_values = st.one_of(st.none(), st.text(max_size=8), st.sampled_from(MARKERS))
plain_keys = st.one_of(
    st.sampled_from(["content", "name", "tool_call_id", "tool_calls", "metadata", "", "x"]),
    st.text(max_size=4),
)
DEVIATIONS = ["number", "nan", "bool", "object", "list", "no kind", "time", "seq", "usage", "red"]


@st.composite
def mostly_plain_events(draw: st.DrawFn) -> Event:
    """An event a client mostly sends: a type and data of strings and nulls; now and then an
    unknown or HIDE type, long data, or one thing a plain event may not hold."""
    event_type = draw(st.sampled_from([*SURFACE, *BOOKKEEPING, *SURFACE, HIDE, 0, 99, 300]))
    event = ev(event_type, draw(st.dictionaries(plain_keys, plain_values, max_size=4)))
    if draw(st.integers(0, 9)) == 0:
        event.data.fields["long"].string_value = "y" * draw(st.integers(340, 400))
    if draw(st.integers(0, 3)) == 0:
        deviation, key = draw(st.sampled_from(DEVIATIONS)), draw(plain_keys)
        value = event.data.fields[key]
        if deviation == "number":
            value.number_value = 1.5
        elif deviation == "nan":
            value.number_value = math.nan
        elif deviation == "bool":
            value.bool_value = True
        elif deviation == "object":
            value.struct_value.update({"a": "b"})
        elif deviation == "list":
            value.list_value.append("a")
        elif deviation == "no kind":
            value.CopyFrom(Value())
        elif deviation == "time":
            event.time.FromNanoseconds(NOW_NS - 1)
        elif deviation == "seq":
            event.seq = 3
        elif deviation == "usage":
            event.usage.output_tokens = 2
        else:
            event.redacted.reason = "gone"
    return event


def _is_simply_plain(event: Event) -> bool:
    """A plain event the bulk check must vouch for: a plain type, data of strings and nulls
    with none of the bytes it looks for, and room for the time under the size limit."""
    body = event.SerializeToString()
    fields = event.data.fields
    return (
        event.type in fold.PLAIN_TYPES
        and wire.plain_event_type(body) == event.type
        and all(fields[key].WhichOneof("kind") in ("string_value", "null_value") for key in fields)
        and not any(marker in body for marker in (b"metadata", b"tool_calls", b"\x12\x00"))
        and len(body) + len(wire.event_time_field(NOW_NS)) <= LIMITS.max_event_bytes
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(mostly_plain_events(), max_size=40), st.booleans())
def test_bulk_check_agrees_with_the_full_check(batch: list[Event], lenient: bool) -> None:
    """Batches of mostly plain events: every event's verdict, message, stored bytes and replace
    range are the full check's; the bulk check doubts every event the full check refuses and
    none of the simply plain ones (so the bulk path is the one these batches take)."""
    prepared = prepare_append("s", batch, limits=LIMITS, now_ns=NOW_NS, lenient=lenient)
    got = _outcomes(prepared)
    reference = _reference(batch, keep_redacted=False)
    assert got == reference
    serialized = [event.SerializeToString() for event in batch]
    extra = len(wire.event_time_field(NOW_NS))
    doubtful = set(fold.doubtful_events(serialized, LIMITS, extra))
    refused = {index for index, outcome in enumerate(reference) if outcome[0] is not None}
    assert refused <= doubtful
    assert not any(_is_simply_plain(batch[index]) for index in doubtful)
    assert prepared.spending == [i for i, event in enumerate(batch) if event.HasField("usage")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(events(), mostly_plain_events()), max_size=8), st.text(max_size=5))
def test_event_bodies_are_each_events_own_bytes(batch: list[Event], title: str) -> None:
    """``mirrors.event_bodies`` takes from a request serialized whole the bytes each event's own
    ``SerializeToString`` gives (data of several keys, in whatever order the runtime writes
    them, too), and ``prepare_append`` given them prepares what it prepares without them."""
    request = pb.AppendRequest(session_id="s", events=batch, request_id="r", title=title)
    bodies = mirrors.event_bodies(request)
    assert bodies == [event.SerializeToString() for event in request.events]
    given_bodies = prepare_append("s", request.events, now_ns=NOW_NS, serialized=bodies)
    serialized_here = prepare_append("s", request.events, now_ns=NOW_NS)
    for name in ("prechecked", "bodies", "replaces", "spending"):
        got, expected = getattr(given_bodies, name), getattr(serialized_here, name)
        if name == "prechecked":
            got = [None if v is None else (v.rule, str(v.error)) for v in got]
            expected = [None if v is None else (v.rule, str(v.error)) for v in expected]
        assert list(got) == list(expected), name


def test_bulk_check_doubts_what_a_plain_event_cannot_hold() -> None:
    """One event of each kind a plain event may not be, among plain ones: each is doubted
    alone, and each refused one keeps the full check's reason."""
    plain = ev(USER, {"content": "fine", "name": None})
    no_kind = ev(USER, {"content": "x"})
    no_kind.data.fields["k"].CopyFrom(Value())
    timed = ev(USER, {"content": "x"})
    timed.time.FromNanoseconds(NOW_NS)
    deviants = {
        1: ev(USER, {"content": "x", "n": 2}),
        3: no_kind,
        5: ev(USER, {"metadata": "not an object"}),
        7: ev(USER, {"content": "x" * 395}),
        9: ev(HIDE, {"content": "x"}),
        11: timed,
        13: ev(USER, {"content": "says metadata"}),
    }
    batch = [deviants.get(index, plain) for index in range(15)]
    serialized = [event.SerializeToString() for event in batch]
    extra = len(wire.event_time_field(NOW_NS))
    assert fold.doubtful_events(serialized, LIMITS, extra) == sorted(deviants)
    prepared = prepare_append("s", batch, limits=LIMITS, now_ns=NOW_NS)
    reasons = {i: v.error.reason for i, v in enumerate(prepared.prechecked) if v is not None}
    assert reasons == {
        3: "UNSERIALIZABLE_EVENT_DATA",
        5: "INVALID_MESSAGE_FIELD",
        7: "EVENT_TOO_LARGE",
        9: "INVALID_SURFACE_OP",
    }
    assert fold.doubtful_events(serialized, fold.Limits(max_data_depth=0), extra) == list(range(15))


def test_plain_event_stored_bytes_are_the_stamped_events() -> None:
    """A plain event's stored bytes parse back to the event with the server's time set."""
    event = ev(USER, {"content": "hi", "n": 3})
    prepared = prepare_append("s", [event, ev(BOOKKEEPING[0])], now_ns=NOW_NS)
    for original, body in zip([event, ev(BOOKKEEPING[0])], prepared.bodies, strict=True):
        stored = Event.FromString(body)
        assert stored.time.ToNanoseconds() == NOW_NS
        stored.ClearField("time")
        assert stored == original


def test_plain_event_refusals_keep_their_reasons() -> None:
    """Plain events that break a data rule are refused with the rule's reason and index."""
    batch = [
        ev(USER, {"content": "fine"}),
        ev(USER, {"content": 5}),
        ev(USER, {"x": math.nan}),
        ev(USER, nested(6)),
        ev(USER, {"content": "x" * 500}),
    ]
    prepared = prepare_append("s", batch, limits=LIMITS, now_ns=NOW_NS)
    reasons = [
        None if v is None else (v.error.reason, v.error.metadata["index"])
        for v in prepared.prechecked
    ]
    assert reasons == [
        None,
        ("INVALID_MESSAGE_FIELD", "1"),
        ("UNSERIALIZABLE_EVENT_DATA", "2"),
        ("UNSERIALIZABLE_EVENT_DATA", "3"),
        ("EVENT_TOO_LARGE", "4"),
    ]
    assert prepared.bodies[1:] == [b""] * 4


def test_plain_event_type_reads_only_a_type_and_data() -> None:
    """``wire.plain_event_type``: a type alone or with data is plain; any other field, a type
    of two varint bytes, or bytes that end early or run past the data are not."""
    assert wire.plain_event_type(ev(USER).SerializeToString()) == USER
    assert wire.plain_event_type(ev(USER, {"c": "x" * 300}).SerializeToString()) == USER
    for other in (ev(USER, seq=1), ev(300), ev(0, {"c": "x"}), ev(USER, append_op=True)):
        assert wire.plain_event_type(other.SerializeToString()) == 0
    timed = ev(USER)
    timed.time.FromNanoseconds(NOW_NS)
    assert wire.plain_event_type(timed.SerializeToString()) == 0
    plain = ev(USER, {"c": "x"}).SerializeToString()
    assert wire.plain_event_type(plain[:-1]) == 0
    assert wire.plain_event_type(plain + b"\x08\x01") == 0
    assert wire.plain_event_type(plain[:3]) == 0
    assert wire.plain_event_type(b"") == 0


@given(
    st.integers(min_value=0, max_value=2**40),
    st.lists(st.binary(max_size=4), max_size=300),
)
def test_with_seqs_matches_with_seq(first_seq: int, bodies: list[bytes]) -> None:
    """``wire.with_seqs`` gives each event the bytes ``with_seq`` gives it, across the varint
    lengths' edges too."""
    expected = [wire.with_seq(first_seq + i, body) for i, body in enumerate(bodies)]
    assert wire.with_seqs(first_seq, bodies) == expected


@given(st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2**21 - 1, 2**35]), st.integers(1, 300))
def test_with_seqs_across_varint_edges(first_seq: int, count: int) -> None:
    """Runs that start at or cross a varint length's edge come out as ``with_seq``'s."""
    bodies = [bytes((n % 256,)) for n in range(count)]
    expected = [wire.with_seq(first_seq + i, body) for i, body in enumerate(bodies)]
    assert wire.with_seqs(first_seq, bodies) == expected
