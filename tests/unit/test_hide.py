"""EVENT_TYPE_HIDE: a range shadowed like a replace, with nothing put in its place."""

from __future__ import annotations

import pytest

from sessionlog.fold import SurfaceFold, derive_messages, fold_surface
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import (
    ASSISTANT,
    BOOKKEEPING,
    HIDE,
    STEP_START,
    SYSTEM,
    contents,
    ev,
    lenient,
    log,
    strict_error,
    text,
)


def hide(start: int, stop: int, **data: object) -> Event:
    return ev(HIDE, data, replace=(start, stop))


def surface(events: list[Event]) -> list[str]:
    """The surface's contents by the reference fold, after checking the memoized fold agrees."""
    reference = fold_surface(events)
    memo = SurfaceFold()
    memo.extend(events)
    assert memo.surface == reference
    return contents(reference)


# -- the fold -------------------------------------------------------------------------------------


def test_hide_removes_its_range_and_adds_nothing() -> None:
    """sys, a, b, c, hide(1, 2) -> [sys, c]; a replace over the same range would stand there."""
    base = [text("sys", SYSTEM), text("a"), text("b", ASSISTANT), text("c")]
    assert surface(log([*base, hide(1, 2)])) == ["sys", "c"]
    assert surface(log([*base, text("S", replace=(1, 2))])) == ["sys", "S", "c"]


def test_hide_never_shadows_later_events() -> None:
    """Events appended after a hide stay visible even when their seq lies in its range."""
    events = log([text("a"), hide(0, 9), text("b"), text("c")])
    assert surface(events) == ["b", "c"]


def test_hide_of_everything_leaves_an_empty_surface() -> None:
    """clear = hide(0, last): the surface and the derived messages are empty, the log is not."""
    events = log([text("a"), ev(STEP_START), text("b", ASSISTANT), hide(0, 2)])
    assert surface(events) == []
    assert derive_messages(events) == []
    assert len(events) == 4


def test_hide_of_a_summary_hides_the_summary_and_keeps_its_range_hidden() -> None:
    """a, b, S replace(0, 1), c, hide(0, 0): S stands at position 0, so the hide takes it; a and
    b stay hidden (shadowing is a union)."""
    events = log([text("a"), text("b"), text("S", replace=(0, 1)), text("c"), hide(0, 0)])
    assert surface(events) == ["c"]


def test_hide_by_position_not_seq() -> None:
    """A hide over the summary's seq but not its position hides nothing visible."""
    events = log([text("a"), text("b"), text("S", replace=(0, 1)), hide(2, 2)])
    assert surface(events) == ["S"]


def test_nested_hides_are_a_union() -> None:
    """A hidden hide still hides its range; a second hide over the same range changes nothing."""
    events = log([text("a"), text("b"), text("c"), hide(1, 1), hide(1, 3), text("d"), hide(1, 1)])
    assert surface(events) == ["a", "d"]


def test_a_later_summary_over_hidden_events_stands_alone() -> None:
    """a, b, hide(1, 1), S replace(0, 1) -> [S]: the summary takes the place of what is left."""
    events = log([text("a"), text("b"), hide(1, 1), text("S", replace=(0, 1))])
    assert surface(events) == ["S"]


def test_pop_last_twice_hides_the_newest_visible_messages() -> None:
    """Hiding the newest surface message at its position, twice, drops the last two."""
    events = log([text("a"), text("b"), text("c"), hide(2, 2), hide(1, 1)])
    assert surface(events) == ["a"]


def test_hide_counts_as_a_replace_for_the_memo() -> None:
    """replace_generation grows on a hide (the memo rule of SPEC §6), the surface shrinks."""
    memo = SurfaceFold()
    generations = []
    for event in log([text("a"), text("b"), hide(0, 0), text("c"), hide(5, 9)]):
        memo.add(event)
        generations.append(memo.replace_generation)
    assert generations == [0, 0, 1, 1, 2]
    assert memo.seqs == [1, 3]
    assert memo.count == 5


def test_memoized_messages_after_a_hide_equal_a_fresh_derive() -> None:
    """Projecting, hiding, projecting again gives what a fresh fold gives."""
    events = log([text("a"), text("b"), text("c"), hide(1, 1), text("d")])
    memo = SurfaceFold()
    memo.extend(events[:3])
    memo.projected()
    memo.extend(events[3:])
    fresh = [m.SerializeToString(deterministic=True) for m in derive_messages(events)]
    assert memo.projected() == fresh
    assert memo.tail(4) == ([4], fresh[-1:])


def test_hide_data_is_kept_and_never_projected() -> None:
    """A hide's data (say, a reason) stays in the event and reaches no message."""
    events = log([text("a"), hide(0, 0, reason="pop_item")])
    assert derive_messages(events) == []
    assert events[1].data.fields["reason"].string_value == "pop_item"


# -- validation -----------------------------------------------------------------------------------


def test_hide_with_a_range_is_accepted() -> None:
    """A hide carrying replace(start, stop) with start <= next seq passes every rule."""
    assert strict_error([hide(0, 4)], next_seq=3) is None
    assert strict_error([hide(3, 3)], next_seq=3) is None


def test_hide_without_a_surface_op_is_an_invalid_surface_op() -> None:
    """A hide must name a range; without one it fails with INVALID_SURFACE_OP and its index."""
    failure = strict_error([text("a"), ev(HIDE)], next_seq=0)
    assert failure is not None
    assert failure.reason == "INVALID_SURFACE_OP"
    assert failure.metadata["index"] == "1"


def test_hide_with_an_explicit_append_is_an_invalid_surface_op() -> None:
    """An explicit append on a hide names no range: INVALID_SURFACE_OP."""
    failure = strict_error([ev(HIDE, append_op=True)])
    assert failure is not None
    assert failure.reason == "INVALID_SURFACE_OP"


def test_hide_with_start_after_stop_is_rejected() -> None:
    failure = strict_error([hide(3, 2)], next_seq=5)
    assert failure is not None
    assert failure.reason == "INVALID_SURFACE_OP"
    assert "hides [3, 2]" in str(failure)


def test_hide_pointing_at_the_future_is_rejected() -> None:
    """Like a replace, a hide may not start past the seq it will itself receive."""
    failure = strict_error([hide(4, 9)], next_seq=3)
    assert failure is not None
    assert failure.reason == "INVALID_SURFACE_OP"
    assert strict_error([text("x"), hide(4, 9)], next_seq=3) is None


def test_hide_data_follows_the_data_rules() -> None:
    """A hide's data must round-trip as JSON like any event's (rule 4)."""
    failure = strict_error([hide(0, 0, n=float("nan"))], next_seq=1)
    assert failure is not None
    assert failure.reason == "UNSERIALIZABLE_EVENT_DATA"


def test_hide_data_is_not_shape_checked() -> None:
    """Rule 5 is for surface types: a hide's content may be a number."""
    assert strict_error([hide(0, 0, content=3)], next_seq=1) is None


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_a_range_on_bookkeeping_still_fails_as_before(type_: int) -> None:
    """Allowing a range on hides opens it to no other non-surface type."""
    failure = strict_error([ev(type_, replace=(0, 0))], next_seq=1)
    assert failure is not None
    assert failure.reason == "SURFACE_OP_ON_NON_SURFACE_EVENT"


def test_lenient_append_drops_a_hide_without_a_range() -> None:
    """A lenient append drops the bad hide, reports it and keeps the rest."""
    kept, drops = lenient([ev(HIDE), text("a"), hide(0, 0)], next_seq=0)
    assert kept == [1, 2]
    assert drops == [(0, "INVALID_SURFACE_OP")]
