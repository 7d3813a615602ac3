"""SPEC §3: the per-event rules of an append, in order, strict and lenient."""

from __future__ import annotations

import math

import pytest

from sessionlog import errors
from sessionlog.fold import Limits, admit, check_event
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import (
    ASSISTANT,
    BOOKKEEPING,
    SURFACE,
    SYSTEM,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_START,
    USER,
    ev,
    lenient,
    nested,
    strict_error,
)


def reason_of(*events: Event, next_seq: int = 0, limits: Limits | None = None) -> str | None:
    """The reason a strict append of `events` fails with, or None when it passes."""
    failure = strict_error(events, next_seq, limits) if limits else strict_error(events, next_seq)
    return None if failure is None else failure.reason


# -- rule 1: type ---------------------------------------------------------------------------------


@pytest.mark.parametrize("type_", [0, 12, 99])
def test_unknown_or_unspecified_type_is_rejected(type_: int) -> None:
    """An unspecified or out-of-enum type fails with UNKNOWN_EVENT_TYPE."""
    assert reason_of(ev(type_)) == "UNKNOWN_EVENT_TYPE"


@pytest.mark.parametrize("type_", [*SURFACE, *BOOKKEEPING])
def test_every_known_type_is_accepted(type_: int) -> None:
    """All ten event types pass validation when nothing else is wrong."""
    assert reason_of(ev(type_)) is None


def test_unknown_type_wins_over_every_later_rule() -> None:
    """An event breaking rules 1, 4, 5 and 6 at once reports rule 1."""
    event = ev(0, {"content": 5, "x": math.nan}, seq=7, replace=(3, 1))
    violation = check_event(event, 0)
    assert violation is not None
    assert violation.rule == 1
    assert reason_of(event) == "UNKNOWN_EVENT_TYPE"


def test_unknown_type_wins_over_a_bad_message_field() -> None:
    """Rules 1 and 5 broken together report UNKNOWN_EVENT_TYPE."""
    assert reason_of(ev(0, {"metadata": "nope"})) == "UNKNOWN_EVENT_TYPE"


# -- rule 2: surface op on a bookkeeping type -----------------------------------------------------


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_replace_on_bookkeeping_type_is_rejected(type_: int) -> None:
    """A bookkeeping event carrying a replace fails with SURFACE_OP_ON_NON_SURFACE_EVENT."""
    assert reason_of(ev(type_, replace=(0, 0))) == "SURFACE_OP_ON_NON_SURFACE_EVENT"


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_explicit_append_on_bookkeeping_type_is_rejected(type_: int) -> None:
    """Even an explicit `append` op on a bookkeeping event is rejected."""
    assert reason_of(ev(type_, append_op=True)) == "SURFACE_OP_ON_NON_SURFACE_EVENT"


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_surface_op_with_no_kind_counts_as_unset(type_: int) -> None:
    """A present surface_op with neither kind set is allowed on a bookkeeping event."""
    event = ev(type_)
    event.surface_op.SetInParent()
    assert event.HasField("surface_op")
    assert reason_of(event) is None


@pytest.mark.parametrize("type_", SURFACE)
def test_explicit_append_on_surface_type_is_fine(type_: int) -> None:
    """Surface events may carry an explicit append op."""
    assert reason_of(ev(type_, append_op=True)) is None


def test_surface_op_on_bookkeeping_wins_over_a_bad_range() -> None:
    """A bookkeeping replace with start > stop reports rule 2, not rule 3."""
    assert reason_of(ev(TURN_START, replace=(4, 1))) == "SURFACE_OP_ON_NON_SURFACE_EVENT"


def test_surface_op_on_bookkeeping_wins_over_a_future_start() -> None:
    """A bookkeeping replace pointing at the future reports rule 2, not rule 3."""
    assert reason_of(ev(TOOL_CALL, replace=(9, 9))) == "SURFACE_OP_ON_NON_SURFACE_EVENT"


def test_surface_op_on_bookkeeping_wins_over_a_nonzero_seq() -> None:
    """Rules 2 and 6 broken together report rule 2."""
    assert reason_of(ev(TOOL_CALL, seq=3, append_op=True)) == "SURFACE_OP_ON_NON_SURFACE_EVENT"


# -- rule 3: replace range ------------------------------------------------------------------------


