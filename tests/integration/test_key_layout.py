"""Sessions whose ids share a prefix never interleave; read_events is a bounded key range."""

from __future__ import annotations

from sessionlog.storage.store import Store
from tests.integration.helpers import contents, decoded, read_all, sid_of, user

PREFIXED_IDS = ("ab", "a", "abc", "ab\u00e9", "ab0", "b")


def _write_interleaved(store: Store, rounds: int = 5) -> None:
    for i in range(rounds):
        for session_id in PREFIXED_IDS:
            store.append(session_id, [user(f"{session_id}/{i}")])


def test_prefix_sharing_sessions_read_only_their_own_events(store: Store) -> None:
    """ "a", "ab", "abc", "ab\u00e9" written turn by turn: each reads exactly its own events."""
    _write_interleaved(store)
    for session_id in PREFIXED_IDS:
        stored = read_all(store, session_id)
        assert contents(stored) == [f"{session_id}/{i}" for i in range(5)]
        assert [e.seq for e in decoded(stored)] == list(range(5))


def test_open_ended_read_stops_at_the_session_end(store: Store) -> None:
    """A read from a seq with no stop returns that session's tail and nothing of the next sid."""
    _write_interleaved(store)
    for session_id in PREFIXED_IDS:
        tail = store.read_events(sid_of(store, session_id), 3)
        assert contents(tail) == [f"{session_id}/3", f"{session_id}/4"]


def test_each_session_has_its_own_sid(store: Store) -> None:
    """Every session id maps to a distinct internal id."""
    _write_interleaved(store, rounds=1)
    sids = {sid_of(store, session_id) for session_id in PREFIXED_IDS}
    assert len(sids) == len(PREFIXED_IDS)


def test_read_events_is_a_start_stop_range(store: Store) -> None:
    """read_events(start, stop) returns seqs start..stop-1; a stop past the end is clipped."""
    store.append("s", [user(str(i)) for i in range(10)])
    store.append("t", [user("other")])
    sid = sid_of(store, "s")
    assert [e.seq for e in decoded(store.read_events(sid, 2, 5))] == [2, 3, 4]
    assert [e.seq for e in decoded(store.read_events(sid, 0, 1))] == [0]
    assert [e.seq for e in decoded(store.read_events(sid, 7, 1000))] == [7, 8, 9]
    assert store.read_events(sid, 4, 4) == []
    assert store.read_events(sid, 6, 3) == []


def test_reading_past_the_end_returns_nothing(store: Store) -> None:
    """A start at or past next_seq returns [] even when another session follows in the keys."""
    store.append("s", [user("a"), user("b")])
    store.append("t", [user("c")])
    sid = sid_of(store, "s")
    assert store.read_events(sid, 2) == []
    assert store.read_events(sid, 99) == []
    assert store.read_events(sid_of(store, "t"), 1) == []
    assert store.read_events(sid_of(store, "t") + 1, 0) == []


def test_max_bytes_returns_at_least_one_event(store: Store) -> None:
    """A byte budget smaller than one event still returns exactly one event."""
    store.append("s", [user("x" * 200) for _ in range(5)])
    sid = sid_of(store, "s")
    assert [e.seq for e in decoded(store.read_events(sid, 0, max_bytes=1))] == [0]
    assert [e.seq for e in decoded(store.read_events(sid, 3, max_bytes=1))] == [3]


def test_max_bytes_bounds_a_prefix_of_the_range(store: Store) -> None:
    """With a budget, the result is a prefix of the range: the first event, then more while the
    total stays within the budget."""
    store.append("s", [user("x" * (50 * i)) for i in range(1, 9)])
    sid = sid_of(store, "s")
    everything = store.read_events(sid, 0)
    for budget in (1, 60, 200, 500, 1000, 10_000):
        got = store.read_events(sid, 0, max_bytes=budget)
        assert got == everything[: len(got)]
        assert len(got) >= 1
        if len(got) > 1:
            assert sum(len(raw) for raw in got) <= budget
        if len(got) < len(everything):
            assert sum(len(raw) for raw in everything[: len(got) + 1]) > budget
