"""Store.derive_page and Store.list_events over a real LMDB: the walk back, the memo, the pins."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionlog import errors, fold
from sessionlog.storage.store import MessagesPage, Resume, Store
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import STEP_START, decoded, event, opened, read_all, replace, user


def _log(store: Store) -> None:
    """Messages, bookkeeping, summaries over the start, the middle and past the end, a prune."""
    store.append("s", [user(f"m{i}") for i in range(12)])
    store.append("s", [event(STEP_START), replace("sum 2-5", 2, 5), user("m14")])
    store.append("s", [replace("sum 0-1", 0, 1), user("m16"), replace("prune 16", 16, 16)])
    store.append(
        "s",
        [user(f"n{i}") for i in range(6)],
    )
    store.append("s", [replace("sum 20-99", 20, 99), user("last")])


def _pages(store: Store, limit: int, pinned: int | None = None) -> list[MessagesPage]:
    pages: list[MessagesPage] = []
    before = None
    while True:
        page = store.derive_page("s", limit, pinned=pinned, before=before)
        pages.append(page)
        if not page.more:
            return pages
        pinned, before = page.count, page.first_position


def _seqs(pages: list[MessagesPage]) -> list[int]:
    return [seq for page in reversed(pages) for seq in page.seqs]


def _fresh(events: list[Event]) -> list[int]:
    return [e.seq for e in fold.fold_surface(events)]


def test_walked_and_memo_pages_are_the_fresh_fold(tmp_path: Path) -> None:
    """Every page size gives the fresh fold's messages, walking back (cold: nothing is
    memoized by it) and again once a full derive has filled the memo (served from it)."""
    with opened(tmp_path / "db") as store:
        _log(store)
        expected = _fresh(decoded(read_all(store, "s")))
        for limit in (1, 2, 3, 7, 100):
            walked = _pages(store, limit)
            assert _seqs(walked) == expected
            assert not any(page.from_memo for page in walked)
        assert not store._folds  # a walk memoizes nothing
        full = store.surface("s", messages=True)
        for limit in (1, 3, 100):
            served = _pages(store, limit)
            assert _seqs(served) == expected
            assert all(page.from_memo for page in served)
            first = served[0]
            assert first.projected == full.projected[-limit:]


def test_pages_stay_on_the_count_they_pinned(tmp_path: Path) -> None:
    """A pinned count folds that prefix, whatever was appended since; a count past the end
    is InvalidPageToken, an at_seq past the end BoundaryOutOfRange."""
    with opened(tmp_path / "db") as store:
        _log(store)
        count = store.next_seq("s")
        before = _fresh(decoded(read_all(store, "s")))
        store.append("s", [replace("everything", 0, 1000), user("after")])
        assert _seqs(_pages(store, 2, pinned=count)) == before
        assert _seqs(_pages(store, 2, pinned=5)) == [0, 1, 2, 3, 4]
        assert store.derive_page("s", 3, at_seq=9).count == 10
        with pytest.raises(errors.InvalidPageToken):
            store.derive_page("s", 3, pinned=count + 100)
        with pytest.raises(errors.BoundaryOutOfRange):
            store.derive_page("s", 3, at_seq=count + 100)


def test_list_events_walks_either_way(tmp_path: Path) -> None:
    """Newest first from the end or from a cursor; oldest first from a seq; a byte budget
    still returns one event; a cursor past the end going back is InvalidPageToken."""
    with opened(tmp_path / "db") as store:
        store.append("e", [user(f"m{i}") for i in range(10)])
        stored = read_all(store, "e")
        desc = store.list_events("e", None, 3, descending=True)
        assert (desc.events, desc.first_seq, desc.next_seq) == (stored[::-1][:3], 9, 10)
        assert store.list_events("e", 2, 5, descending=True).events == [stored[1], stored[0]]
        assert store.list_events("e", 8, 5, descending=False).events == stored[8:]
        assert len(store.list_events("e", None, 5, descending=True, max_bytes=1).events) == 1
        assert store.list_events("never", None, 5, descending=True).events == []
        with pytest.raises(errors.InvalidPageToken):
            store.list_events("e", 11, 5, descending=True)


def test_each_page_goes_on_from_where_the_last_walk_stopped(tmp_path: Path) -> None:
    """The walk a page leaves (unread seqs, ranges, leftovers) finds the page before it just as
    a walk from the end does, reading only what lies below; a leftover that is no message below
    the page is InvalidPageToken."""
    with opened(tmp_path / "db") as store:
        store.append("p", [user(f"m{i}") for i in range(200)])
        first = store.derive_page("p", 10)
        assert first.seqs == list(range(190, 200))
        assert first.walk == Resume(189, (), (189,))
        again = store.derive_page("p", 10, pinned=200, before=first.first_position)
        resumed = store.derive_page(
            "p", 10, pinned=200, before=first.first_position, resume=first.walk
        )
        assert resumed.seqs == again.seqs == list(range(180, 190))
        assert resumed.walk == Resume(179, (), (179,))
        _log(store)
        expected = _fresh(decoded(read_all(store, "s")))
        for limit in (1, 2, 5):
            pages = [store.derive_page("s", limit)]
            while pages[-1].more:
                last = pages[-1]
                pages.append(
                    store.derive_page(
                        "s", limit, pinned=last.count, before=last.first_position, resume=last.walk
                    )
                )
            assert _seqs(pages) == expected
        bad = Resume(5, (), (3,))  # seq 3 is a message, but not below position 2
        with pytest.raises(errors.InvalidPageToken):
            store.derive_page("s", 2, pinned=10, before=2, resume=bad)
        step = Resume(14, (), (12,))  # seq 12 is a step marker, no message
        with pytest.raises(errors.InvalidPageToken):
            store.derive_page("s", 2, pinned=20, before=13, resume=step)