def test_replace_with_start_after_stop_is_rejected() -> None:
    """A replace with start_seq > stop_seq fails with INVALID_SURFACE_OP."""
    failure = strict_error([ev(USER, replace=(2, 1))], next_seq=10)
    assert isinstance(failure, errors.InvalidSurfaceOp)
    assert failure.metadata["index"] == "0"


def test_replace_with_start_equal_stop_is_fine() -> None:
    """A one-position range [n, n] is valid."""
    assert reason_of(ev(USER, replace=(3, 3)), next_seq=10) is None


def test_replace_pointing_at_the_future_is_rejected() -> None:
    """A replace whose start_seq exceeds the seq it will get fails with INVALID_SURFACE_OP."""
    failure = strict_error([ev(USER, replace=(6, 8))], next_seq=5)
    assert isinstance(failure, errors.InvalidSurfaceOp)
    assert failure.metadata["index"] == "0"


def test_replace_starting_at_its_own_seq_is_fine() -> None:
    """start_seq equal to the event's own seq is allowed."""
    assert reason_of(ev(USER, replace=(5, 5)), next_seq=5) is None


def test_replace_stop_may_run_past_the_end() -> None:
    """stop_seq far beyond the end of the log is allowed."""
    assert reason_of(ev(SYSTEM, replace=(0, 2**63)), next_seq=1) is None


def test_replace_start_is_judged_by_its_place_in_the_batch() -> None:
    """In a batch the k-th event gets next_seq + k; its start may reach that far, no further."""
    fits = [ev(USER), ev(USER), ev(ASSISTANT, replace=(7, 9))]
    assert reason_of(*fits, next_seq=5) is None
    too_far = [ev(USER), ev(ASSISTANT, replace=(7, 9)), ev(USER)]
    failure = strict_error(too_far, next_seq=5)
    assert isinstance(failure, errors.InvalidSurfaceOp)
    assert failure.metadata["index"] == "1"


def test_future_replace_wins_over_bad_data() -> None:
    """A future-pointing replace with NaN data reports rule 3, not rule 4."""
    assert reason_of(ev(USER, {"x": math.nan}, replace=(4, 4)), next_seq=1) == "INVALID_SURFACE_OP"


def test_future_replace_wins_over_a_bad_message_field() -> None:
    """A future-pointing replace with a bad metadata field reports INVALID_SURFACE_OP."""
    event = ev(USER, {"metadata": "not an object"}, replace=(4, 4))
    assert reason_of(event, next_seq=1) == "INVALID_SURFACE_OP"


def test_future_replace_wins_over_a_nonzero_seq() -> None:
    """A future-pointing replace that also carries a seq reports rule 3, not rule 6."""
    assert reason_of(ev(USER, seq=2, replace=(4, 4)), next_seq=1) == "INVALID_SURFACE_OP"


def test_bad_range_wins_over_bad_data() -> None:
    """start > stop together with NaN data reports rule 3."""
    assert reason_of(ev(USER, {"x": math.inf}, replace=(1, 0)), next_seq=4) == "INVALID_SURFACE_OP"


# -- rule 4: data that cannot round-trip as JSON, and size -----------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_number_is_rejected(bad: float) -> None:
    """NaN and infinities anywhere in data fail with UNSERIALIZABLE_EVENT_DATA."""
    assert reason_of(ev(USER, {"x": bad})) == "UNSERIALIZABLE_EVENT_DATA"
    assert reason_of(ev(TURN_START, {"a": [1, {"b": [bad]}]})) == "UNSERIALIZABLE_EVENT_DATA"


def test_large_finite_numbers_are_fine() -> None:
    """The largest finite double and negative zero are valid JSON numbers."""
    assert reason_of(ev(USER, {"big": 1.7976931348623157e308, "z": -0.0})) is None


@pytest.mark.parametrize("use_lists", [False, True])
def test_depth_24_is_accepted(use_lists: bool) -> None:
    """Objects or lists nested exactly 24 levels deep (data is level 1) are fine."""
    assert reason_of(ev(TOOL_CALL, nested(24, use_lists=use_lists))) is None


