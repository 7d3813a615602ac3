"""A long session's delete against a real LMDB: a tombstone readers see at once, then chunks
that free its records and rows, each a change record a replica applies to the same bytes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage import purge, schema
from sessionlog.storage.store import Store, prepare_append
from sessionlog.v1 import replication_service_pb2 as rpb
from tests.integration.helpers import WriterGate, opened, user
from tests.integration.test_erasure import SECRET, problems, replicate, tables_dump


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session of 100 events is long here, a chunk frees 64 keys or 3 records, and rides
    one group per millisecond at most while writes flow."""
    monkeypatch.setattr(purge, "PURGE_FROM", 100)
    monkeypatch.setattr(purge, "PACE_SECONDS", 0.001)
    monkeypatch.setattr(purge, "CHUNK_KEYS", 64)
    monkeypatch.setattr(purge, "CHUNK_RECORDS", 3)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    with opened(tmp_path / "primary") as primary, opened(tmp_path / "replica") as replica:
        yield primary, replica


def write_long(store: Store) -> int:
    """Session "long": 300 events in 10 appends (each with a request id and usage), between
    appends of "other"; its sid."""
    for batch in range(10):
        events = [user(f"{SECRET} {batch}.{n}") for n in range(30)]
        events[0].usage.model, events[0].usage.input_tokens = "m-1", 5
        store.append("long", events, request_id=f"r{batch}")
        store.append("other", [user(f"kept {batch}")])
    meta = store.meta("long")
    assert meta is not None
    return meta.sid


def rows_of(store: Store, sid: int) -> int:
    """Keys of ``sid`` left in the sid-keyed tables."""
    left = 0
    with store.env.begin() as txn:
        for name in purge.CHUNKED:
            for key, _ in txn.cursor(db=store.tables.by_name[name]):
                left += key[:8] == schema.u64(sid)
    return left


def named(store: Store, session_id: str) -> list[int]:
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    return [c.position for c in feed if c.session_id == session_id]


def test_the_tombstone_hides_the_session_at_once_and_the_chunks_free_the_rest(
    pair: tuple[Store, Store],
) -> None:
    """After the delete nothing reads the session, but its rows and records are still there,
    marked; the chunks (more than one) free them; the feed verifies at every step."""
    store, _ = pair
    sid = write_long(store)
    before = store.head()[0]
    result = store.delete("long")
    assert result.event_count == 300
    assert store.meta("long") is None
    assert store.read_session("long", 0) == []
    with pytest.raises(errors.SessionNotFound):
        store.delete("long")
    assert [mark.session_id for mark in store.purging()] == ["long"]
    assert store.purging_count() == 1  # the metrics' gauge
    assert rows_of(store, sid) > 300
    assert problems(store) == []  # verify knows the rows are being freed
    tombstone = rpb.Change.FromString(store.read_changes(before + 1)[0])
    assert (tombstone.kind, tombstone.session_id) == (rpb.CHANGE_KIND_DELETE, "long")
    chunks = store.purge_all()
    assert chunks > 300 // 64
    assert store.purging() == []
    assert store.purging_count() == 0
    assert rows_of(store, sid) == 0
    dump = tables_dump(store)
    assert all(SECRET.encode() not in v for name, rows in dump.items() for _, v in rows), dump
    assert named(store, "long") == [tombstone.position]
    chunks_records = [rpb.Change.FromString(raw) for raw in store.read_changes(before + 2)]
    assert len(chunks_records) == chunks  # the last of them removes the mark
    for record in chunks_records:  # feed followers show nothing of them
        assert (record.kind, record.session_id) == (rpb.CHANGE_KIND_UPDATE, "")
    assert store.read_session("other", 0)[9]
    assert problems(store) == []


def test_a_replica_following_the_chunks_ends_with_the_same_bytes(
    pair: tuple[Store, Store],
) -> None:
    """A replica applying the tombstone and each chunk as they come holds what the primary
    holds after every step, and no secret."""
    primary, replica = pair
    write_long(primary)
    replicate(primary, replica)
    primary.delete("long")
    position = primary.head()[0]
    replicate(primary, replica, position)
    while primary.purge_next() is not None:
        replicate(primary, replica, position + 1)
        position = primary.head()[0]
        assert tables_dump(replica) == tables_dump(primary)
    assert replica.purging() == []
    assert problems(replica) == []


def test_a_restart_resumes_the_purge_where_its_mark_is(tmp_path: Path) -> None:
    """Chunks stopped half-way (a closed store: what a crash leaves) go on after a reopen, and
    the id can be written again meanwhile without meeting the old rows."""
    with opened(tmp_path / "s") as store:
        sid = write_long(store)
        store.delete("long")
        for _ in range(3):
            assert store.purge_next() is not None
        store.append("long", [user("a new life")])
    with opened(tmp_path / "s") as store:
        [mark] = store.purging()
        assert mark.scanned > 0
        store.purge_all()
        assert rows_of(store, sid) == 0
        assert len(store.read_session("long", 0)) == 1
        assert problems(store) == []


def test_a_short_session_is_still_deleted_in_one_write(pair: tuple[Store, Store]) -> None:
    """Below ``PURGE_FROM`` events nothing is left to purge after the delete."""
    store, _ = pair
    store.append("short", [user("one"), user("two")])
    store.delete("short")
    assert store.purging() == []
    assert problems(store) == []


