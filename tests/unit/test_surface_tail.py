"""surface_tail, the backwards fold, against the full fold: the last N of the surface, paged."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog.fold import (
    SurfaceFold,
    TailWalk,
    fold_surface,
    position,
    project,
    surface_tail,
    walk_back,
)
from sessionlog.v1.event_pb2 import Event
from tests.unit._events import SURFACE, USER, ev
from tests.unit.test_fold_property import logs

PROPERTY = settings(max_examples=300, deadline=None)


def pages(events: list[Event], limit: int) -> list[list[int]]:
    """Every page of surface_tail from the end back to the start, each as its seqs."""
    out: list[list[int]] = []
    before: int | None = None
    while True:
        page = surface_tail(reversed(events), limit, before)
        if not page:
            return out
        out.append([e.seq for e in page])
        before = position(page[0])


@st.composite
def sparse_logs(draw: st.DrawFn) -> list[Event]:
    """Longer logs of plain messages with a few replaces, whose ranges start anywhere: before,
    inside and after the last page."""
    size = draw(st.integers(min_value=1, max_value=120))
    replaces = draw(st.dictionaries(st.integers(0, size - 1), st.integers(0, 200), max_size=8))
    events = []
    for seq in range(size):
        if seq in replaces:
            start = draw(st.integers(min_value=0, max_value=seq))
            stop = start + replaces[seq] % 40
            events.append(ev(USER, {"content": f"r{seq}"}, seq=seq, replace=(start, stop)))
        else:
            events.append(ev(draw(st.sampled_from(SURFACE)), {"content": f"e{seq}"}, seq=seq))
    return events


@PROPERTY
@given(st.one_of(logs(), sparse_logs()), st.integers(min_value=1, max_value=12))
def test_the_last_n_equal_the_end_of_the_full_fold(events: list[Event], limit: int) -> None:
    """The first page is the full surface's last ``limit`` entries, for every prefix of a log."""
    for count in range(len(events) + 1):
        view = events[:count]
        full = [e.seq for e in fold_surface(view)]
        tail = [e.seq for e in surface_tail(reversed(view), limit)]
        assert tail == full[-limit:] if full else tail == []


@PROPERTY
@given(st.one_of(logs(), sparse_logs()), st.integers(min_value=1, max_value=7))
def test_paging_back_covers_the_surface_once_in_order(events: list[Event], limit: int) -> None:
    """Pages taken back to front, each before the previous page's first position, put together
    are the whole surface: nothing repeated, nothing missed, each page full but the first one."""
    walked = pages(events, limit)
    assert [seq for page in reversed(walked) for seq in page] == [
        e.seq for e in fold_surface(events)
    ]
    assert all(len(page) == limit for page in walked[:-1])


@PROPERTY
@given(st.one_of(logs(), sparse_logs()), st.integers(min_value=1, max_value=7))
def test_a_walk_resumed_where_it_stopped_finds_the_same_pages(
    events: list[Event], limit: int
) -> None:
    """Each page walked on from the previous walk's state (unread seqs, ranges, entries left
    over) equals the page a walk from the view's end finds; the state holds only what it must:
    ranges below the unread seqs, leftovers below the page."""
    resumed: list[list[int]] = []
    walk: TailWalk | None = None
    before: int | None = None
    while True:
        start = len(events) if walk is None else walk.next_seq
        page, walk = walk_back(reversed(events[:start]), limit, before, walk)
        if not page:
            break
        resumed.append([e.seq for e in page])
        before = position(page[0])
        assert all(stop < walk.next_seq for _, stop in walk.hidden)
        assert all(position(e) < before for e in walk.pending)
    assert resumed == pages(events, limit)


@PROPERTY
@given(st.one_of(logs(), sparse_logs()), st.integers(min_value=1, max_value=7))
def test_the_memo_serves_the_same_pages(events: list[Event], limit: int) -> None:
    """SurfaceFold.page matches surface_tail, page by page, messages included."""
    memo = SurfaceFold()
    memo.extend(events)
    before: int | None = None
    for page in pages(events, limit):
        served, projected = memo.page(limit, before)
        assert [e.seq for e in served] == page
        assert projected == [project(e).SerializeToString(deterministic=True) for e in served]
        before = position(served[0])
    assert memo.page(limit, before) == ([], [])


def test_the_walk_stops_once_the_page_is_certain() -> None:
    """A million-event log of plain messages: the last 10 read 11 events (the 11th proves the
    page complete), not the log."""
    read = 0

    def newest_first(count: int) -> Iterator[Event]:
        nonlocal read
        for seq in range(count - 1, -1, -1):
            read += 1
            yield ev(USER, {"content": str(seq)}, seq=seq)

    page = surface_tail(newest_first(1_000_000), 10)
    assert [e.seq for e in page] == list(range(999_990, 1_000_000))
    assert read == 11


def test_a_summary_over_everything_before_it_ends_the_walk() -> None:
    """A million events, then a summary of all but the last few and nine more messages: the
    last 10 are the summary and those nine, found without reading what the summary hides."""
    read = 0
    count = 1_000_000

    def newest_first() -> Iterator[Event]:
        nonlocal read
        for seq in range(count + 9, -1, -1):
            read += 1
            if seq == count:
                yield ev(USER, {"content": "summary"}, seq=seq, replace=(0, count - 1))
            else:
                yield ev(USER, {"content": str(seq)}, seq=seq)

    page = surface_tail(newest_first(), 10)
    assert [e.seq for e in page] == [count, *range(count + 1, count + 10)]
    assert read == 11


def test_a_summary_over_the_start_is_found_from_the_end() -> None:
    """sys, a, b, c, then a summary replacing a..b: the last two are [summary] and c, and the
    page before holds sys; the walk reads past the summary's seq down to its position."""
    log = [
        ev(SURFACE[0], {"content": "sys"}, seq=0),
        ev(USER, {"content": "a"}, seq=1),
        ev(USER, {"content": "b"}, seq=2),
        ev(USER, {"content": "c"}, seq=3),
        ev(USER, {"content": "[summary]"}, seq=4, replace=(1, 2)),
    ]
    assert pages(log, 2) == [[4, 3], [0]]
    assert [e.seq for e in surface_tail(reversed(log), 3)] == [0, 4, 3]
