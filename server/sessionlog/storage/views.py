"""What the store's listing and inspecting reads return: a session with its lease and audit
(GetSession), a page of sessions (ListSessions), of a session's events (ListEvents) and of lease
audit records (ListLeaseAudit).

Each function reads inside the transaction it is given, so what it returns is one consistent
view; each walks one cursor range, so its cost is the page, not the number of sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import lmdb

from sessionlog import errors
from sessionlog.records import SessionRecord
from sessionlog.storage import damage, indexes, schema
from sessionlog.storage.reads import load_lease, load_meta, read_range, read_range_desc
from sessionlog.storage.schema import AuditRecord, LeaseRecord, SessionMeta, session_uid
from sessionlog.storage.tables import Tables


@dataclass(frozen=True)
class EventsPage:
    """One page of ListEvents: stored event bytes, and the session's event count at the read."""

    events: list[bytes]
    first_seq: int
    """The seq of ``events[0]`` (the newest one, newest first)."""
    next_seq: int
    uid: str = ""
    """The session's uid at the read (empty: never written)."""
    log_number: int = 0
    """``Store.log_number`` at the read (0: never written), which a page token binds."""


@dataclass
class SessionView:
    """Everything GetSession reports about a session."""

    session_id: str
    meta: SessionMeta | None
    lease: LeaseRecord | None
    """The current lease, only while it is live."""
    audit: list[AuditRecord]
    record: SessionRecord | None = None
    """The person-set fields (title, labels, ...), read with the meta so the two agree."""


@dataclass(frozen=True)
class AuditEntry:
    """One lease audit record with the session it belongs to (ListLeaseAudit)."""

    session_id: str
    index: int
    """The record's number in its session's audit, from 0."""
    record: AuditRecord


def session(txn: lmdb.Transaction, tables: Tables, session_id: str, now: int) -> SessionView:
    """A session's metadata, live lease (at ``now``), lease audit and record."""
    meta = load_meta(txn, tables, session_id)
    lease = load_lease(txn, tables, session_id)
    records = audit(txn, tables, session_id)
    record = indexes.load_record(txn, tables, session_id)
    live = lease if lease is not None and lease.live(now) else None
    return SessionView(session_id, meta, live, records, record)


def audit(txn: lmdb.Transaction, tables: Tables, session_id: str) -> list[AuditRecord]:
    """A session's lease audit records, oldest first."""
    found = []
    prefix = schema.audit_prefix(session_id)
    with damage.reading(f"the lease audit of session '{session_id}'", session_id=session_id):
        cursor = txn.cursor(db=tables.audit)
        if cursor.set_range(prefix):
            for key, value in cursor:
                if not bytes(key).startswith(prefix):
                    break
                found.append(AuditRecord.decode(value))
    return found


def lease_audit(
    txn: lmdb.Transaction,
    tables: Tables,
    after: tuple[str, int] | None,
    prefix: str,
    limit: int,
    keep: Callable[[str], bool],
) -> tuple[list[AuditEntry], bool]:
    """Up to ``limit`` lease audit records of the sessions whose id starts with ``prefix`` (and
    that ``keep`` accepts), in key order: session id (UTF-8 bytes), then record number. Strictly
    after ``after`` (session id, record number). Returns them and whether more may follow. One
    cursor range: the cost is the records walked."""
    want = prefix.encode()
    start = want if after is None else max(schema.audit_key(*after), want)
    skip = None if after is None else schema.audit_key(*after)
    out: list[AuditEntry] = []
    cursor = txn.cursor(db=tables.audit)
    with damage.reading("the lease audit"):
        if not cursor.set_range(start):
            return out, False
    for key, value in _walk(cursor, "the lease audit"):
        if not key.startswith(want):
            return out, False
        if key == skip:
            continue
        with damage.reading("a key of the lease audit"):
            session_id, index = schema.split_audit_key(key)
        if not keep(session_id):
            continue
        if len(out) == limit:
            return out, True
        with damage.reading(f"the lease audit of session '{session_id}'"):
            record = AuditRecord.decode(value)
        out.append(AuditEntry(session_id, index, record))
    return out, False


def list_sessions(
    txn: lmdb.Transaction, tables: Tables, after: str, prefix: str, limit: int, now: int
) -> tuple[list[SessionView], bool]:
    """Up to ``limit`` sessions in id order (UTF-8 bytes), strictly after ``after``, whose id
    starts with ``prefix``, each with its live lease at ``now`` (no audit). Returns them and
    whether more follow. A cursor range: the cost is the page, whatever the number of
    sessions."""
    out: list[SessionView] = []
    want = prefix.encode()
    start = max(after.encode(), want)
    cursor = txn.cursor(db=tables.sessions)
    with damage.reading(f"the session list after '{after or prefix}'"):
        if not cursor.set_range(start):
            return out, False
    for key, value in _walk(cursor, f"the session list after '{after or prefix}'"):
        if not key.startswith(want):
            return out, False
        if after and key == after.encode():
            continue
        if len(out) == limit:
            return out, True
        with damage.reading("a session id in the session list"):
            session_id = key.decode()
        lease = load_lease(txn, tables, session_id)
        live = lease if lease is not None and lease.live(now) else None
        with damage.reading(f"the record of session '{session_id}'"):
            meta = SessionMeta.decode(value)
        out.append(SessionView(session_id, meta, live, []))
    return out, False


def list_events(
    txn: lmdb.Transaction,
    tables: Tables,
    session_id: str,
    cursor: int | None,
    limit: int,
    descending: bool,
    max_bytes: int,
) -> EventsPage:
    """Up to ``limit`` stored events: oldest first from seq ``cursor`` (None: 0), or newest
    first from seq ``cursor - 1`` down (None: the last event). Within ``max_bytes`` but at least
    one event; the cost is the events returned."""
    meta = load_meta(txn, tables, session_id)
    count = 0 if meta is None else meta.next_seq
    if meta is None:
        return EventsPage([], 0, count)
    if descending:
        if cursor is not None and cursor > count:
            raise errors.InvalidPageToken(
                f"page_token goes back from seq {cursor} of session '{session_id}', "
                f"which has {count} events here; list again without a page_token",
                field="page_token",
            )
        stop = count if cursor is None else cursor
        raws = read_range_desc(txn, tables, meta.sid, stop, limit, max_bytes, session_id)
        return EventsPage(raws, stop - 1, count, session_uid(session_id, meta), meta.sid)
    start = cursor or 0
    raws = read_range(
        txn, tables, meta.sid, start, min(start + limit, count), max_bytes, session_id
    )
    return EventsPage(raws, start, count, session_uid(session_id, meta), meta.sid)


def _walk(cursor: lmdb.Cursor, what: str) -> Iterator[tuple[bytes, bytes]]:
    """A cursor's (key, value) pairs, in a transaction without buffers; LMDB meeting a
    damaged page raises DataCorrupted."""
    items = iter(cursor)
    while True:
        with damage.reading(what):
            item = next(items, None)
        if item is None:
            return
        key, value = item
        yield bytes(key), bytes(value)