def test_a_long_forks_delete_removes_its_parents_fork_request_at_once(
    pair: tuple[Store, Store],
) -> None:
    """The parent's request record of the fork that made a long child (kept under the parent's
    sid, not the child's) goes with the tombstone: a retry of that fork forks again."""
    store, _ = pair
    write_long(store)
    store.submit_fork("long", None, "child", request_id="fork-1").result()
    parent = store.meta("long")
    assert parent is not None

    def parents_requests() -> int:
        with store.env.begin() as txn:
            return sum(
                key[:8] == schema.u64(parent.sid) for key, _ in txn.cursor(db=store.tables.requests)
            )

    before = parents_requests()
    store.delete("child")
    assert parents_requests() == before - 1
    store.purge_all()
    assert store.submit_fork("long", None, "child", request_id="fork-1").result()
    assert len(store.read_session("child", 0)) == 300
    assert problems(store) == []


def test_a_chunk_stops_when_its_time_is_up_and_a_replica_removes_the_same_keys(
    pair: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time at all, every chunk stops at its first look at the clock (CHECK_EVERY keys
    or records); the ranges it records leave a replica with the same bytes."""
    monkeypatch.setattr(purge, "CHUNK_SECONDS", 0.0)
    monkeypatch.setattr(purge, "ALONE_SECONDS", 0.0)  # the writer is idle: they run alone
    monkeypatch.setattr(purge, "CHUNK_RECORDS", 100)
    monkeypatch.setattr(purge, "CHECK_EVERY", 4)
    primary, replica = pair
    sid = write_long(primary)
    rows = rows_of(primary, sid)
    replicate(primary, replica)
    primary.delete("long")
    position = primary.head()[0]
    replicate(primary, replica, position)
    freed, rewritten = [], []
    while (chunk := primary.purge_next()) is not None:
        freed.append(chunk.freed)
        rewritten.append(chunk.rewritten)
        replicate(primary, replica, position + 1)
        position = primary.head()[0]
        assert tables_dump(replica) == tables_dump(primary)
    assert rewritten[:10] == [1] * 10  # one record each (it looks after every one), not 100
    assert max(freed) == 4  # nor the 64 keys of CHUNK_KEYS
    assert sum(freed) == rows > 300  # events, request and usage rows
    assert rows_of(primary, sid) == 0
    assert tables_dump(replica) == tables_dump(primary)
    assert problems(replica) == []


def test_a_purge_completes_beside_continuous_appends(
    pair: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session appended to without a pause never leaves the writer idle, yet the
    purge runs to its end, its chunks riding in the appends' transactions."""
    monkeypatch.setattr(purge, "CHUNK_KEYS", 8)
    store, _ = pair
    sid = write_long(store)
    before = store.head()[0]
    stop = threading.Event()

    def appender() -> None:
        while not stop.is_set():
            store.append("busy", [user("meanwhile")])

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        store.delete("long")
        chunks = store.purge_all()
    finally:
        stop.set()
        thread.join(30)
    assert rows_of(store, sid) == 0
    assert store.purging() == []
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(before + 2)]
    appended = {c.commit_time.ToNanoseconds() for c in feed if c.session_id == "busy"}
    chunk_times = [c.commit_time.ToNanoseconds() for c in feed if not c.session_id]
    assert len(chunk_times) == chunks > 320 // 8
    assert sum(t in appended for t in chunk_times) > chunks // 2  # most shared a commit
    assert problems(store) == []


def test_a_chunk_riding_with_an_append_keeps_the_shorter_time(
    pair: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the end of an append's group a chunk has CHUNK_SECONDS (none here: it stops at its
    first look at the clock); alone, with the writer idle, ALONE_SECONDS (plenty)."""
    monkeypatch.setattr(purge, "CHUNK_SECONDS", 0.0)
    monkeypatch.setattr(purge, "ALONE_SECONDS", 60.0)
    monkeypatch.setattr(purge, "CHUNK_RECORDS", 100)
    store, _ = pair
    sid = write_long(store)
    store.delete("long")
    assert store.purge_next() is not None  # alone: the 10 records in one chunk
    [mark] = store.purging()
    assert mark.scanned == mark.upto
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(30)
    rider = store.writer.submit_background(purge.PurgeCommand(store.tables, sid))
    appended = store.submit_append(prepare_append("other", [user("carrier")]))
    gate.release.set()
    held.result(30)
    appended.result(30)
    assert rider.result(30).freed == purge.CHECK_EVERY
    alone = store.purge_next()
    assert alone is not None
    assert alone.freed == purge.CHUNK_KEYS


def test_closing_the_store_mid_purge_ends_the_writers_command_and_keeps_the_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer runs a purge's command again and again, but a close ends it after one more
    chunk: its future holds that chunk (``more``), and the next start goes on from the mark."""
    monkeypatch.setattr(purge, "ALONE_SECONDS", 0.0)  # a chunk a look at the clock: many
    with opened(tmp_path / "s") as store:
        sid = write_long(store)
        store.delete("long")
        started = store.start_purge()
        assert started is not None
    last = started.result(0)  # resolved by the close
    assert last.more
    with opened(tmp_path / "s") as store:
        assert [mark.sid for mark in store.purging()] == [sid]
        assert store.purge_all() > 0
        assert rows_of(store, sid) == 0
        assert problems(store) == []
