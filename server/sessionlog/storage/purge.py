"""Deleting a long session without stalling every other writer: a tombstone, then chunks.

A delete is one write transaction, and the writer is one thread: erasing a session of a million
events in one transaction holds every other append behind it for as long as that takes. So a
session of ``PURGE_FROM`` events or more is deleted in two steps:

1. **The tombstone** (``erasure.DeleteCommand``, one small write): the session's meta, id, lease,
   audit, record and index entries go, so no reader finds it from that commit on, and a mark
   (table ``purges``, keyed by its sid) says what is left. Its id is free at once: a new session
   of that id gets a new sid, which never meets the old keys.
2. **The chunks** (``PurgeCommand``, run by ``service.purger`` where writes are accepted): first
   the session's change records up to the tombstone (found through ``feed_index``) are
   rewritten to erased placeholders (``changes.placeholder``, the rule of a DELETE), at most
   ``CHUNK_RECORDS`` a chunk; then its events, request and usage rows are removed, at most
   ``CHUNK_KEYS`` keys a chunk; the last chunk removes the mark. Records first: a record from
   before checksums needs its events to keep its fingerprint, and a feed reader never meets a
   record whose events are gone.

Each chunk is a write command like any other, with its own change record: the placeholders
travel as puts on the changes table, the removals as bounded key ranges, the mark's progress as
a put. So replicas free the same bytes in the same small steps, and a restart (or a new leader)
resumes from the mark, which moved in the same transaction as the chunk it records.

A chunk must not make other sessions' appends wait (issue 35: their p99 unchanged while a long
delete runs). Four things see to that. It is a *background* command (``Writer.
submit_background``): it never has a transaction of its own while writes are coming, but rides
at the end of their group, sharing its commit and sync, and runs alone only once the writer has
been idle a few milliseconds. It is paced: while writes flow it rides at most one group per
``PACE_SECONDS``, since what it costs the group it rides is mostly fixed (the pages it dirties,
written and synced with the group's) however short it is; once the writer is idle its chunks
run back to back, so an idle server frees at full speed. It keeps time: it stops after
``CHUNK_SECONDS`` inside the transaction (``ALONE_SECONDS`` when it runs alone; looking at the
clock every ``CHECK_EVERY`` keys or records walked, and after each record it erases), or at
``CHUNK_KEYS`` keys or ``CHUNK_RECORDS`` records, whichever comes first. And the writer runs the
same command again for the next chunk (``repeat``; ``Purged.more``), finding the records itself
in the feed from the mark, so no other thread of the process runs between two chunks (a round
trip through one cost the appends as much again as the chunk: ``docs/benchmarks.md``, case
14). What a chunk removed is recorded as the exact key range, so a replica removes the same keys
whatever its clock says. A chunk is all or nothing: it makes every placeholder before its first
put, so one that fails leaves nothing of the chunk written.

Between the steps the old records of the session may still be read from the feed; ``admin
verify`` knows the sids being purged and does not call their rows left over.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

from sessionlog.storage import changes, feed_index, schema
from sessionlog.storage.commands import Written
from sessionlog.storage.reads import Txn
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb


def _tuning(name: str, default: int) -> int:
    """A chunk size from the environment (``SESSIONLOG_PURGE_*``; tests make chunks small), or
    its default."""
    raw = os.environ.get(f"SESSIONLOG_PURGE_{name}", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else default


PURGE_FROM = _tuning("FROM", 10_000)
"""A session of this many events or more is deleted by tombstone and chunks."""
CHUNK_KEYS = _tuning("CHUNK_KEYS", 2_000)
"""Event, request or usage keys one chunk removes at most."""
CHUNK_RECORDS = _tuning("CHUNK_RECORDS", 64)
"""Change records one chunk rewrites at most (its time runs out sooner, at tens of µs each:
this bounds what the read before it looks for, that the chunk may not get to)."""
CHUNK_SECONDS = _tuning("CHUNK_MICROSECONDS", 2_000) / 1e6
"""How long one chunk works inside the write transaction at most (then it stops where it is,
its commit still to come): what it may add to the group of appends it rides with. Its cost to
that group is mostly fixed (the pages it dirties, written and synced with theirs), so a chunk
rides rarely (``PACE_SECONDS``) and does much when it does."""
PACE_SECONDS = _tuning("PACE_MILLISECONDS", 200) / 1e3
"""While writes flow, a purge's chunks ride at most one group per this long (``Writer.
submit_background``): with appends every millisecond, one append in 200 carries a chunk
instead of nearly every one. Once the writer is idle, chunks run back to back."""
ALONE_SECONDS = _tuning("ALONE_MICROSECONDS", 1_000) / 1e6
"""The same for a chunk the writer runs alone (it was idle: no append to delay, unless one
comes meanwhile); a record rewritten costs tens of µs, so this is what frees a session of many
small appends at a pace when nothing else is written."""
CHECK_EVERY = 16
"""Keys removed between two looks at the clock (a record rewritten costs enough to look after
each)."""
CHUNKED = ("events", "requests", "usage")
"""The per-session tables keyed by sid ranges, that a long session fills: freed by chunks."""


@dataclass
class Purge:
    """The mark of a session deleted in chunks: what is still to free."""

    session_id: str
    sid: int
    upto: int
    """The position before the tombstone's: the session's records are those at or before it
    (a record of that id after it is of a new session)."""
    scanned: int = 0
    """The feed has been rewritten up to this position (``upto``: the records are done)."""
    removals: list[tuple[str, str, str]] = field(default_factory=list)
    """What the whole delete removes ((table, key hex, end key hex)): a record's puts among
    them are dropped from its placeholder, as a one-step delete drops them."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> Purge:
        fields = json.loads(bytes(raw))
        fields["removals"] = [tuple(removal) for removal in fields["removals"]]
        return cls(**fields)

    def removal_keys(self) -> list[changes.Removal]:
        return [(t, bytes.fromhex(k), bytes.fromhex(e)) for t, k, e in self.removals]


