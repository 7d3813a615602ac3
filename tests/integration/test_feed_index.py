"""The change feed's index by session (``feed_index``) against a real LMDB: it names exactly the
records that name each session, on a primary, a replica and through erasures and purges; a store
from before it is indexed at open; a reader whose index is behind walks the feed and finds the
same records; ``admin verify`` reports a key missing or left over."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import lmdb
import pytest

from sessionlog.storage import compaction, erasure, feed_index, purge, schema
from sessionlog.storage.store import Store, prepare_append
from sessionlog.v1 import replication_service_pb2 as rpb
from tests.integration.helpers import WriterGate, opened, user
from tests.integration.test_erasure import problems, replicate, tables_dump, write_some


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    with opened(tmp_path / "primary") as primary, opened(tmp_path / "replica") as replica:
        yield primary, replica


def index_keys(store: Store, txn: lmdb.Transaction | None = None) -> list[tuple[str, int]]:
    if txn is None:
        with store.env.begin() as reading:
            return index_keys(store, reading)
    cursor = txn.cursor(db=store.tables.feed_index)
    keys = [bytes(key) for key, _ in cursor if key != feed_index.PROGRESS]
    return [(key[:-9].decode(), schema.read_u64(key[-8:])) for key in keys]


def naming(store: Store, kind: int = 0) -> list[tuple[str, int]]:
    """(session id, position) of every record that names a session (of ``kind``, or any), as
    the feed says."""
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    return sorted((c.session_id, c.position) for c in feed if c.session_id and kind in (0, c.kind))


def left_of(store: Store, *session_ids: str) -> list[tuple[str, int]]:
    """The records that still name these sessions but are not their deletes' own."""
    deletes = naming(store, rpb.CHANGE_KIND_DELETE)
    return [c for c in naming(store) if c[0] in session_ids and c not in deletes]


def write_with_long(store: Store, monkeypatch: pytest.MonkeyPatch, between: bool = False) -> None:
    """``write_some``, then "long": 60 events in 6 appends, a long session here (its delete is a
    purge of 2 records a chunk); ``between``: an append to "keep" after each."""
    monkeypatch.setattr(purge, "PURGE_FROM", 50)
    monkeypatch.setattr(purge, "CHUNK_RECORDS", 2)
    write_some(store)
    for batch in range(6):
        store.append("long", [user(f"long {batch}.{n}") for n in range(10)])
        if between:
            store.append("keep", [user(f"between {batch}")])


def test_the_index_names_each_record_of_a_session_through_erasures_and_on_a_replica(
    pair: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends, a lease, a fork, a redaction, a delete, and a long session's purge in chunks:
    after each, the index holds (session, position) for exactly the records naming a session,
    on the primary and on a replica applying the same records, and verify finds nothing."""
    primary, replica = pair
    write_with_long(primary, monkeypatch, between=True)
    assert index_keys(primary) == naming(primary)
    assert len(naming(primary)) > 10
    primary.redact("keep", [1])
    primary.delete("gone")
    primary.delete("long")  # a tombstone; chunks rewrite its records
    assert primary.purge_all() > 1
    assert left_of(primary, "gone", "long") == []
    assert index_keys(primary) == naming(primary)
    replicate(primary, replica)
    assert index_keys(replica) == naming(replica) == naming(primary)
    assert tables_dump(replica) == tables_dump(primary)
    assert problems(primary) == problems(replica) == []


def test_a_replica_caught_up_before_an_erase_drops_the_same_keys(
    pair: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that holds a session's records when the delete (and a purge's chunks) arrive
    rewrites them and drops their keys as the primary did."""
    primary, replica = pair
    write_with_long(primary, monkeypatch)
    replicate(primary, replica)
    start = replica.tail()[0] + 1
    primary.delete("gone")
    primary.delete("long")
    primary.purge_all()
    replicate(primary, replica, start)
    assert index_keys(replica) == index_keys(primary) == naming(primary)
    assert problems(replica) == []


def test_a_session_recreated_under_a_deleted_id_finds_only_the_records_naming_it(
    store: Store,
) -> None:
    """The first life's records lost their keys with their names; what names the id now is
    the delete's own record and the second life's."""
    store.append("again", [user("first life")])
    store.delete("again")
    store.append("again", [user("second life")], request_id="r")
    named = [p for s, p in naming(store) if s == "again"]
    assert [p for s, p in index_keys(store) if s == "again"] == named
    with store.env.begin() as txn:
        found = erasure.scan(txn, store.tables, ["again"])
    assert found.positions == {"again": named}
    assert len(named) == 2
    assert store.delete("again").feed_records == 2


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with opened(tmp_path / "primary") as opened_store:
        yield opened_store


def forget_the_index(path: Path) -> None:
    """Make the folder a store from before the index: no table (nor its progress)."""
    env = lmdb.open(str(path), max_dbs=len(schema.ALL_DBS))
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(schema.FEED_INDEX, txn=txn), delete=True)
    finally:
        env.close()


