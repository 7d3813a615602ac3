"""SPEC §4 and §6: which events shadow which, where replacements stand, and the memoized fold."""

from __future__ import annotations

import pytest

from sessionlog.fold import SurfaceFold, fold_surface, position
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import (
    ASSISTANT,
    BOOKKEEPING,
    STEP_END,
    STEP_START,
    SYSTEM,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER,
    contents,
    ev,
    log,
    text,
)


def surface(events: list[Event]) -> list[Event]:
    """The surface by the reference fold, after checking the memoized fold agrees on it."""
    reference = fold_surface(events)
    memo = SurfaceFold()
    memo.extend(events)
    assert memo.seqs == [e.seq for e in reference]
    assert memo.surface == reference
    return reference


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


# -- the worked examples of SPEC §4 ---------------------------------------------------------------


def test_example_bookkeeping_is_skipped() -> None:
    """0 user "one", 1 step_start, 2 assistant "two" -> surface [0, 2]."""
    events = log([text("one"), ev(STEP_START), text("two", ASSISTANT)])
    assert seqs(surface(events)) == [0, 2]
    assert contents(surface(events)) == ["one", "two"]


def test_example_two_summaries() -> None:
    """a, b, c, d, "sum-ab" replace(0,1), "sum-cd" replace(2,3) -> ["sum-ab", "sum-cd"]."""
    events = log(
        [
            text("a"),
            text("b"),
            text("c"),
            text("d"),
            text("sum-ab", SYSTEM, replace=(0, 1)),
            text("sum-cd", SYSTEM, replace=(2, 3)),
        ]
    )
    assert contents(surface(events)) == ["sum-ab", "sum-cd"]
    assert seqs(surface(events)) == [4, 5]


def test_example_summary_stands_where_its_range_starts() -> None:
    """sys, a, b, c, "[summary]" replace(1,2) -> ["sys", "[summary]", "c"]; 5 events remain."""
    events = log(
        [
            text("sys", SYSTEM),
            text("a"),
            text("b", ASSISTANT),
            text("c"),
            text("[summary]", SYSTEM, replace=(1, 2)),
        ]
    )
    assert contents(surface(events)) == ["sys", "[summary]", "c"]
    assert seqs(surface(events)) == [0, 4, 3]
    assert len(events) == 5


def test_example_replacing_a_summary_keeps_its_range_hidden() -> None:
    """a, b, c, S replace(0,2), X replace(0,0) -> ["X"]: b and c stay hidden."""
    events = log(
        [
            text("a"),
            text("b"),
            text("c"),
            text("S", SYSTEM, replace=(0, 2)),
            text("X", SYSTEM, replace=(0, 0)),
        ]
    )
    assert contents(surface(events)) == ["X"]


# -- the rules behind them ------------------------------------------------------------------------


def test_replace_never_shadows_later_events() -> None:
    """A replace whose range runs past the end hides nothing appended after it."""
    events = log(
        [
            text("a"),
            text("b"),
            text("R", SYSTEM, replace=(1, 100)),
            text("c"),
            text("d"),
        ]
    )
    assert contents(surface(events)) == ["a", "R", "c", "d"]


def test_replace_at_its_own_seq_behaves_like_an_append() -> None:
    """start_seq equal to the replace's own seq hides nothing and stands at the end."""
    events = log([text("a"), text("b"), text("R", replace=(2, 50)), text("c")])
    assert contents(surface(events)) == ["a", "b", "R", "c"]


def test_replace_hides_exactly_its_inclusive_range() -> None:
    """Positions start and stop are both hidden; their neighbours are not."""
    events = log([text(x) for x in "abcdef"] + [text("R", replace=(1, 3))])
    assert contents(surface(events)) == ["a", "R", "e", "f"]


def test_replaced_summary_keeps_its_range_hidden() -> None:
    """Shadowing is a union: a summary hidden later still hides what it summarized."""
    events = log(
        [
            text("a"),
            text("b"),
            text("c"),
            text("d"),
            text("S", replace=(1, 2)),  # seq 4, position 1
            text("T", replace=(1, 1)),  # seq 5, hides S (position 1) only
        ]
    )
    assert contents(surface(events)) == ["a", "T", "d"]


def test_later_summary_hides_a_prune_that_started_inside_its_range() -> None:
    """A summary over [0, 5] hides a prune at position 3 (range [3, 8]); 6-8 stay hidden."""
    events = log(
        [text(str(i)) for i in range(10)]  # seqs 0-9
        + [text("prune", replace=(3, 8))]  # seq 10, position 3
        + [text("summary", SYSTEM, replace=(0, 5))]  # seq 11, position 0
    )
    assert contents(surface(events)) == ["summary", "9"]


def test_summary_range_ending_before_a_prune_leaves_it_visible() -> None:
    """Ranges name positions: a prune standing at position 6 survives a summary over [0, 5]."""
    events = log(
        [text(str(i)) for i in range(10)]
        + [text("prune", replace=(6, 8))]
        + [text("summary", SYSTEM, replace=(0, 5))]
    )
    assert contents(surface(events)) == ["summary", "prune", "9"]


