"""The parent tree in the store: children and forks indexed under their parent, walked breadth
first by ``Store.descendants`` (the hook a tree's usage totals will use)."""

from __future__ import annotations

from sessionlog.records import SessionRecord
from sessionlog.storage.store import Store, prepare_append
from sessionlog.v1 import event_pb2


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
