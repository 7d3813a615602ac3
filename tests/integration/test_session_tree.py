"""The session indexes in the store: children and forks under their parent, walked breadth first
by ``Store.descendants`` (the hook a tree's usage totals will use), and ``Store.reindex``, which
indexes what a server older than the indexes wrote."""

from __future__ import annotations

from pathlib import Path

from sessionlog.records import SessionRecord
from sessionlog.storage import changes
from sessionlog.storage.records import BY_UPDATE
from sessionlog.storage.store import Store, prepare_append
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb


def child(store: Store, session_id: str, parent: str) -> None:
    batch = prepare_append(session_id, [], create_only=True)
    batch.record, batch.parent_id = SessionRecord(parent_seq=0), parent
    store.submit_append(batch).result()


def test_descendants_walk_children_and_forks_breadth_first(store: Store) -> None:
    """Two levels of children and a fork; the limit cuts the walk; a leaf has none."""
    tool = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
    store.append("root", [tool])
    for name in ("root.b", "root.a"):
        child(store, name, "root")
    store.append("root.a", [tool])
    child(store, "root.a.1", "root.a")
    store.submit_fork("root", None, "root.fork").result()
    assert store.descendants("root") == ["root.a", "root.b", "root.fork", "root.a.1"]
    assert store.descendants("root", limit=2) == ["root.a", "root.b"]
    assert store.descendants("root.a") == ["root.a.1"]
    assert store.descendants("root.b") == []
    assert store.meta("root.a.1").parent_id == "root.a"  # type: ignore[union-attr]


def test_reindex_gives_an_older_servers_sessions_their_index_entries(tmp_path: Path) -> None:
    """Sessions whose index entries are missing (written before the indexes existed) get them
    from ``reindex``, batch by batch, as replicated change records; a second run writes nothing."""
    path = tmp_path / "data"
    store = Store(path)
    tool = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
    names = [f"old{i:04d}" for i in range(2500)]
    for name in names[:10]:
        store.append(name, [tool])
    batch = [prepare_append(name, [tool]) for name in names[10:]]
    for future in [store.submit_append(b) for b in batch]:
        future.result()
    store.submit_fork("old0000", None, "old-fork").result()
    with store.env.begin(write=True) as txn:  # what an older server left: no index entries
        txn.drop(store.tables.recent, delete=False)
        txn.drop(store.tables.children, delete=False)
    assert store.unindexed()
    assert store.list_records(order=BY_UPDATE, limit=5)[0] == []
    head = store.head()[0]
    assert store.reindex() == len(names) + 2  # a recent key each, and the fork's children key
    assert not store.unindexed()
    assert store.head()[0] == head + 2  # two batches of at most REINDEX_BATCH sessions
    assert store.descendants("old0000") == ["old-fork"]
    page, _ = store.list_records(order=BY_UPDATE, limit=3000)
    assert sorted(v.session_id for v in page) == sorted([*names, "old-fork"])
    assert page[0].session_id == "old-fork"
    assert store.reindex() == 0
    assert store.head()[0] == head + 2
    store.close()


class _Recorded:
    """What encode_change reads of a RecordingTxn."""

    def __init__(self, puts: list[tuple[str, bytes, bytes | None]]) -> None:
        self.puts, self.event_sid, self.first_seq, self.event_count = puts, -1, 0, 0
        self.deletes: list[tuple[str, bytes, bytes]] = []
        self.erased_positions: list[int] = []


def test_an_index_move_is_a_removal_then_a_put_in_the_change_record() -> None:
    """A removal (value None) encodes as StoragePut.remove, byte for byte what protobuf writes,
    in the order made, so a replica that applies the puts in turn ends with the same keys."""
    puts = [("recent", b"old-key", None), ("recent", b"new-key", b""), ("records", b"s", b"x")]
    raw = changes.encode_change(9, "update", "s", 5, _Recorded(puts))  # type: ignore[arg-type]
    expected = rpb.Change(
        position=9,
        kind=rpb.CHANGE_KIND_UPDATE,
        session_id="s",
        puts=[
            rpb.StoragePut(table="recent", key=b"old-key", remove=True),
            rpb.StoragePut(table="recent", key=b"new-key"),
            rpb.StoragePut(table="records", key=b"s", value=b"x"),
        ],
    )
    expected.commit_time.FromNanoseconds(5)
    assert raw == expected.SerializeToString()