def test_a_store_from_before_the_index_is_indexed_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In batches (each its own transaction), before the store serves; a delete then erases
    every record of its session."""
    monkeypatch.setattr(feed_index, "CATCH_UP_RECORDS", 4)
    path = tmp_path / "old"
    with opened(path) as store:
        write_some(store)
        for n in range(7):
            store.append(f"s{n}", [user("x")])
        expected = naming(store)
    forget_the_index(path)
    with opened(path) as store:
        assert index_keys(store) == expected
        with store.env.begin() as txn:
            assert feed_index.indexed(txn, store.tables) == feed_index.newest(txn, store.tables)
        assert store.delete("gone").feed_records == 4
        assert left_of(store, "gone") == []
        assert problems(store) == []


def test_a_reader_whose_index_is_behind_walks_the_feed(store: Store) -> None:
    """With the progress behind the feed (an older version wrote the newest records, with no
    key), the scan takes the index up to it and walks the records after it, and finds what the
    whole index would have found."""
    write_some(store)
    with store.env.begin() as txn:
        by_index = erasure.scan(txn, store.tables, ["gone", "keep", "none"])
    with store.env.begin(write=True) as txn:
        for session_id, position in index_keys(store, txn):
            if position > 2:
                txn.delete(feed_index.key(session_id, position), db=store.tables.feed_index)
        txn.put(feed_index.PROGRESS, schema.u64(2), db=store.tables.feed_index)
        assert not feed_index.complete(txn, store.tables)
        walked = erasure.scan(txn, store.tables, ["gone", "keep", "none"])
        txn.abort()
    assert walked == by_index
    assert by_index.positions["gone"]
    assert by_index.positions["none"] == []


def test_verify_reports_a_key_missing_or_left_over(store: Store) -> None:
    write_some(store)
    (first, *_) = [p for s, p in naming(store) if s == "gone"]
    with store.env.begin(write=True) as txn:
        txn.delete(feed_index.key("gone", first), db=store.tables.feed_index)
        txn.put(feed_index.key("keep", first), b"", db=store.tables.feed_index)
    found = {(p.table, p.where, p.what.split(":")[0]) for p in problems(store)}
    assert found == {
        ("feed_index", f"'gone' at position {first}", "missing"),
        ("feed_index", f"'keep' at position {first}", "left over"),
    }


def test_an_online_copy_of_a_store_from_before_the_index_is_indexed_when_swapped_in(
    tmp_path: Path,
) -> None:
    """A copy taken online of a store without the index (an older server ran it), swapped in
    at the next start after that server wrote more: the records the swap applies move the
    counter, and it must not pass the copy's own records unindexed (a delete then finds them
    all)."""
    path = tmp_path / "old"
    with opened(path) as store:
        write_some(store)
    forget_the_index(path)
    compaction.copy_online(path)
    # The older server writes on (no swap at its start; its records unindexed).
    with closing(Store(path, prepared=True)) as store:
        store.append("keep", [user("written after the copy")])
    forget_the_index(path)
    with opened(path) as store:
        assert not (path / compaction.PENDING).exists()  # swapped in
        assert index_keys(store) == naming(store)
        assert store.delete("gone").feed_records == 4
        assert left_of(store, "gone") == []
        assert problems(store) == []


def test_a_copy_by_a_version_without_the_index_is_indexed_again_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older version's ``admin compact`` copies the tables it knows (no ``feed_index``) and
    the counters whole: the index's progress must not outlive the index (a delete then finds
    every record of its session)."""
    path = tmp_path / "store"
    with opened(path) as store:
        write_some(store)
        expected = naming(store)
    older = tuple(name for name in schema.ALL_DBS if name != schema.FEED_INDEX)
    with monkeypatch.context() as older_version:
        older_version.setattr(schema, "ALL_DBS", older)
        compaction.compact(path)
    with opened(path) as store:
        assert index_keys(store) == expected
        assert store.delete("gone").feed_records == 4
        assert left_of(store, "gone") == []
        assert problems(store) == []


