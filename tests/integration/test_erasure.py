"""Erasure against a real LMDB: DeleteSession and RedactEvents in every table, in the change
feed (placeholders, the chain, replicas applying it from any point), in the fold memo, and in
the data file (what lingers until `admin compact`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage import changes, compaction, folder, integrity, rebuild, schema, usage
from sessionlog.storage.changes import ReceivedChange
from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import USER, event, opened, user

SECRET = "SECRET-7f3a-please-forget-me"
REDACTED_TEXT = "SECRET-91c2-redact-this-line"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with opened(tmp_path / "primary") as opened_store:
        yield opened_store


def problems(store: Store) -> list[integrity.Problem]:
    found, _ = integrity.verify(store.env, store.tables, change_checks=[changes.ChecksumChain()])
    return found


def tables_dump(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every table but the folder-local counters."""
    local = {schema.INSTANCE, schema.HISTORY_ID, schema.HISTORY_START, schema.LEADERSHIP}
    local |= {schema.FOLLOWS}
    dump: dict[str, list[tuple[bytes, bytes]]] = {}
    with store.env.begin() as txn:
        for name, db in store.tables.by_name.items():
            rows = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
            if name == "counters":
                rows = [(k, v) for k, v in rows if k not in local]
            dump[name] = rows
    return dump


def replicate(primary: Store, replica: Store, start: int = 1) -> None:
    """Apply the primary's feed from ``start`` on to the replica, as a replica does."""
    received = [ReceivedChange.parse(raw) for raw in primary.read_changes(start)]
    if received:
        replica.submit_apply(received).result()


def write_some(store: Store) -> None:
    store.append("keep", [user("kept one"), user("kept two")])
    spent = user(SECRET)
    spent.usage.model, spent.usage.input_tokens = "m-1", 7  # a row in the usage ledger
    store.append("gone", [spent, user("hello")])
    store.submit_lease("acquire", "gone", "worker", 60_000_000_000).result()
    store.submit_lease("release", "gone", "worker").result()
    store.append("gone", [user("more " + SECRET)], request_id="r1")
    store.submit_fork("gone", 1, "gone-fork").result()
    store.append("keep", [user("kept three")])


def test_delete_removes_every_key_and_rewrites_its_feed_records(store: Store) -> None:
    """No table keeps a key of the deleted session; its records become placeholders that name
    no session and no events; the feed still reads whole and verifies."""
    write_some(store)
    meta = store.meta("gone")
    assert meta is not None
    result = store.delete("gone", reason="user asked")
    assert (result.event_count, result.feed_records) == (3, 4)
    assert store.meta("gone") is None
    assert store.read_session("gone", 0) == []
    assert store.meta("gone-fork") is not None  # a fork is a copy: deleted on its own
    store.delete("gone-fork")
    for name, rows in tables_dump(store).items():
        for key, value in rows:
            if name in ("sessions", "leases", "audit"):
                assert key.split(b"\x00")[0] != b"gone", (name, key)
            if name in ("events", "requests", "ids", "redactions", "usage"):
                assert key[:8] != schema.u64(meta.sid), (name, key)
            if name != "erasures":
                assert SECRET.encode() not in value, (name, key)
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    erased = [c for c in feed if c.erased]
    assert len(erased) == 5  # four of the session, the fork's one
    assert all(not c.session_id and not c.event_count for c in erased)
    last = feed[-2]
    assert (last.kind, last.session_id, last.erased) == (rpb.CHANGE_KIND_DELETE, "gone", False)
    # The record names the rewritten positions; the placeholders themselves do not travel.
    assert list(last.erased_positions) == [c.position for c in erased[:4]]
    assert [put.table for put in last.puts] == ["erasures"]
    assert problems(store) == []
    with store.env.begin() as txn:
        raw_audit = txn.get(schema.u64(last.position), db=store.tables.erasures)
    assert raw_audit is not None
    audit = schema.ErasureRecord.decode(raw_audit)
    assert (audit.kind, audit.session_id, audit.event_count, audit.reason) == (
        schema.DELETE,
        "gone",
        3,
        "user asked",
    )
    assert SECRET not in audit.encode().decode()


def test_a_deleted_id_is_created_again_under_a_new_sid(store: Store) -> None:
    """The id may be used again; its internal id is a new one (sids are never reused)."""
    store.append("again", [user("first life")])
    old = store.meta("again")
    store.delete("again")
    store.append("again", [user("second life")])
    new = store.meta("again")
    assert old is not None
    assert new is not None
    assert new.sid > old.sid
    assert new.next_seq == 1
    assert problems(store) == []


