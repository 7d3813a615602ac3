"""Store.lease_audit on a real LMDB: one ordered walk over every session's audit records, with a
prefix, a resume point and a filter (what ListLeaseAudit pages through)."""

from __future__ import annotations

from pathlib import Path

from sessionlog.storage.store import Store
from tests.integration.helpers import opened

MINUTE_NS = 60 * 10**9


def force_release(store: Store, session_id: str, holder: str) -> None:
    """One audited change: ``holder`` takes the lease and an operator forces it free."""
    store.submit_lease("acquire", session_id, holder, MINUTE_NS).result()
    store.submit_lease("release", session_id, "ops", force=True).result()


def walk(store: Store, **options: object) -> list[tuple[str, int, str]]:
    entries, _ = store.lease_audit(**options)  # type: ignore[arg-type]
    return [(e.session_id, e.index, e.record.previous_holder) for e in entries]


def test_records_come_in_session_id_byte_order_then_record_order(tmp_path: Path) -> None:
    """ "ab" sorts after "a.x" and "a" before both (its records never interleave with "ab"'s);
    within a session the records keep the order they were written."""
    with opened(tmp_path / "db") as store:
        for session_id, holder in [("ab", "1"), ("a", "2"), ("a.x", "3"), ("a", "4"), ("ab", "5")]:
            force_release(store, session_id, holder)
        store.submit_lease("acquire", "plain", "w", MINUTE_NS).result()
        store.submit_lease("release", "plain", "w").result()  # not audited
        assert walk(store) == [
            ("a", 0, "2"),
            ("a", 1, "4"),
            ("a.x", 0, "3"),
            ("ab", 0, "1"),
            ("ab", 1, "5"),
        ]
        assert walk(store, prefix="a.") == [("a.x", 0, "3")]
        assert walk(store, prefix="ab") == [("ab", 0, "1"), ("ab", 1, "5")]


def test_a_walk_resumes_strictly_after_a_record_and_filters(tmp_path: Path) -> None:
    """after= starts past the named record (even one that sorts before the prefix); limit says
    whether more follow; keep= drops sessions without counting them against the limit."""
    with opened(tmp_path / "db") as store:
        for session_id in ("s1", "s1", "s2", "s3"):
            force_release(store, session_id, session_id)
        first, more = store.lease_audit(limit=2)
        assert [(e.session_id, e.index) for e in first] == [("s1", 0), ("s1", 1)]
        assert more
        assert walk(store, after=("s1", 1), limit=2) == [("s2", 0, "s2"), ("s3", 0, "s3")]
        _, more = store.lease_audit(after=("s1", 1), limit=2)
        assert not more
        assert walk(store, after=("a", 0), prefix="s3") == [("s3", 0, "s3")]
        kept = walk(store, keep=lambda session_id: session_id != "s2", limit=3)
        assert kept == [("s1", 0, "s1"), ("s1", 1, "s1"), ("s3", 0, "s3")]
