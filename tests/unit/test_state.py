"""Session state: each event's state_delta folded in seq order (shallow merge, null deletes)."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.json_format import MessageToDict

from sessionlog.fold import Limits, SurfaceFold, fold_state
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import ASSISTANT, TURN_START, USER, ev, log, nested, strict_error, text


def with_delta(event: Event, delta: dict[str, Any]) -> Event:
    """The event, carrying ``delta`` as its state_delta."""
    event.state_delta.update(delta)
    return event


def state_of(events: list[Event]) -> dict[str, Any]:
    return MessageToDict(fold_state(events))


def memo_state(events: list[Event]) -> dict[str, Any]:
    folded = SurfaceFold()
    folded.extend(events)
    return {key: MessageToDict(value) for key, value in folded.state.items()}


def test_no_delta_means_empty_state() -> None:
    """A log without deltas has an empty state."""
    assert state_of(log([text("a"), text("b", ASSISTANT)])) == {}


def test_later_delta_replaces_a_key_whole_and_keeps_the_others() -> None:
    """The merge is shallow: a nested object is replaced, not merged; other keys stay."""
    events = log(
        [
            with_delta(text("a"), {"cart": {"apples": 1, "pears": 2}, "user": "ann"}),
            with_delta(ev(TURN_START), {"cart": {"plums": 3}}),
        ]
    )
    assert state_of(events) == {"cart": {"plums": 3}, "user": "ann"}


def test_null_deletes_a_key_and_a_later_delta_can_set_it_again() -> None:
    """A top-level null removes the key; a nested null is an ordinary value."""
    events = [
        with_delta(text("a"), {"x": 1, "y": {"z": None}}),
        with_delta(text("b"), {"x": None, "never_set": None}),
    ]
    assert state_of(log(events)) == {"y": {"z": None}}
    events.append(with_delta(text("c"), {"x": "back"}))
    assert state_of(log(events)) == {"x": "back", "y": {"z": None}}


def test_shadowed_events_still_count_for_state() -> None:
    """A replace hides events from the surface, not their deltas from the state."""
    events = log(
        [
            with_delta(text("a"), {"a": 1}),
            with_delta(text("b"), {"b": 2}),
            with_delta(text("summary", replace=(0, 1)), {"c": 3}),
        ]
    )
    assert state_of(events) == {"a": 1, "b": 2, "c": 3}


def test_prefix_is_the_state_at_that_seq() -> None:
    """Folding events 0..n gives the state as it was at seq n."""
    events = log([with_delta(text(str(i)), {"n": i, f"k{i}": True}) for i in range(4)])
    assert state_of(events[:2]) == {"n": 1, "k0": True, "k1": True}
    assert state_of(events) == {"n": 3, "k0": True, "k1": True, "k2": True, "k3": True}


def test_memo_agrees_with_the_reference_fold_event_by_event() -> None:
    """SurfaceFold's state, extended one event at a time, equals fold_state of each prefix."""
    deltas: list[dict[str, Any]] = [
        {"a": 1},
        {},
        {"b": [1, 2], "a": None},
        {"a": {"deep": True}},
        {"b": None, "c": "x"},
    ]
    events = log(
        [with_delta(ev(USER if i % 2 else TURN_START), d) for i, d in enumerate(deltas)]
        + [text("replace", replace=(0, 4))]
    )
    folded = SurfaceFold()
    for i, event in enumerate(events):
        folded.add(event)
        got = {key: MessageToDict(value) for key, value in folded.state.items()}
        assert got == state_of(events[: i + 1]), i
    assert memo_state(events) == {"a": {"deep": True}, "c": "x"}


def test_state_bytes_do_not_depend_on_the_order_keys_were_set() -> None:
    """Two logs reaching the same state serialize it to the same bytes (replicas must agree)."""
    one = log([with_delta(text("a"), {"z": 1}), with_delta(text("b"), {"m": 2, "a": 3})])
    two = log([with_delta(text("a"), {"a": 3, "m": 0}), with_delta(text("b"), {"z": 1, "m": 2})])
    first = fold_state(one).SerializeToString(deterministic=True)
    assert first == fold_state(two).SerializeToString(deterministic=True)


def test_state_delta_is_validated_like_data() -> None:
    """NaN, a kindless value or nesting past the limit fail with UNSERIALIZABLE_EVENT_DATA."""
    assert strict_error([with_delta(text("a"), {"fine": [1, {"x": None}]})]) is None
    bad_number = with_delta(text("a"), {"x": math.nan})
    failure = strict_error([bad_number])
    assert failure is not None
    assert failure.reason == "UNSERIALIZABLE_EVENT_DATA"
    assert "state_delta" in str(failure)
    kindless = text("a")
    kindless.state_delta.fields["x"].SetInParent()
    failure = strict_error([kindless])
    assert failure is not None
    assert failure.reason == "UNSERIALIZABLE_EVENT_DATA"
    limits = Limits(max_data_depth=3)
    assert strict_error([with_delta(text("a"), nested(3))], limits=limits) is None
    failure = strict_error([with_delta(text("a"), nested(4))], limits=limits)
    assert failure is not None
    assert failure.reason == "UNSERIALIZABLE_EVENT_DATA"


def test_bookkeeping_events_may_carry_a_delta() -> None:
    """Any event type may carry a state_delta (unlike a surface_op)."""
    assert strict_error([with_delta(ev(TURN_START), {"k": 1})]) is None
