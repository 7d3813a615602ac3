"""The UpdateSession command, and the session listing (ListSessions) over the ``records``
table and its indexes (``indexes``, ``schema``). A listing reads records and metas, never a
session's events.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb

from sessionlog import errors, records
from sessionlog.records import Filter, SessionRecord
from sessionlog.storage import damage, indexes, schema
from sessionlog.storage.commands import Written
from sessionlog.storage.indexes import load_record, put_record, update_time
from sessionlog.storage.reads import load_lease, load_meta
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import LeaseRecord, SessionMeta
from sessionlog.storage.tables import Tables

BY_ID = "session_id"
BY_UPDATE = "update_time desc"
ORDERS = (BY_ID, BY_UPDATE)


# -- UpdateSession ------------------------------------------------------------------------------


@dataclass
class Updated(Written):
    meta: SessionMeta
    record: SessionRecord


class UpdateSessionCommand:
    """Set the fields an update mask names on an existing session's record."""

    def __init__(
        self,
        tables: Tables,
        session_id: str,
        given: SessionRecord,
        paths: Sequence[str] | None,
    ) -> None:
        records.check_mask(paths or ())
        self._tables = tables
        self._given = given
        self._paths = paths
        self.kind = "update"
        self.moving_in = False
        self.session_id = session_id

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: RecordingTxn, now_ns: int) -> Updated:
        tables, session_id, given = self._tables, self.session_id, self._given
        meta = load_meta(txn, tables, session_id)
        if meta is None:
            raise errors.SessionNotFound(
                f"session '{session_id}' does not exist; create it before updating it",
                session_id=session_id,
            )
        current = load_record(txn, tables, session_id)
        new = records.apply_mask(
            current or SessionRecord(),
            given.title,
            given.labels,
            given.owner,
            given.status,
            self._paths,
            expire_time_ns=given.expire_time_ns,
            pinned=given.pinned,
        )
        new.update_time_ns = max(now_ns, 0 if current is None else current.update_time_ns)
        old_time, new_time = update_time(meta, current), update_time(meta, new)
        put_record(txn, tables, session_id, current, new)
        if old_time != new_time:
            txn.remove(schema.recent_key(old_time, session_id), db=tables.recent)
            txn.put(schema.recent_key(new_time, session_id), b"", db=tables.recent)
        return Updated(meta, new)


# -- sessions written before the indexes existed ------------------------------------------------


REINDEX_BATCH = 2000
"""Sessions a ReindexCommand visits: each batch is one commit and one change record."""


@dataclass
class Reindexed(Written):
    visited: int
    added: int
    last: str
    """The last session visited: the next batch starts after it ("" when the walk ended)."""


class ReindexCommand:
    """Give sessions written by a server older than the indexes their ``recent`` key (and a
    fork its ``children`` key), ``REINDEX_BATCH`` sessions at a time in id order after
    ``after``. Writes only what is missing, so it can run again (and on an indexed store it
    writes nothing, and makes no change record). Index-only: no session's data changes."""

    def __init__(self, tables: Tables, after: str) -> None:
        self._tables = tables
        self._after = after
        self.kind = "update"
        self.moving_in = True  # not a write to a session's data: ``admits`` is not asked
        self.session_id = after

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: RecordingTxn, now_ns: int) -> Reindexed:
        tables = self._tables
        visited = added = 0
        last = ""
        for key in _keys(txn, tables.sessions, b"", self._after.encode(), self._after.encode()):
            if visited == REINDEX_BATCH:
                return Reindexed(visited, added, last)
            session_id = key.decode("utf-8")
            meta = load_meta(txn, tables, session_id)
            if meta is None:
                continue
            visited, last = visited + 1, session_id
            self.session_id = self.session_id or session_id
            stamp = update_time(meta, load_record(txn, tables, session_id))
            recent = schema.recent_key(stamp, session_id)
            if txn.get(recent, db=tables.recent) is None:
                txn.put(recent, b"", db=tables.recent)
                added += 1
            if meta.parent_id:
                link = schema.child_prefix(meta.parent_id) + key
                if txn.get(link, db=tables.children) is None:
                    txn.put(link, b"", db=tables.children)
                    added += 1
        return Reindexed(visited, added, "")


# -- listing ------------------------------------------------------------------------------------


@dataclass
class Listed:
    """One session of a listing page."""

    session_id: str
    meta: SessionMeta
    record: SessionRecord | None
    lease: LeaseRecord | None
    cursor: bytes
    """Where the listing continues after this session: its id (by id) or its ``recent`` key."""