@pytest.mark.parametrize("use_lists", [False, True])
def test_depth_25_is_rejected(use_lists: bool) -> None:
    """One level more than 24 fails with UNSERIALIZABLE_EVENT_DATA, lists counting as levels."""
    assert reason_of(ev(TOOL_CALL, nested(25, use_lists=use_lists))) == "UNSERIALIZABLE_EVENT_DATA"


def test_depth_counts_objects_and_lists_alike() -> None:
    """Alternating objects and lists: 24 levels pass, 25 fail."""

    def alternating(levels: int) -> dict[str, object]:
        inner: object = {}
        for level in range(levels - 1, 1, -1):
            inner = [inner] if level % 2 else {"k": inner}
        return {"k": inner}

    assert reason_of(ev(USER, alternating(24))) is None
    assert reason_of(ev(USER, alternating(25))) == "UNSERIALIZABLE_EVENT_DATA"


def test_depth_limit_is_configurable() -> None:
    """Limits.max_data_depth moves the boundary."""
    small = Limits(max_data_depth=3)
    assert reason_of(ev(USER, nested(3)), limits=small) is None
    assert reason_of(ev(USER, nested(4)), limits=small) == "UNSERIALIZABLE_EVENT_DATA"


def test_value_with_no_kind_is_rejected() -> None:
    """A Struct Value with no kind set (not even null) cannot be JSON."""
    in_object = ev(USER)
    in_object.data.fields["x"].Clear()
    assert "x" in in_object.data.fields
    assert reason_of(in_object) == "UNSERIALIZABLE_EVENT_DATA"
    in_list = ev(TURN_START)
    in_list.data.fields["xs"].list_value.values.add()
    assert reason_of(in_list) == "UNSERIALIZABLE_EVENT_DATA"


def test_timestamp_out_of_range_is_rejected() -> None:
    """A time past year 9999 cannot be written as RFC 3339 and is rejected."""
    event = ev(USER)
    event.time.seconds = 253402300800
    assert reason_of(event) == "UNSERIALIZABLE_EVENT_DATA"


def test_event_larger_than_the_limit_is_rejected() -> None:
    """An event whose serialized size exceeds Limits.max_event_bytes fails with EVENT_TOO_LARGE."""
    event = ev(USER, {"content": "x" * 200})
    size = event.ByteSize()
    assert reason_of(event, limits=Limits(max_event_bytes=size)) is None
    failure = strict_error([ev(USER), event], limits=Limits(max_event_bytes=size - 1))
    assert isinstance(failure, errors.EventTooLarge)
    assert failure.metadata["index"] == "1"


def test_too_large_wins_over_a_bad_message_field() -> None:
    """Rules 4 and 5 broken together report rule 4."""
    event = ev(USER, {"content": "x" * 200, "metadata": 3})
    assert reason_of(event, limits=Limits(max_event_bytes=50)) == "EVENT_TOO_LARGE"


def test_unserializable_wins_over_a_bad_message_field() -> None:
    """A NaN content breaks rules 4 and 5; rule 4 is reported."""
    assert reason_of(ev(USER, {"content": math.nan})) == "UNSERIALIZABLE_EVENT_DATA"


# -- rule 5: projected fields of surface types -----------------------------------------------------

STRING_FIELDS = ("content", "reasoning_content", "tool_call_id", "name")
NOT_A_STRING: list[object] = [5, 1.5, True, False, [], ["a"], {}, {"a": "b"}]


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("value", NOT_A_STRING)
def test_string_field_of_another_type_is_rejected(field: str, value: object) -> None:
    """A projected string field holding a number, bool, list or object is INVALID_MESSAGE_FIELD."""
    failure = strict_error([ev(ASSISTANT, {field: value})])
    assert isinstance(failure, errors.InvalidMessageField)
    assert failure.metadata["field"] == field
    assert failure.metadata["index"] == "0"


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("value", ["", "text", None])
def test_string_field_may_be_a_string_or_null(field: str, value: str | None) -> None:
    """The four string fields accept any string, the empty one included, and null."""
    assert reason_of(ev(TOOL_RESULT, {field: value})) is None


@pytest.mark.parametrize("value", ["calls", 3, None, {"id": "a"}, True])
def test_tool_calls_not_a_list_is_rejected(value: object) -> None:
    """tool_calls must be a list."""
    failure = strict_error([ev(ASSISTANT, {"tool_calls": value})])
    assert isinstance(failure, errors.InvalidMessageField)
    assert failure.metadata["field"] == "tool_calls"


