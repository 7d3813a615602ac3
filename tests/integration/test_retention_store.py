"""The retention sweep against a real LMDB: the expiry index follows every record write, a
sweep deletes exactly the due sessions through DeleteCommand (audit actor and reason, DELETE on
the feed a replica applies), pinned sessions stay, and the in-transaction re-check keeps a
session that is no longer due."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog.records import SessionRecord
from sessionlog.retention import NS, Policy
from sessionlog.storage import retention, schema
from sessionlog.storage.store import Store
from tests.integration.helpers import opened, user
from tests.integration.test_erasure import replicate, tables_dump


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with opened(tmp_path / "primary") as opened_store:
        yield opened_store


def set_retention(store: Store, session_id: str, expire_time_ns: int, pinned: bool) -> None:
    given = SessionRecord(expire_time_ns=expire_time_ns, pinned=pinned)
    store.submit_update(session_id, given, ["expire_time", "pinned"]).result()


def expiry_index(store: Store) -> list[tuple[int, str]]:
    with store.env.begin() as txn:
        return [schema.expiry_key_parts(bytes(k)) for k, _ in txn.cursor(db=store.tables.expiry)]


def audit(store: Store) -> list[tuple[str, str, str]]:
    with store.env.begin() as txn:
        found = [schema.ErasureRecord.decode(v) for _, v in txn.cursor(db=store.tables.erasures)]
    return [(r.session_id, r.actor, r.reason) for r in found]


def test_the_expiry_index_holds_unpinned_expiring_sessions_only(store: Store) -> None:
    """Setting, moving, pinning and clearing an expiry moves the one index key to match."""
    store.append("s", [user("x")])
    set_retention(store, "s", 5 * NS, False)
    assert expiry_index(store) == [(5 * NS, "s")]
    set_retention(store, "s", 9 * NS, False)
    assert expiry_index(store) == [(9 * NS, "s")]
    set_retention(store, "s", 9 * NS, True)
    assert expiry_index(store) == []
    set_retention(store, "s", 9 * NS, False)
    set_retention(store, "s", 0, False)
    assert expiry_index(store) == []
    set_retention(store, "s", 3 * NS, False)
    store.delete("s")
    assert expiry_index(store) == []


def test_a_sweep_deletes_due_sessions_and_a_replica_follows(store: Store, tmp_path: Path) -> None:
    """Expired and idle sessions go, each with its audit reason; pinned, future and active
    ones stay; the replica that applies the feed ends with the same tables."""
    for session_id in ("past", "pinned", "future", "plain"):
        store.append(session_id, [user(session_id)])
    now = time.time_ns()
    set_retention(store, "past", now - NS, False)
    set_retention(store, "pinned", now - NS, True)
    set_retention(store, "future", now + 3600 * NS, False)
    swept = store.sweep(Policy())
    assert (swept.expired, swept.idle, swept.events) == (1, 0, 1)
    assert store.session("past").meta is None
    assert all(store.session(s).meta is not None for s in ("pinned", "future", "plain"))
    assert audit(store) == [("past", "retention", "expired")]
    time.sleep(1.0)
    store.append("plain2", [user("fresh")])
    swept = store.sweep(Policy(idle_ns=round(0.9 * NS)))
    assert (swept.expired, swept.idle) == (0, 2)  # "future" and "plain"; "plain2" is fresh
    assert [s for s in ("pinned", "future", "plain", "plain2") if store.session(s).meta] == [
        "pinned",
        "plain2",
    ]
    assert sorted(audit(store)[1:]) == [  # oldest update first: "future" was updated last
        ("future", "retention", "retention policy"),
        ("plain", "retention", "retention policy"),
    ]
    with opened(tmp_path / "replica") as replica:
        replicate(store, replica)
        mine, theirs = tables_dump(store), tables_dump(replica)
        for table in ("sessions", "events", "records", "recent", "expiry", "erasures"):
            assert mine[table] == theirs[table], table


def test_the_delete_rechecks_in_its_transaction(store: Store) -> None:
    """A session picked as due but pinned or extended before its delete commits is kept."""
    store.append("s", [user("x")])
    now = time.time_ns()
    set_retention(store, "s", now - NS, False)
    with store.env.begin() as txn:
        picked = retention.expired(txn, store.tables, time.time_ns(), 10)
    assert picked == ["s"]
    set_retention(store, "s", now + 3600 * NS, False)  # extended after it was picked
    check = retention.still_due(store.tables, Policy(), "expired")
    done = store.delete_batch(picked, actor="retention", reason="expired", still_due=check)
    assert done == (0, 0, 0)
    assert store.session("s").meta is not None
    assert audit(store) == []


def test_a_sweep_leaves_sessions_that_are_not_ours(store: Store) -> None:
    """Sharded, ``ours`` (the ownership check) keeps another group's expired copy; the sweep
    deletes the group's own."""
    for session_id in ("mine", "theirs"):
        store.append(session_id, [user(session_id)])
        set_retention(store, session_id, time.time_ns() - NS, False)
    swept = store.sweep(Policy(), ours=lambda session_id: session_id != "theirs")
    assert swept.expired == 1
    assert store.session("mine").meta is None
    assert store.session("theirs").meta is not None


def test_the_idle_walk_resumes_past_its_scan_limit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more pinned idle sessions than one walk reads, the next sweeps go on from where the
    last stopped and reach the unpinned session behind them."""
    monkeypatch.setattr(retention, "SCAN_LIMIT", 3)
    for n in range(7):
        store.append(f"held-{n}", [user("x")])
        set_retention(store, f"held-{n}", 0, True)
    time.sleep(0.01)
    store.append("idle", [user("x")])
    time.sleep(0.3)
    policy = Policy(idle_ns=round(0.2 * NS))
    deleted = [store.sweep(policy).idle for _ in range(4)]
    assert sum(deleted) == 1
    assert deleted[0] == 0  # the first walk stopped among the pinned ones
    assert store.session("idle").meta is None
    assert all(store.session(f"held-{n}").meta is not None for n in range(7))


def test_expiring_counts_the_expiry_index(store: Store) -> None:
    """``Store.expiring`` (the metrics gauge) counts unpinned sessions with an expiry."""
    for session_id, pinned in (("a", False), ("b", True), ("c", False)):
        store.append(session_id, [user("x")])
        set_retention(store, session_id, time.time_ns() + 3600 * NS, pinned)
    assert store.expiring() == 2


def test_the_recheck_keeps_the_audit_reason_true(store: Store) -> None:
    """A session picked as expired whose expiry was then cleared is not deleted as "expired",
    even though the idle policy would delete it: the idle walk's sweep does, with its reason."""
    store.append("s", [user("x")])
    set_retention(store, "s", time.time_ns() - NS, False)
    set_retention(store, "s", 0, False)  # cleared after it was picked
    time.sleep(0.05)
    policy = Policy(idle_ns=round(0.01 * NS))
    expired_check = retention.still_due(store.tables, policy, "expired")
    assert (
        store.delete_batch(["s"], actor="retention", reason="expired", still_due=expired_check)[0]
        == 0
    )
    assert store.sweep(policy).idle == 1
    assert audit(store) == [("s", "retention", "retention policy")]