def test_replace_shadows_by_position_not_seq() -> None:
    """A summary (seq 4, position 1) is hidden by a later replace over [1, 1]: 1 is its position."""
    events = log(
        [
            text("a"),
            text("b"),
            text("c"),
            text("d"),
            text("S", replace=(1, 1)),
            text("T", replace=(1, 1)),
        ]
    )
    assert contents(surface(events)) == ["a", "T", "c", "d"]


def test_range_touching_only_a_replaced_seq_hides_nothing_visible() -> None:
    """A replace over [4, 4] does not hide a summary whose seq is 4 but whose position is 0."""
    events = log(
        [
            text("a"),
            text("b"),
            text("c"),
            text("d"),
            text("S", replace=(0, 0)),  # seq 4, position 0
            text("T", replace=(4, 4)),  # seq 5: nothing stands at position 4
        ]
    )
    assert contents(surface(events)) == ["S", "b", "c", "d", "T"]


def test_same_position_never_survives_twice() -> None:
    """Two events at one position: the later replace hides the earlier, so no tie stays visible."""
    events = log([text("a"), text("b"), text("R1", replace=(1, 1)), text("R2", replace=(1, 1))])
    got = surface(events)
    assert contents(got) == ["a", "R2"]
    positions = [position(e) for e in got]
    assert positions == sorted(set(positions))


def test_surface_is_sorted_by_position_with_append_order_for_ties() -> None:
    """The reference fold sorts stably: equal positions keep their append order."""
    # A log no writer would produce (a seq repeated) is the only way to build a visible tie.
    first = ev(USER, {"content": "first"}, seq=1)
    second = ev(USER, {"content": "second"}, seq=1)
    zero = ev(USER, {"content": "zero"}, seq=0)
    assert contents(fold_surface([first, second, zero])) == ["zero", "first", "second"]
    assert contents(fold_surface([second, first, zero])) == ["zero", "second", "first"]


@pytest.mark.parametrize("type_", BOOKKEEPING)
def test_bookkeeping_events_never_reach_the_surface(type_: int) -> None:
    """Bookkeeping events never show on the surface, whatever their data."""
    events = log([ev(type_, {"content": "x"}), text("a"), ev(type_), text("b", ASSISTANT)])
    assert seqs(surface(events)) == [1, 3]


def test_replace_over_bookkeeping_only_adds_the_replacement() -> None:
    """A range holding only bookkeeping events hides nothing visible."""
    events = log(
        [
            text("a"),
            ev(TURN_START),
            ev(TOOL_CALL),
            ev(TURN_END),
            text("R", replace=(1, 3)),
        ]
    )
    assert contents(surface(events)) == ["a", "R"]


def test_all_four_surface_types_are_on_the_surface() -> None:
    """System, user, assistant and tool-result events all show."""
    events = log([text("s", SYSTEM), text("u"), text("a", ASSISTANT), text("t", TOOL_RESULT)])
    assert seqs(surface(events)) == [0, 1, 2, 3]


def test_explicit_append_is_an_append() -> None:
    """An explicit append op, or a surface_op with no kind, folds as a plain append."""
    empty_op = text("b")
    empty_op.surface_op.SetInParent()
    events = log([ev(USER, {"content": "a"}, append_op=True), empty_op, ev(STEP_END)])
    assert contents(surface(events)) == ["a", "b"]


def test_empty_log_has_an_empty_surface() -> None:
    """No events, no surface."""
    assert surface([]) == []


# -- the memoized fold ----------------------------------------------------------------------------


def test_replace_generation_counts_replaces() -> None:
    """replace_generation grows by one per replace and not on plain appends or bookkeeping."""
    memo = SurfaceFold()
    events = log(
        [
            text("a"),
            ev(STEP_START),
            text("R", replace=(0, 0)),
            text("b"),
            text("S", replace=(3, 3)),  # replaces at its own seq: still a replace
            text("T", replace=(0, 9)),
        ]
    )
    generations = []
    for event in events:
        memo.add(event)
        generations.append(memo.replace_generation)
    assert generations == [0, 0, 1, 1, 2, 3]
    assert memo.count == 6


def test_add_rejects_a_seq_out_of_order() -> None:
    """The memoized fold refuses an event whose seq is not the next one, and stays unchanged."""
    memo = SurfaceFold()
    memo.add(ev(USER, seq=0))
    for wrong in (0, 2, 5):
        with pytest.raises(ValueError, match="expected seq 1"):
            memo.add(ev(USER, seq=wrong))
    assert memo.count == 1
    assert memo.seqs == [0]
    memo.add(ev(USER, seq=1))
    assert memo.seqs == [0, 1]


def test_surface_property_is_a_copy() -> None:
    """Mutating the list returned by .surface does not change the fold."""
    memo = SurfaceFold()
    memo.extend(log([text("a"), text("b")]))
    memo.surface.clear()
    assert memo.seqs == [0, 1]