def mark(
    txn: RecordingTxn,
    tables: Tables,
    session_id: str,
    sid: int,
    tombstone: int,
    removals: Sequence[changes.Removal],
) -> None:
    """Record that the session's rows are to be freed in chunks (the tombstone's last write;
    ``tombstone`` is its position)."""
    hexed = [(table, key.hex(), end.hex()) for table, key, end in removals]
    purge = Purge(session_id, sid, tombstone - 1, removals=hexed)
    txn.put(schema.u64(sid), purge.encode(), db=tables.purges)


def pending(txn: Txn, tables: Tables, limit: int = 0) -> list[Purge]:
    """The marks (``limit`` of them at most; 0: every one), oldest sid first."""
    if tables.purges is None:
        return []
    found = []
    for _, value in txn.cursor(db=tables.purges):
        found.append(Purge.decode(value))
        if len(found) == limit:
            break
    return found


def purging_sids(txn: Txn, tables: Tables) -> set[int]:
    """The sids whose rows are being freed (``admin verify`` does not call them left over)."""
    return {purge.sid for purge in pending(txn, tables)}


@dataclass
class Purged(Written):
    """What one chunk did."""

    session_id: str = ""
    """The session being purged (set by the caller that ran the chunk)."""
    rewritten: int = 0
    freed: int = 0
    """Keys removed."""
    done: bool = False
    """The mark is gone: nothing of the session is left."""
    chunks: int = 1
    """Chunks run (more than one for a command the writer ran again, ``more``)."""

    @property
    def more(self) -> bool:
        """Whether the writer should run the command again (``Writer.submit_background``)."""
        return not self.done