def test_delete_refusals_change_nothing(store: Store) -> None:
    """A missing session, a stale expected_seq and another holder's live lease are refused
    before anything is written; force passes the lease."""
    store.append("held", [user("x")])
    store.submit_lease("acquire", "held", "other", 60_000_000_000).result()
    before = tables_dump(store)
    with pytest.raises(errors.SessionNotFound):
        store.delete("never")
    with pytest.raises(errors.SeqConflict):
        store.delete("held", expected_seq=5)
    with pytest.raises(errors.LeaseHeld):
        store.delete("held")
    assert tables_dump(store) == before
    store.delete("held", lease_holder="other")
    assert store.meta("held") is None


def test_redact_keeps_the_shape_and_drops_the_content(store: Store) -> None:
    """A redacted event keeps seq, type, time and surface_op and loses data and state_delta;
    the memoized surface and state see it at once; its old record is marked erased."""
    with_delta = user(REDACTED_TEXT)
    with_delta.state_delta.update({"secret": REDACTED_TEXT})
    store.append("red", [user("a"), with_delta, user("c")])
    summary = event(USER, content="summary of " + REDACTED_TEXT)
    summary.surface_op.replace.start_seq, summary.surface_op.replace.stop_seq = 0, 1
    store.append("red", [summary])
    assert store.surface("red").seqs == [3, 2]
    assert store.state("red")[0]["secret"] == REDACTED_TEXT
    original = Event.FromString(store.read_session("red", 1, 2)[0])
    result = store.redact("red", [3, 1, 1], reason="privacy request")
    assert result.seqs == [1, 3]
    stored = [Event.FromString(raw) for raw in store.read_session("red", 0)]
    for seq in (1, 3):
        assert not stored[seq].data.fields
        assert not stored[seq].HasField("state_delta")
        assert stored[seq].redacted.reason == "privacy request"
    assert stored[1].time == original.time
    assert stored[1].type == original.type
    assert stored[3].surface_op.replace.stop_seq == 1  # the fold's shape holds
    assert store.surface("red").seqs == [3, 2]  # the memo was dropped, not served stale
    assert "secret" not in store.state("red")[0]
    assert store.redact("red", [1]).seqs == []  # already redacted: nothing to do
    feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
    assert [c.erased for c in feed] == [True, True, False]
    assert all(REDACTED_TEXT.encode() not in raw for raw in store.read_changes(1))
    assert problems(store) == []


def test_redact_refusals_change_nothing(store: Store) -> None:
    """A seq past the end, no seqs, a missing session: refused, nothing written."""
    store.append("r", [user("x")])
    before = tables_dump(store)
    with pytest.raises(errors.BoundaryOutOfRange):
        store.redact("r", [0, 1])
    with pytest.raises(errors.InvalidRedaction):
        store.redact("r", [])
    with pytest.raises(errors.SessionNotFound):
        store.redact("nobody", [0])
    assert tables_dump(store) == before


@pytest.mark.parametrize("caught_up_at", ["start", "middle", "end"])
def test_a_replica_ends_identical_wherever_it_stood(
    store: Store, tmp_path: Path, caught_up_at: str
) -> None:
    """A replica that applied nothing, part, or all of the feed before the erasures applies the
    rest and holds exactly the primary's tables, feed included, and verifies clean."""
    with opened(tmp_path / "replica") as replica:
        store.append("keep", [user("k")])
        if caught_up_at == "start":
            replicate(store, replica)
        write_some(store)
        if caught_up_at == "middle":
            replicate(store, replica)
        store.redact("keep", [0])
        store.redact("gone", [0])  # a redact's placeholder, then the delete's over it
        if caught_up_at == "end":
            replicate(store, replica, replica.tail()[0] + 1)
        store.delete("gone")
        store.append("gone", [user("new life")])
        start = replica.tail()[0] + 1
        replicate(store, replica, start)
        assert tables_dump(replica) == tables_dump(store)
        assert problems(replica) == []


