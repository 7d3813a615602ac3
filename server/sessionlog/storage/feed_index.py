"""Where each session's records are in the change feed: an index, so an erase never walks it all.

An erase (``erasure``, ``purge``) rewrites every old record of its session. Found by walking the
feed from position 1, that cost a delete of a 5-event session 130 ms at 100,000 records and
398 ms at 300,000 (decoding each), held by the writer or taking the GIL from it, whatever the
session's own size. The table ``feed_index`` names them instead: a key per record that names a
session (session id, 0x00, position), put in the transaction that stores the record, by every
path that stores one: the writer (a primary's own writes), a replica's apply (which the online
compaction's catch-up and a rebuild share), and the catch-up at open below. It is this store's
own: no key of it travels in the feed, and each copy keeps its own the same way.

Keyed by the session *id*, as the feed's records name it: a record of a lease taken before the
session's first write has no sid yet. A record rewritten to a DELETE's placeholder names no
session any more, and loses its key in the same transaction (``rewritten``: wherever an erase
rewrites a record, on a primary, a replica or a rebuild), so every copy holds the same keys.

Its progress (``PROGRESS``, a key of the table itself: the newest position indexed) moves once
per transaction that stores records (``advance``), and only from where it stands: every record
at or before it has its key. A reader takes the index up to it and walks the records after it
(``walked_from``): inside a commit group, the group's own few. Kept in the table, not among the
counters, so that the progress never outlives the keys: a copy made by a version without the
table (an older ``admin compact`` copies the tables it knows, and the counters whole) has
neither. A store written before this table (or by a version without it) is behind, and
``catch_up`` indexes the rest when a server opens it for writing, before it serves; a reader
of it meanwhile (a read-only open) walks what is not indexed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import lmdb

from sessionlog.storage import damage, schema
from sessionlog.storage.reads import Txn
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb

log = logging.getLogger(__name__)

_BATCH = os.environ.get("SESSIONLOG_FEED_INDEX_BATCH", "")
CATCH_UP_RECORDS = int(_BATCH) if _BATCH.isdigit() and int(_BATCH) > 0 else 50_000
"""Records one transaction of ``catch_up`` indexes (each commits its progress: a kill resumes);
the environment's ``SESSIONLOG_FEED_INDEX_BATCH`` sets it (tests make it small)."""


PROGRESS = b"\x00"
"""The table's one key that names no record (a session id is never empty and holds no NUL):
the newest position indexed (u64)."""


def key(session_id: str, position: int) -> bytes:
    return session_id.encode() + b"\x00" + schema.u64(position)


def note(txn: lmdb.Transaction, tables: Tables, position: int, session_id: str) -> None:
    """Index the record just stored at ``position`` (naming ``session_id``, or no session);
    ``advance`` moves the progress past it, once for all the records of a transaction."""
    if session_id:
        txn.put(key(session_id, position), b"", db=tables.feed_index)


def advance(txn: lmdb.Transaction, tables: Tables, first: int, last: int) -> None:
    """The records ``first`` .. ``last`` were just stored and noted: the progress moves to
    ``last`` if it had reached ``first - 1``; else records before them are not indexed (an older
    version wrote them) and it stays, for ``catch_up``."""
    if indexed(txn, tables) >= first - 1:
        txn.put(PROGRESS, schema.u64(last), db=tables.feed_index)


def rewritten(txn: Txn, tables: Tables, position: int, before: str, record: bytes) -> None:
    """The record at ``position``, which named ``before``, was rewritten to ``record`` (an
    erase's placeholder): its key follows what it names now."""
    after = rpb.Change.FromString(record).session_id
    if after == before or tables.feed_index is None:
        return
    local = txn.local if isinstance(txn, RecordingTxn) else txn
    if before:
        local.delete(key(before, position), db=tables.feed_index)
    if after:
        local.put(key(after, position), b"", db=tables.feed_index)


def indexed(txn: Txn, tables: Tables) -> int:
    """The newest position whose record (and every one before it) is indexed."""
    if tables.feed_index is None:
        return 0
    raw = txn.get(PROGRESS, db=tables.feed_index)
    return 0 if raw is None else schema.read_u64(raw)


def newest(txn: Txn, tables: Tables) -> int:
    """The newest record's position; 0 for an empty feed."""
    cursor = txn.cursor(db=tables.changes)
    return schema.read_u64(cursor.key()) if cursor.last() else 0


def complete(txn: Txn, tables: Tables) -> bool:
    """Whether every record in the feed is indexed (else a reader walks the rest)."""
    return walked_from(txn, tables) >= newest(txn, tables)


def walked_from(txn: Txn, tables: Tables) -> int:
    """The position after which a reader walks the feed: the index names the records of each
    session up to it. Behind the feed in a store an older version wrote (or has not indexed
    yet: a read-only open), and inside a commit group, whose records move it at its end."""
    return min(indexed(txn, tables), newest(txn, tables))


def positions(txn: Txn, tables: Tables, session_id: str, after: int = 0) -> Iterator[int]:
    """The indexed positions after ``after`` of records that named ``session_id`` when stored,
    oldest first (an erased one among them names it no more: check the record). Only those up
    to ``indexed`` are sure to be all: a reader walks the records after it (``walked_from``)."""
    prefix = session_id.encode() + b"\x00"
    cursor = txn.cursor(db=tables.feed_index)
    with damage.reading(f"the feed index of session '{session_id}'"):
        found = cursor.set_range(prefix + schema.u64(after + 1))
    while found:
        entry = bytes(cursor.key())
        if not entry.startswith(prefix) or len(entry) != len(prefix) + 8:
            return
        yield schema.read_u64(entry[len(prefix) :])
        found = cursor.next()


def catch_up(env: lmdb.Environment, tables: Tables) -> int:
    """Index every record after ``PROGRESS`` (a store from before the index, or written
    by a version without it), ``CATCH_UP_RECORDS`` per transaction; how many were read. Call
    before the store serves: until then, records others store leave the progress where it is
    (``advance``), and a reader walks them."""
    started = time.monotonic()
    done = 0
    while True:
        with env.begin(write=True) as txn:
            start = indexed(txn, tables)
            if start >= newest(txn, tables):
                break
            cursor = txn.cursor(db=tables.changes)
            found = cursor.set_range(schema.u64(start + 1))
            count = position = 0
            while found and count < CATCH_UP_RECORDS:
                position = schema.read_u64(cursor.key())
                with damage.reading(f"change-feed record {position}", position=position):
                    change = rpb.Change.FromString(bytes(cursor.value()))
                note(txn, tables, position, change.session_id)
                count += 1
                found = cursor.next()
            advance(txn, tables, start + 1, position)
        done += count
    if done:
        log.warning(
            "indexed the change feed's records by session (a store from before the index)",
            extra={"records": done, "seconds": round(time.monotonic() - started, 3)},
        )
    return done