class PurgeCommand:
    """One chunk of a session's purge (see the module doc): rewrite its next records, found in
    the feed from the mark on, and move the mark past them; or, once the records are done,
    remove keys of one sid range; or, with none left, remove the mark. The writer may run the
    same command again for the next chunk (``Purged.more``)."""

    kind = "update"  # names no session (like a reindex batch): feed followers show nothing
    session_id = ""
    moving_in = True  # the session is gone already: no ownership to ask
    alone = False
    """Set by the writer: it runs in a transaction of its own (``ALONE_SECONDS``), not at the
    end of a group of appends (``CHUNK_SECONDS``)."""

    def __init__(
        self,
        tables: Tables,
        sid: int,
        seconds: float | None = None,
    ) -> None:
        self._tables = tables
        self._sid = sid
        self._seconds = seconds
        self._chunks = 0

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: RecordingTxn, now_ns: int) -> Purged:
        self._chunks += 1
        done = self._chunk(txn)
        done.chunks = self._chunks
        return done

    def _chunk(self, txn: RecordingTxn) -> Purged:
        tables = self._tables
        raw = txn.get(schema.u64(self._sid), db=tables.purges)
        if raw is None:
            return Purged(done=True)
        seconds = self._seconds
        if seconds is None:
            seconds = ALONE_SECONDS if self.alone else CHUNK_SECONDS
        deadline = time.perf_counter() + seconds
        purge = Purge.decode(raw)
        if purge.scanned < purge.upto:
            return self._rewrite(txn, purge, deadline)
        for table in CHUNKED:
            freed = _free_some(txn, tables.by_name[table], self._sid, deadline)
            if freed:
                return Purged(freed=freed)
        txn.remove(schema.u64(self._sid), db=tables.purges)
        return Purged(done=True)

    def _rewrite(self, txn: RecordingTxn, purge: Purge, deadline: float) -> Purged:
        """Rewrite the session's next records to placeholders (``_find_and_rewrite``)."""
        removals = purge.removal_keys()

        def keep(put: rpb.StoragePut) -> bool:
            return put.table != "changes" and not changes.covered(removals, put.table, put.key)

        return self._find_and_rewrite(txn, purge, deadline, keep)

    def _find_and_rewrite(
        self,
        txn: RecordingTxn,
        purge: Purge,
        deadline: float,
        keep: Callable[[rpb.StoragePut], bool],
    ) -> Purged:
        """Walk the session's records from the mark (``_records``), rewriting them, until the
        deadline (looked at every ``CHECK_EVERY`` records walked, and after each rewrite) or
        ``CHUNK_RECORDS`` rewrites; the mark moves to the last record walked."""
        tables = self._tables
        name = purge.session_id.encode()
        erased: list[tuple[int, bytes]] = []
        reached = purge.upto
        for walked, (position, raw) in enumerate(_records(txn, tables, purge), start=1):
            if name in raw and rpb.Change.FromString(raw).session_id == purge.session_id:
                erased.append((position, changes.placeholder(txn, tables, raw, keep)))
                if len(erased) == CHUNK_RECORDS or time.perf_counter() > deadline:
                    reached = position
                    break
            elif walked % CHECK_EVERY == 0 and time.perf_counter() > deadline:
                reached = position
                break
        # Every placeholder is made before the first put: one that fails (a damaged record)
        # leaves the chunk unwritten, not half done.
        for position, placeholder in erased:
            txn.put(schema.u64(position), placeholder, db=tables.changes)
            feed_index.rewritten(txn, tables, position, purge.session_id, placeholder)
        purge.scanned = min(purge.upto, max(reached, purge.scanned))
        txn.put(schema.u64(self._sid), purge.encode(), db=tables.purges)
        return Purged(rewritten=len(erased))


def _records(txn: Txn, tables: Tables, purge: Purge) -> Iterator[tuple[int, bytes]]:
    """(position, stored bytes) of the records after the mark up to ``upto`` that may be the
    session's: those the feed's index names (``feed_index``), as far as it goes, then every one
    after that."""
    indexed = min(feed_index.walked_from(txn, tables), purge.upto)
    if indexed > purge.scanned:
        for position in feed_index.positions(txn, tables, purge.session_id, purge.scanned):
            if position > indexed:
                break
            raw = txn.get(schema.u64(position), db=tables.changes)
            if raw is not None:
                yield position, bytes(raw)
    cursor = txn.cursor(db=tables.changes)
    found = cursor.set_range(schema.u64(max(purge.scanned, indexed) + 1))
    while found:
        position = schema.read_u64(cursor.key())
        if position > purge.upto:
            return
        yield position, bytes(cursor.value())
        found = cursor.next()


def _free_some(txn: RecordingTxn, db: object, sid: int, deadline: float) -> int:
    """Remove the first keys of the sid's range in ``db``, ``CHUNK_KEYS`` at most and no more
    once ``deadline`` (``time.perf_counter``) has passed, as one recorded range (its end the
    first key kept); how many were removed."""
    start, end = schema.u64(sid), schema.u64(sid + 1)
    cursor = txn.cursor(db=db)
    if not cursor.set_range(start) or bytes(cursor.key()) >= end:
        return 0
    removed = 0
    while True:
        if not cursor.delete():  # deleting moves the cursor to the next key
            stop = end
            break
        removed += 1
        key = bytes(cursor.key())
        if not key or key >= end:
            stop = end
            break
        if removed == CHUNK_KEYS or (removed % CHECK_EVERY == 0 and time.perf_counter() > deadline):
            stop = key
            break
    txn.record_deleted(db, start, stop, removed)
    return removed