@pytest.mark.parametrize("item", ["call", 1, None, [], [{"id": "a"}], False])
def test_tool_calls_with_a_non_object_item_is_rejected(item: object) -> None:
    """Every item of tool_calls must be an object, even when the others are."""
    failure = strict_error([ev(ASSISTANT, {"tool_calls": [{"id": "a"}, item]})])
    assert isinstance(failure, errors.InvalidMessageField)
    assert failure.metadata["field"] == "tool_calls"


@pytest.mark.parametrize("calls", [[], [{}], [{"id": "a", "args": {"x": [1, None]}}, {"id": "b"}]])
def test_tool_calls_list_of_objects_is_fine(calls: list[object]) -> None:
    """An empty list or a list of objects (of any shape) is a valid tool_calls."""
    assert reason_of(ev(ASSISTANT, {"tool_calls": calls})) is None


@pytest.mark.parametrize("value", ["meta", 0, None, [], [{}], True])
def test_metadata_not_an_object_is_rejected(value: object) -> None:
    """metadata must be an object: a string, number, null or list is INVALID_MESSAGE_FIELD."""
    failure = strict_error([ev(USER, {"metadata": value})])
    assert isinstance(failure, errors.InvalidMessageField)
    assert failure.metadata["field"] == "metadata"


def test_metadata_object_is_fine() -> None:
    """metadata may be any object, e.g. multi-part content."""
    data = {"metadata": {"content_parts": [{"type": "text", "text": "hi"}]}}
    assert reason_of(ev(USER, data)) is None


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_bookkeeping_types_have_no_field_shape(type_: int) -> None:
    """Rule 5 applies to surface types only: bookkeeping data may hold anything."""
    data = {"content": 1, "tool_calls": "x", "metadata": [1], "name": {"a": 1}}
    assert reason_of(ev(type_, data)) is None


def test_extra_keys_of_any_shape_are_fine() -> None:
    """Keys other than the projected ones are not checked, whatever they hold."""
    data = {"foo": [1, {"x": None}], "bar": 3, "baz": None, "qux": {"deep": [[True]]}, "s": ""}
    for type_ in SURFACE:
        assert reason_of(ev(type_, data)) is None


@pytest.mark.parametrize("type_", SURFACE)
def test_empty_surface_event_is_fine(type_: int) -> None:
    """An event with empty data (e.g. an empty user_message) is accepted."""
    assert reason_of(ev(type_)) is None


def test_bad_message_field_wins_over_a_nonzero_seq() -> None:
    """Rules 5 and 6 broken together report rule 5."""
    assert reason_of(ev(USER, {"name": 1}, seq=4)) == "INVALID_MESSAGE_FIELD"


# -- rule 6: seq is the server's -------------------------------------------------------------------


@pytest.mark.parametrize("seq", [1, 5, 2**64 - 1])
def test_client_supplied_seq_is_rejected(seq: int) -> None:
    """A non-zero seq fails with SEQ_ASSIGNED_BY_SERVER, naming the index."""
    failure = strict_error([ev(USER), ev(TURN_START, seq=seq)])
    assert isinstance(failure, errors.SeqAssignedByServer)
    assert failure.metadata["index"] == "1"


# -- across events ---------------------------------------------------------------------------------


def test_first_failing_event_wins_over_a_lower_rule_later() -> None:
    """Events are checked in order: a rule-6 failure at index 1 beats a rule-1 failure at 2."""
    failure = strict_error([ev(USER), ev(USER, seq=9), ev(0)])
    assert isinstance(failure, errors.SeqAssignedByServer)
    assert failure.metadata["index"] == "1"


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (ev(0), "UNKNOWN_EVENT_TYPE"),
        (ev(TOOL_CALL, replace=(0, 0)), "SURFACE_OP_ON_NON_SURFACE_EVENT"),
        (ev(USER, replace=(1, 0)), "INVALID_SURFACE_OP"),
        (ev(USER, replace=(50, 60)), "INVALID_SURFACE_OP"),
        (ev(USER, {"x": math.nan}), "UNSERIALIZABLE_EVENT_DATA"),
        (ev(USER, {"content": 1}), "INVALID_MESSAGE_FIELD"),
        (ev(USER, seq=1), "SEQ_ASSIGNED_BY_SERVER"),
    ],
)
def test_error_names_the_index_of_the_failing_event(bad: Event, reason: str) -> None:
    """Whatever the rule, the error's metadata names the failing event's index in the batch."""
    failure = strict_error([ev(USER), ev(ASSISTANT), ev(SYSTEM), bad], next_seq=3)
    assert failure is not None
    assert failure.reason == reason
    assert failure.metadata["index"] == "3"