def test_erase_by_prefix_deletes_in_batches(store: Store) -> None:
    """Every session under the prefix goes, the others stay; an empty prefix is refused."""
    for n in range(7):
        store.append(f"user-x.{n}", [user(f"x{n}")])
    store.append("user-y.0", [user("y")])
    erased = store.erase_prefix("user-x.", batch=3, reason="account closed")
    assert erased[:2] == (7, 7)
    assert [v.session_id for v in store.list_sessions()[0]] == ["user-y.0"]
    with pytest.raises(errors.InvalidRedaction):
        store.erase_prefix("")
    assert problems(store) == []


def test_rebuild_after_erasure_accepts_the_placeholders(tmp_path: Path) -> None:
    """Rejoin's rebuild replays the feed with its placeholders and checks the chain."""
    path = tmp_path / "rebuilt"
    with opened(path) as store:
        write_some(store)
        store.delete("gone")
        store.redact("keep", [1])
        before = tables_dump(store)
        head = store.tail()[0]
    lock = folder.acquire(path)
    try:
        rebuild.rebuild_through(path, head, lambda txn, tables: None)
    finally:
        lock.release()
    with opened(path) as store:
        assert tables_dump(store) == before


def test_erased_text_lingers_in_the_data_file_until_compacted(tmp_path: Path) -> None:
    """After delete and redact the erased text is still in data.mdb (LMDB's freed pages);
    `compact` rewrites the file without it, and the store opens on it with everything else."""
    path = tmp_path / "data"
    with opened(path) as store:
        for n in range(40):
            store.append(f"other-{n}", [user(f"keep {n}")])
        store.append("gone", [user(SECRET)])
        store.append("red", [user(REDACTED_TEXT), user("fine")])
        for n in range(40):
            store.append(f"other-{n}", [user(f"more {n}")])
        store.delete("gone")
        store.redact("red", [0])
        kept = tables_dump(store)
    raw = (path / folder.DATA_FILE).read_bytes()
    assert SECRET.encode() in raw
    assert REDACTED_TEXT.encode() in raw
    lock = folder.acquire(path)
    try:
        done = compaction.compact(path)
    finally:
        lock.release()
    assert done.bytes_after <= done.bytes_before
    raw = (path / folder.DATA_FILE).read_bytes()
    assert SECRET.encode() not in raw
    assert REDACTED_TEXT.encode() not in raw
    assert b"keep 7" in raw
    assert not (path / compaction.BUILDING).exists()
    with opened(path) as store:
        assert tables_dump(store) == kept
        assert problems(store) == []
        store.append("other-1", [user("after compaction")])
        assert store.next_seq("other-1") == 3


def test_an_append_cannot_mark_an_event_redacted(store: Store) -> None:
    """Only RedactEvents sets the mark: an appended event's is dropped."""
    marked = user("mine")
    marked.redacted.reason = "forged"
    store.append("forge", [marked])
    stored = Event.FromString(store.read_session("forge", 0)[0])
    assert not stored.HasField("redacted")
    assert stored.data["content"] == "mine"


def test_a_fork_retried_after_its_child_was_deleted_forks_again(store: Store) -> None:
    """The parent's request record of a deleted child goes with it: a retry of that fork makes
    a new child instead of finding a missing one (which would read as damage)."""
    store.append("parent", [user("p")])
    first = store.submit_fork("parent", None, "", request_id="fork-1", generated_id=True).result()
    store.delete(first.session_id)
    again = store.submit_fork("parent", None, "", request_id="fork-1", generated_id=True).result()
    assert again.session_id != first.session_id
    assert store.meta(again.session_id) is not None
    assert problems(store) == []


def test_a_store_from_before_the_erasure_tables_reads_and_compacts(tmp_path: Path) -> None:
    """A folder no server of this version has opened lacks the erasures and redactions tables:
    read-only tools (stats, verify) read them as empty, compact copies the rest, and a server
    opening it creates them."""
    path = tmp_path / "old"
    with opened(path) as store:
        store.append("a", [user("x")])
        with store.env.begin(write=True) as txn:
            for name in (schema.ERASURES, schema.REDACTIONS):
                txn.drop(store.env.open_db(name, txn=txn), delete=True)
    env, tables = usage.open_readonly(str(path))
    try:
        assert tables.erasures is None
        found, counts = integrity.verify(env, tables, change_checks=[changes.ChecksumChain()])
        assert found == []
        assert counts["erasures"] == 0
    finally:
        env.close()
    lock = folder.acquire(path)
    try:
        assert compaction.compact(path).records > 0
    finally:
        lock.release()
    with opened(path) as store:
        assert store.tables.erasures is not None
        store.redact("a", [0])
        assert problems(store) == []
