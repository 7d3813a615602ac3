"""Change records chain by checksum, positions come from the store, and a replica refuses a
record that does not follow its own history. Real LMDB in temporary folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage import changes, folder, integrity, schema
from sessionlog.storage.changes import ReceivedChange
from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import opened, user


def _records(store: Store) -> list[bytes]:
    return store.read_changes(1)


def _write(store: Store, session_id: str, count: int) -> None:
    for n in range(count):
        store.append(session_id, [user(f"{session_id}-{n}")])


def test_every_record_chains_from_the_one_before(tmp_path: Path) -> None:
    """Each stored checksum is SHA-256 over the previous checksum, the record without it and its
    events, so one checksum stands for the whole feed up to it."""
    with opened(tmp_path / "d") as store:
        _write(store, "a", 3)
        store.submit_lease("acquire", "a", "w", 10**9).result()
        _write(store, "b", 2)
        previous = b""
        for raw in _records(store):
            received = ReceivedChange.parse(raw)
            body = changes.without_checksum(received.record, received.change.checksum)
            assert len(received.change.checksum) == changes.CHECKSUM_BYTES
            assert changes.chain(previous, body, received.events) == received.change.checksum
            previous = received.change.checksum
        assert store.tail() == (6, previous)


_CHILD = """
import sys
from pathlib import Path
from sessionlog.storage import folder
from sessionlog.storage.store import Store
from sessionlog.v1.event_pb2 import Event, EventType

path, fd, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = Store(path, lock=folder.FolderLock(path, fd))
print("ready", flush=True)
sys.stdin.readline()  # both stores are open: now write at the same time as the parent
for n in range(count):
    event = Event(type=EventType.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": str(n)})
    store.append("child", [event])
store.writer.close()
store.env.close()
"""


def test_processes_sharing_a_folder_take_positions_from_the_store(tmp_path: Path) -> None:
    """Two processes writing one folder under one lock (as one server's workers will) write
    dense positions with no record overwritten: nothing cached decides a position."""
    path = tmp_path / "d"
    lock = folder.acquire(path)
    parent = Store(path, lock=lock)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(lock.fd), "60"],
            pass_fds=(lock.fd,),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
        for n in range(60):
            parent.append("parent", [user(str(n))])
        child.stdin.close()
        child.stdout.close()
        assert child.wait(60) == 0
        records = [rpb.Change.FromString(ReceivedChange.parse(r).record) for r in _records(parent)]
        assert [c.position for c in records] == list(range(1, 121))
        assert sorted({c.session_id for c in records}) == ["child", "parent"]
        for session_id in ("child", "parent"):
            meta = parent.meta(session_id)
            assert meta is not None
            assert meta.next_seq == 60
            assert len(parent.read_events(meta.sid, 0)) == 60
    finally:
        parent.close()


def test_a_record_that_does_not_follow_this_history_is_refused(tmp_path: Path) -> None:
    """Applying a primary's change 2 on top of a different change 1 fails with HISTORY_DIVERGED
    and applies nothing; on top of the same change 1 it applies."""
    with opened(tmp_path / "primary") as primary, opened(tmp_path / "other") as other:
        _write(primary, "p", 2)
        _write(other, "o", 1)
        feed = [ReceivedChange.parse(r) for r in _records(primary)]
        diverged = Store(tmp_path / "replica")
        try:
            diverged.submit_apply([ReceivedChange.parse(_records(other)[0])]).result()
            with pytest.raises(errors.HistoryDiverged):
                diverged.submit_apply(feed[1:]).result()
            assert diverged.head()[0] == 1
            assert diverged.meta("p") is None
        finally:
            diverged.close()
        with opened(tmp_path / "faithful") as faithful:
            faithful.submit_apply(feed[:1]).result()
            faithful.submit_apply(feed[1:]).result()
            assert faithful.tail() == primary.tail()


def test_check_after_names_missing_and_different_positions(tmp_path: Path) -> None:
    """The feed's connect check passes the same checksum, and refuses a position past the end or
    a different checksum (HistoryDiverged), and an empty checksum checks nothing."""
    with opened(tmp_path / "d") as store:
        _write(store, "a", 3)
        position, checksum = store.tail()
        store.check_feed_after(position + 1, checksum)
        store.check_feed_after(position + 1, b"")
        with pytest.raises(errors.HistoryDiverged):
            store.check_feed_after(position + 1, bytes(16))
        with pytest.raises(errors.HistoryDiverged, match="ends at position 3"):
            store.check_feed_after(position + 5, checksum)


def test_a_batch_with_one_foreign_record_writes_nothing(tmp_path: Path) -> None:
    """A batch whose first change follows but whose second comes from another history is
    refused whole: not even the first change is applied."""
    with opened(tmp_path / "primary") as primary, opened(tmp_path / "other") as other:
        _write(primary, "p", 2)
        _write(other, "o", 2)
        mixed = [
            ReceivedChange.parse(_records(primary)[0]),
            ReceivedChange.parse(_records(other)[1]),
        ]
        with opened(tmp_path / "replica") as replica:
            with pytest.raises(errors.HistoryDiverged):
                replica.submit_apply(mixed).result()
            assert replica.head() == (0, 0)
            assert replica.meta("p") is None


def test_verify_finds_an_event_rewritten_in_place_by_its_checksum(tmp_path: Path) -> None:
    """An event replaced by other bytes that still decode (same seq, other content) passes every
    decode check, but ``admin verify``'s checksum chain names its change record."""
    with opened(tmp_path / "d") as store:
        _write(store, "a", 3)
        meta = store.meta("a")
        assert meta is not None
        forged = Event.FromString(store.read_events(meta.sid, 1, 2)[0])
        forged.data["content"] = "not what was written"
        with store.env.begin(write=True) as txn:
            txn.put(
                schema.event_key(meta.sid, 1), forged.SerializeToString(), db=store.tables.events
            )
        clean, _ = integrity.verify(store.env, store.tables)
        assert clean == []
        problems, _ = integrity.verify(
            store.env, store.tables, change_checks=[changes.ChecksumChain()]
        )
        assert [p.where for p in problems] == ["position 2"]
        assert "checksum" in problems[0].what
