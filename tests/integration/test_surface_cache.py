"""The memoized surface always equals a fresh fold of the events read back from LMDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionlog import errors, fold
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import (
    ASSISTANT,
    STEP_START,
    decoded,
    event,
    opened,
    read_all,
    replace,
    user,
)


def _reference(store: Store, session_id: str) -> list[Event]:
    return fold.fold_surface(decoded(read_all(store, session_id)))


def _assert_matches_fresh_fold(store: Store, session_id: str) -> None:
    folded = store.surface(session_id)
    log = decoded(read_all(store, session_id))
    assert folded.surface == fold.fold_surface(log)
    assert folded.count == len(log)


def _grow(store: Store, session_id: str) -> None:
    """A log mixing plain appends, bookkeeping and replaces, checking the memo after each."""
    steps: list[list[Event]] = [
        [event(ASSISTANT, content="hello")],
        [user("a"), event(STEP_START), user("b")],
        [user("c"), user("d")],
        [replace("sum-ab", 1, 3)],
        [user("e")],
        [replace("sum-all", 0, 100)],
        [user("f"), replace("prune-f", 9, 9), user("g")],
        [replace("x", 0, 0)],
    ]
    for batch in steps:
        store.append(session_id, batch)
        _assert_matches_fresh_fold(store, session_id)


def test_memo_equals_fresh_fold_after_plain_and_replace_appends(store: Store) -> None:
    """After each plain or replace append, surface equals fold_surface over all events."""
    _grow(store, "s")
    assert [e.data.fields["content"].string_value for e in store.surface("s").surface] == [
        "x",
        "prune-f",
        "g",
    ]


def test_memo_tracks_replace_generation(store: Store) -> None:
    """The memo's replace_generation matches the session meta after replaces."""
    _grow(store, "s")
    meta = store.meta("s")
    assert meta is not None
    assert store.surface("s").replace_generation == meta.replace_generation == 4


def test_at_seq_folds_the_prefix(store: Store) -> None:
    """surface(at_seq=k) equals fold_surface of events 0..k, for every k, before and after memo."""
    _grow(store, "s")
    log = decoded(read_all(store, "s"))
    for k in range(len(log)):
        prefix = store.surface("s", at_seq=k)
        assert prefix.surface == fold.fold_surface(log[: k + 1])
        assert prefix.count == k + 1
    _assert_matches_fresh_fold(store, "s")


def test_prefix_read_between_appends_keeps_the_memo_right(store: Store) -> None:
    """Prefix reads interleaved with appends never leave the full-log memo stale or too long."""
    store.append("s", [user("a"), user("b")])
    store.surface("s")
    store.append("s", [user("c"), replace("sum", 0, 1), user("d")])
    assert store.surface("s", at_seq=2).surface == fold.fold_surface(
        decoded(read_all(store, "s"))[:3]
    )
    _assert_matches_fresh_fold(store, "s")
    store.append("s", [replace("all", 0, 9)])
    assert store.surface("s", at_seq=0).count == 1
    _assert_matches_fresh_fold(store, "s")


def test_prefix_result_does_not_change_after_later_reads(store: Store) -> None:
    """A fold returned for at_seq stays the fold of that prefix after the log is read again."""
    store.append("s", [user("a"), user("b")])
    store.surface("s")
    store.append("s", [user("c"), user("d"), user("e")])
    prefix = store.surface("s", at_seq=2)
    kept_surface, kept_count = prefix.surface, prefix.count
    store.surface("s")
    assert (prefix.count, prefix.surface) == (kept_count, kept_surface)


def test_at_seq_past_the_end_is_out_of_range(store: Store) -> None:
    """at_seq at or past next_seq fails BOUNDARY_OUT_OF_RANGE naming the next seq."""
    store.append("s", [user("a"), user("b")])
    for past in (2, 3, 1000):
        with pytest.raises(errors.BoundaryOutOfRange) as caught:
            store.surface("s", at_seq=past)
        assert caught.value.metadata["next_seq"] == "2"
    assert store.surface("s", at_seq=1).count == 2


def test_never_written_session_has_an_empty_surface(store: Store) -> None:
    """A session never written folds to nothing; any at_seq is out of range for it."""
    folded = store.surface("ghost")
    assert folded.surface == []
    assert folded.count == 0
    with pytest.raises(errors.BoundaryOutOfRange):
        store.surface("ghost", at_seq=0)
    assert store.meta("ghost") is None


def test_memo_is_per_session(store: Store) -> None:
    """Folds of sessions written turn by turn never mix, even with a replace in one of them."""
    for i in range(4):
        store.append("p", [user(f"p{i}")])
        store.append("q", [user(f"q{i}")])
        assert store.surface("p").surface == _reference(store, "p")
        assert store.surface("q").surface == _reference(store, "q")
    store.append("p", [replace("p-sum", 0, 3)])
    assert [e.data.fields["content"].string_value for e in store.surface("p").surface] == ["p-sum"]
    assert len(store.surface("q").surface) == 4


def test_memo_is_bounded_by_bytes(tmp_path: Path) -> None:
    """Past the byte budget the least recently read folds are dropped; reads stay exact."""
    with opened(tmp_path / "d", StoreConfig(fold_cache_bytes=20_000)) as small:
        for n in range(6):
            small.append(f"s{n}", [user("x" * 1000) for _ in range(8)])
            small.surface(f"s{n}")
        assert 1 <= len(small._folds) < 6
        assert sum(small._fold_bytes.values()) <= 20_000
        for n in range(6):
            assert [e.seq for e in small.surface(f"s{n}").surface] == list(range(8))
        small.redact("s1", [0])  # a memo made stale, then forgotten
        small.delete("s2")
        for n in (0, 1, 3):
            small.append(f"s{n}", [user("y" * 500)])
            small.surface(f"s{n}")
        assert small.folds.held_bytes == sum(small._fold_bytes.values()) <= 20_000
