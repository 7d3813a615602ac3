"""SPEC §4 and §6 as properties: the memoized fold always equals a fresh fold of the same log."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog.fold import SurfaceFold, derive_messages, fold_surface, position, project
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import BOOKKEEPING, HIDE, SURFACE, ev

PROPERTY = settings(max_examples=300, deadline=None)


@st.composite
def logs(draw: st.DrawFn, max_size: int = 40) -> list[Event]:
    """A valid log: surface and bookkeeping events, with replaces and hides the writer would
    accept."""
    size = draw(st.integers(min_value=0, max_value=max_size))
    events = []
    for seq in range(size):
        kind = draw(
            st.sampled_from(["append", "explicit", "bookkeeping", "replace", "replace", "hide"])
        )
        if kind == "bookkeeping":
            events.append(ev(draw(st.sampled_from(BOOKKEEPING)), seq=seq))
            continue
        if kind == "hide":
            start = draw(st.integers(min_value=0, max_value=seq))
            stop = draw(st.integers(min_value=start, max_value=seq + 5))
            events.append(ev(HIDE, seq=seq, replace=(start, stop)))
            continue
        type_ = draw(st.sampled_from(SURFACE))
        data = {"content": f"e{seq}"}
        if kind == "replace":
            start = draw(st.integers(min_value=0, max_value=seq))
            stop = draw(st.integers(min_value=start, max_value=seq + 5))
            events.append(ev(type_, data, seq=seq, replace=(start, stop)))
        else:
            events.append(ev(type_, data, seq=seq, append_op=kind == "explicit"))
    return events


def oracle(events: list[Event]) -> list[int]:
    """SPEC §4 read literally, written independently of the fold: the surface's seqs."""
    replaces = [
        (e.seq, e.surface_op.replace.start_seq, e.surface_op.replace.stop_seq)
        for e in events
        if e.surface_op.HasField("replace")
    ]

    def where(e: Event) -> int:
        return e.surface_op.replace.start_seq if e.surface_op.HasField("replace") else e.seq

    shown = [
        e
        for e in events
        if e.type in SURFACE
        and all(not (r_seq > e.seq and lo <= where(e) <= hi) for r_seq, lo, hi in replaces)
    ]
    shown.sort(key=lambda e: (where(e), e.seq))
    return [e.seq for e in shown]


@PROPERTY
@given(logs())
def test_incremental_fold_equals_fresh_fold_after_every_event(events: list[Event]) -> None:
    """Extending SurfaceFold one event at a time matches fold_surface of every prefix."""
    memo = SurfaceFold()
    replaces = 0
    for n, event in enumerate(events, start=1):
        memo.add(event)
        replaces += event.surface_op.HasField("replace")
        fresh = fold_surface(events[:n])
        assert memo.seqs == [e.seq for e in fresh]
        assert [position(e) for e in memo.surface] == [position(e) for e in fresh]
        assert memo.count == n
        assert memo.replace_generation == replaces


@PROPERTY
@given(logs(max_size=25), st.data())
def test_memoized_projection_equals_fresh_projection(
    events: list[Event], data: st.DataObject
) -> None:
    """projected(), read at random moments while the log grows, equals projecting afresh."""
    memo = SurfaceFold()
    for n, event in enumerate(events, start=1):
        memo.add(event)
        if data.draw(st.booleans()):
            fresh = [project(e).SerializeToString() for e in fold_surface(events[:n])]
            assert memo.projected() == fresh
    assert memo.projected() == [m.SerializeToString() for m in derive_messages(events)]


@PROPERTY
@given(logs())
def test_fold_matches_the_spec_read_literally(events: list[Event]) -> None:
    """fold_surface agrees with an independent reading of SPEC §4."""
    assert [e.seq for e in fold_surface(events)] == oracle(events)


@PROPERTY
@given(logs())
def test_surface_is_ordered_by_position(events: list[Event]) -> None:
    """The surface, and so the derived messages, are in increasing position with no repeats."""
    positions = [position(e) for e in fold_surface(events)]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)
    contents = [m.content for m in derive_messages(events)]
    assert contents == [f"e{seq}" for seq in oracle(events)]


@PROPERTY
@given(logs())
def test_surface_holds_surface_events_at_most_once(events: list[Event]) -> None:
    """Only surface types show, and every event shows at most once."""
    shown = fold_surface(events)
    assert all(e.type in SURFACE for e in shown)
    assert len({e.seq for e in shown}) == len(shown)
