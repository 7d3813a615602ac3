"""FollowSessions over a real store: where a stream starts (``follow_sessions.start_position``)
and what a walk of the feed keeps (``Store.read_followed``): prefixes, filters, deletions with
their erased placeholders, and the record and byte limits of one read. Real LMDB in a
temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.records import Filter, parse_filter
from sessionlog.service.follow_sessions import start_position
from sessionlog.storage import schema
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.integration.helpers import opened, user


def followed(
    store: Store, start: int, prefix: str = "", query: Filter | None = None, **limits: int
) -> tuple[list[pb.FollowedChange], int, bool]:
    """What one walk from ``start`` keeps, decoded; its last position; whether more follow."""
    read = store.read_followed(
        start,
        lambda session_id: session_id.startswith(prefix),
        query or Filter(),
        max_records=limits.get("max_records", 1000),
        max_bytes=limits.get("max_bytes", 1 << 20),
    )
    return [pb.FollowedChange.FromString(raw) for raw in read.changes], read.last, read.more


def test_start_positions_and_their_errors(tmp_path: Path) -> None:
    """0 starts after the head, from_start at 1, N after N; past the head is
    FEED_POSITION_AHEAD, before the oldest stored record FEED_POSITION_GONE."""
    with opened(tmp_path / "d") as store:
        for i in range(5):
            store.append("s", [user(str(i))])
        ask = pb.FollowSessionsRequest
        assert start_position(store, ask()) == 6
        assert start_position(store, ask(from_start=True)) == 1
        assert start_position(store, ask(after_position=3)) == 4
        assert start_position(store, ask(after_position=5)) == 6
        with pytest.raises(errors.FeedPositionAhead):
            start_position(store, ask(after_position=6))
        with pytest.raises(errors.MalformedRequest):
            start_position(store, ask(after_position=1, from_start=True))
        with store.env.begin(write=True) as txn:  # as a store restored to a later start holds it
            for position in (1, 2):
                txn.delete(schema.u64(position), db=store.tables.changes)
        assert start_position(store, ask(after_position=2)) == 3
        with pytest.raises(errors.FeedPositionGone) as gone:
            start_position(store, ask(after_position=1))
        assert gone.value.metadata["first_position"] == "3"


def test_a_resume_with_a_checksum_is_held_against_this_stores_history(tmp_path: Path) -> None:
    """after_checksum passes where this store's change has it (or its first change, in a store
    that begins right after the position, chains over it) and is HISTORY_DIVERGED otherwise;
    a walk names the checksum of the last record it read."""
    with opened(tmp_path / "d") as store:
        for i in range(5):
            store.append("s", [user(str(i))])
        ask = pb.FollowSessionsRequest
        at = {position: store.checksum_at(position) or b"" for position in range(1, 6)}
        assert start_position(store, ask(after_position=3, after_checksum=at[3])) == 4
        with pytest.raises(errors.HistoryDiverged) as diverged:
            start_position(store, ask(after_position=3, after_checksum=at[2]))
        assert diverged.value.metadata["after_position"] == "3"
        assert start_position(store, ask(after_position=3)) == 4  # no checksum: no check
        read = store.read_followed(2, lambda _: True, Filter(), max_records=2, max_bytes=1 << 20)
        assert (read.last, read.checksum) == (3, at[3])
        with store.env.begin(write=True) as txn:  # as a store restored to a later start holds it
            for position in (1, 2):
                txn.delete(schema.u64(position), db=store.tables.changes)
        assert start_position(store, ask(after_position=2, after_checksum=at[2])) == 3
        with pytest.raises(errors.HistoryDiverged):
            start_position(store, ask(after_position=2, after_checksum=at[4]))


def test_a_walk_keeps_its_sessions_and_marks_deletions_without_their_events(
    tmp_path: Path,
) -> None:
    """Only the prefix's sessions; a deleted session's earlier changes are placeholders (never
    read), its deletion a marker; a filter keeps the sessions whose record matches now."""
    with opened(tmp_path / "d") as store:
        store.append("a.1", [user("secret"), user("two")])
        store.append("b.1", [user("other")])
        store.append("a.2", [user("kept")])
        store.submit_lease("acquire", "a.2", "w", 10**9).result()
        store.delete("a.1")
        changes, last, more = followed(store, 1, prefix="a.")
        assert [(c.session_id, c.position, c.deleted) for c in changes] == [
            ("a.2", 3, False),
            ("a.1", 5, True),
        ]
        assert (last, more) == (5, False)
        assert b"secret" not in b"".join(c.SerializeToString() for c in changes)
        none, _, _ = followed(store, 1, prefix="a.", query=parse_filter('labels.x = "y"'))
        assert [(c.session_id, c.deleted) for c in none] == [("a.1", True)]


def test_a_walk_stops_at_its_record_and_byte_limits(tmp_path: Path) -> None:
    """max_records bounds the records walked (more is set, last names where it stopped); a
    batch past max_bytes stops before the change that would pass it, keeping at least one."""
    with opened(tmp_path / "d") as store:
        for i in range(6):
            store.append(f"s{i % 2}", [user("x" * 100)])
        changes, last, more = followed(store, 1, max_records=4)
        assert ([c.position for c in changes], last, more) == ([1, 2, 3, 4], 4, True)
        changes, last, more = followed(store, 1, max_bytes=1)
        assert ([c.position for c in changes], last, more) == ([1], 1, True)
        changes, last, more = followed(store, 7)
        assert (changes, last, more) == ([], 6, False)
