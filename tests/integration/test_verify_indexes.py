"""`admin verify` checks the session records against their indexes (``recent``, ``labels``,
``children``): a store written through the API verifies clean, and each kind of wrong entry,
planted by hand, is named."""

from __future__ import annotations

from pathlib import Path

from sessionlog.records import SessionRecord
from sessionlog.storage import changes, integrity, schema
from sessionlog.storage.store import Store
from tests.integration.helpers import opened, user


def problems(store: Store) -> list[str]:
    found, _ = integrity.verify(store.env, store.tables, change_checks=[changes.ChecksumChain()])
    return [str(problem) for problem in found]


def written(store: Store) -> None:
    """Sessions with records, labels, an owner, a fork, a sub-agent child, a delete."""
    store.append("v.main", [user("a"), user("b")])
    store.submit_update(
        "v.main", SessionRecord(labels={"team": "core"}, owner="ana"), None
    ).result()
    store.submit_fork("v.main", None, "v.fork").result()
    store.append("v.gone", [user("c")])
    store.submit_fork("v.gone", None, "v.orphan").result()
    store.delete("v.gone")


def test_a_store_written_through_the_api_verifies_clean(tmp_path: Path) -> None:
    """Records, labels, owners, forks and a delete leave indexes that verify finds true."""
    with opened(tmp_path / "data") as store:
        written(store)
        assert problems(store) == []
        _, counts = integrity.verify(store.env, store.tables)
        assert (counts["records"], counts["recent"], counts["children"]) == (2, 3, 2)


def test_verify_names_index_entries_missing_or_left_over(tmp_path: Path) -> None:
    """A stale update-time key, a label the record lacks, a missing child link and a record of
    no session are each reported, in their table."""
    with opened(tmp_path / "data") as store:
        written(store)
        tables = store.tables
        with store.env.begin(write=True) as txn:
            txn.put(schema.recent_key(5, "v.main"), b"", db=tables.recent)
            txn.put(schema.label_prefix("team", "other") + b"v.main", b"", db=tables.labels)
            txn.delete(schema.child_prefix("v.main") + b"v.fork", db=tables.children)
            txn.put(b"v.never", schema.encode_record(SessionRecord(title="t")), db=tables.records)
        found = problems(store)
    assert "recent: 'v.main' at 5 ns: left over: no session or record has it" in found
    assert "labels: team other v.main: left over: no session or record has it" in found
    assert any(p.startswith("children: v.main v.fork: missing") for p in found), found
    assert "records: 'v.never': the record of a session that is not stored" in found
    assert len(found) == 4, found