def list_page(
    txn: lmdb.Transaction,
    tables: Tables,
    *,
    after: bytes,
    prefix: str,
    query: Filter,
    order: str,
    limit: int,
    now_ns: int,
) -> tuple[list[Listed], bool]:
    """Up to ``limit`` sessions matching ``prefix`` and ``query`` in ``order``, strictly after
    the cursor ``after`` (b"": from the start); and whether more may follow.

    The walk picks the narrowest index it can: ``children`` for ``parent = "ID"``, ``labels``
    for ``labels.K = "V"``, ``owner = "X"`` or ``status = "X"`` (all in id order), ``recent``
    for update-time order (stopping at an ``update_time >`` bound), else the session table
    itself. Each candidate costs a meta and a record read, never an event read.
    """
    out: list[Listed] = []
    floor = query.updated_after()
    for session_id, cursor, stamp in _candidates(txn, tables, after, prefix, query, order):
        if order == BY_UPDATE and floor is not None and stamp < floor:
            return out, False
        if not session_id.startswith(prefix):
            continue
        meta = load_meta(txn, tables, session_id)
        if meta is None:
            continue
        record = load_record(txn, tables, session_id)
        if not query.matches(record, meta.parent_id, update_time(meta, record)):
            continue
        if len(out) == limit:
            return out, True
        lease = load_lease(txn, tables, session_id)
        live = lease if lease is not None and lease.live(now_ns) else None
        out.append(Listed(session_id, meta, record, live, cursor))
    return out, False


def _candidates(
    txn: lmdb.Transaction, tables: Tables, after: bytes, prefix: str, query: Filter, order: str
) -> Iterator[tuple[str, bytes, int]]:
    """(session id, cursor, update time or 0) of every session the walk visits, in order."""
    if order == BY_UPDATE:
        for key in _keys(txn, tables.recent, b"", after, after):
            stamp, session_id = schema.recent_key_parts(key)
            yield session_id, key, stamp
        return
    parent = query.first("parent")
    label = query.first("labels")
    owner, status = query.first("owner"), query.first("status")
    if parent is not None:
        head = schema.child_prefix(parent.value)
    elif label is not None:
        head = schema.label_prefix(label.key, label.value)
    elif owner is not None and owner.value:
        head = schema.label_prefix(indexes.OWNER_KEY, owner.value)
    elif status is not None and status.value:
        head = schema.label_prefix(indexes.STATUS_KEY, status.value)
    else:
        head = b""
    db = tables.sessions if not head else (tables.children if parent else tables.labels)
    for key in _keys(txn, db, head, after, max(after, prefix.encode())):
        session_id = key[len(head) :].decode("utf-8")
        if not head and not session_id.startswith(prefix):
            return  # the session table is in id order: past the prefix, nothing more matches
        yield session_id, session_id.encode(), 0


def _keys(
    txn: lmdb.Transaction | RecordingTxn, db: Any, head: bytes, after: bytes, start: bytes
) -> Iterator[bytes]:
    """The keys of ``db`` that start with ``head``, in order, from ``head + start`` on and
    strictly after ``head + after`` (``after`` empty: no key skipped)."""
    with damage.reading("the session list"):
        cursor = txn.cursor(db=db)
        if not cursor.set_range(head + start):
            return
        for raw in cursor.iternext(keys=True, values=False):
            key = bytes(raw)
            if not key.startswith(head):
                return
            if after and key == head + after:
                continue
            yield key


def given_record(
    title: str,
    labels: Mapping[str, str],
    owner: str,
    status: str,
    parent_seq: int | None = None,
    *,
    expire_time_ns: int = 0,
    pinned: bool = False,
) -> SessionRecord:
    """A record from request fields, checked (``expire_time_ns`` by ``retention.expire_at``)."""
    record = SessionRecord(
        title, dict(labels), owner, status, 0, parent_seq, expire_time_ns, pinned
    )
    records.check(record)
    return record


def descendants(txn: lmdb.Transaction, tables: Tables, session_id: str, limit: int) -> list[str]:
    """Every session below ``session_id`` in the parent tree (sub-agent children and forks, their
    children, ...), breadth first, each level in id order; at most ``limit``. The walk a tree's
    usage (issue 17 part 4) sums its sessions' usage over; reads the ``children`` index only."""
    found: list[str] = []
    level = [session_id]
    seen = {session_id}
    while level and len(found) < limit:
        below: list[str] = []
        for parent in level:
            head = schema.child_prefix(parent)
            for key in _keys(txn, tables.children, head, b"", b""):
                child = key[len(head) :].decode("utf-8")
                if child not in seen:
                    seen.add(child)
                    below.append(child)
        found += below[: limit - len(found)]
        level = below
    return found