def test_a_delete_in_the_commit_group_of_its_sessions_last_appends_erases_them(
    pair: tuple[Store, Store],
) -> None:
    """The index's progress moves once a group: a delete behind appends of its session in the
    same group walks the group's records, and rewrites them too; a replica ends the same."""
    store, replica = pair
    store.append("grouped", [user("before the group")])
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(30)
    appends = [
        store.submit_append(prepare_append("grouped", [user(f"in the group {n}")]))
        for n in range(3)
    ]
    delete = store.writer.submit(store.delete_command("grouped"))
    gate.release.set()
    held.result(30)
    assert [a.result(30).position for a in appends] == [2, 3, 4]
    assert delete.result(30).feed_records == 4
    assert left_of(store, "grouped") == []
    assert index_keys(store) == naming(store)
    assert problems(store) == []
    replicate(store, replica)
    assert tables_dump(replica) == tables_dump(store)


def test_records_stored_while_the_index_is_behind_leave_its_progress_there(
    tmp_path: Path,
) -> None:
    """Written past a store from before the index without its catch-up (a worker's open): the
    progress stays, a reader walks what is not indexed, and the next open indexes it all."""
    path = tmp_path / "old"
    with opened(path) as store:
        write_some(store)
    forget_the_index(path)
    with closing(Store(path, prepared=True)) as store:
        store.append("keep", [user("past the index")])
        with store.env.begin() as txn:
            assert feed_index.indexed(txn, store.tables) == 0
            assert len(erasure.scan(txn, store.tables, ["gone"]).positions["gone"]) == 4
        assert problems(store) == []  # the key past the progress is no left-over
    with opened(path) as store:
        assert index_keys(store) == naming(store)
        assert store.delete("gone").feed_records == 4
        assert left_of(store, "gone") == []


def test_a_purge_on_a_store_whose_index_stops_partway_rewrites_every_record(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session's chunks take the index up to its progress and walk the records after
    it (an older version wrote them, with no key): none is left naming the session."""
    monkeypatch.setattr(purge, "PURGE_FROM", 50)
    monkeypatch.setattr(purge, "CHUNK_RECORDS", 2)
    for batch in range(6):
        store.append("long", [user(f"long {batch}.{n}") for n in range(10)])
        store.append("keep", [user(f"between {batch}")])
    with store.env.begin(write=True) as txn:
        for session_id, position in index_keys(store, txn):
            if position > 5:
                txn.delete(feed_index.key(session_id, position), db=store.tables.feed_index)
        txn.put(feed_index.PROGRESS, schema.u64(5), db=store.tables.feed_index)
    store.delete("long")
    assert store.purge_all() > 1
    assert left_of(store, "long") == []


def test_a_lease_taken_before_the_sessions_first_write_is_found_by_its_delete(
    store: Store,
) -> None:
    """The lease's record names the session by id before it has a sid: the index keys it by
    that id, and the delete rewrites it with the rest."""
    store.submit_lease("acquire", "early", "worker", 60_000_000_000).result()
    store.append("early", [user("after the lease")], lease_holder="worker")
    store.submit_lease("release", "early", "worker").result()
    assert [s for s, _ in index_keys(store)].count("early") == 3
    assert store.delete("early").feed_records == 3
    assert left_of(store, "early") == []


def test_an_online_copy_swapped_in_after_an_erase_holds_the_keys_the_folder_held(
    tmp_path: Path,
) -> None:
    """A delete after the copy was taken rewrites records the copy holds: the swap applies it
    to the copy, whose keys then follow the records as the folder's did."""
    path = tmp_path / "store"
    with opened(path) as store:
        write_some(store)
    compaction.copy_online(path)
    with closing(Store(path, prepared=True)) as store:  # the server runs on: no swap yet
        store.delete("gone")
        store.append("keep", [user("after the delete")])
        before = index_keys(store)
    with opened(path) as store:
        assert not (path / compaction.PENDING).exists()  # swapped in
        assert index_keys(store) == before == naming(store)
        assert left_of(store, "gone") == []
        assert problems(store) == []


def test_a_new_life_deleted_before_the_old_lifes_purge_leaves_its_records_to_the_purge(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session deleted (a tombstone), a new session under its id, deleted at once: the
    old life's records still name the id, but they are its purge's to rewrite (with its own
    removals), so none keeps a put of the old life (its request records)."""
    monkeypatch.setattr(purge, "PURGE_FROM", 50)
    store.append("again", [user(f"first life {n}") for n in range(60)], request_id="first")
    old_sid = store.delete("again").meta.sid
    store.append("again", [user("second life")])
    store.delete("again")
    store.purge_all()
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    kept = [
        (c.position, put.table)
        for c in feed
        for put in c.puts
        if put.table == "requests" and put.key.startswith(schema.u64(old_sid))
    ]
    assert kept == []
    assert left_of(store, "again") == []
    assert problems(store) == []