def test_valid_batch_is_admitted_whole() -> None:
    """A valid batch passes strict admit and loses nothing under lenient admit."""
    assert lenient([ev(USER), ev(TURN_START), ev(USER, replace=(0, 1))], next_seq=0) == (
        [0, 1, 2],
        [],
    )
    assert strict_error([ev(USER), ev(TURN_START), ev(USER, replace=(0, 1))]) is None


# -- lenient ---------------------------------------------------------------------------------------


def test_lenient_drops_each_invalid_event_and_reports_it() -> None:
    """Lenient admit keeps the valid events and reports every drop with index and reason."""
    events = [
        ev(USER),
        ev(0),
        ev(ASSISTANT),
        ev(USER, {"x": math.nan}),
        ev(TOOL_CALL, append_op=True),
        ev(USER, seq=3),
        ev(SYSTEM),
    ]
    kept, drops = lenient(events)
    assert kept == [0, 2, 6]
    assert drops == [
        (1, "UNKNOWN_EVENT_TYPE"),
        (3, "UNSERIALIZABLE_EVENT_DATA"),
        (4, "SURFACE_OP_ON_NON_SURFACE_EVENT"),
        (5, "SEQ_ASSIGNED_BY_SERVER"),
    ]


def test_lenient_drop_errors_name_their_index() -> None:
    """Each dropped event's error metadata names its own index in the request."""
    events = [ev(0), ev(USER), ev(USER, {"metadata": 1})]
    pre = [check_event(e, i) for i, e in enumerate(events)]
    _, drops = admit(events, pre, 0, lenient=True)
    assert [(i, err.metadata["index"]) for i, err in drops] == [(0, "0"), (2, "2")]


def test_lenient_with_every_event_invalid_keeps_nothing() -> None:
    """A lenient append whose events all fail drops them all and raises nothing."""
    kept, drops = lenient([ev(0), ev(USER, seq=1)])
    assert kept == []
    assert [i for i, _ in drops] == [0, 1]


def test_lenient_later_events_take_the_freed_seqs() -> None:
    """After a drop, a replace is judged by the seq it will really get, not by its index."""
    # Without the drop the replace would get seq 2 and start 2 would be fine; with it, seq 1.
    kept, drops = lenient([ev(0), ev(USER), ev(USER, replace=(2, 2))])
    assert kept == [1]
    assert drops == [(0, "UNKNOWN_EVENT_TYPE"), (2, "INVALID_SURFACE_OP")]
    kept, drops = lenient([ev(0), ev(USER), ev(USER, replace=(1, 1))])
    assert kept == [1, 2]
    assert drops == [(0, "UNKNOWN_EVENT_TYPE")]


def test_lenient_replace_valid_thanks_to_the_next_seq() -> None:
    """Lenient keeps a replace whose start equals next_seq plus the kept events before it."""
    kept, drops = lenient(
        [ev(USER, seq=1), ev(USER), ev(0), ev(USER), ev(USER, replace=(12, 12))], next_seq=10
    )
    assert kept == [1, 3, 4]
    assert [i for i, _ in drops] == [0, 2]
    kept, _ = lenient(
        [ev(USER, seq=1), ev(USER), ev(0), ev(USER), ev(USER, replace=(13, 13))], next_seq=10
    )
    assert kept == [1, 3]


def test_strict_stops_at_the_first_failure() -> None:
    """A strict admit raises instead of dropping."""
    events = [ev(USER), ev(0), ev(USER)]
    pre = [check_event(e, i) for i, e in enumerate(events)]
    with pytest.raises(errors.UnknownEventType) as caught:
        admit(events, pre, 0, lenient=False)
    assert caught.value.metadata["index"] == "1"
