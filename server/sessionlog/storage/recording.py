"""The write transaction a command gets: it writes through to LMDB and remembers every put,
from which the writer makes the command's change-feed record (see ``changes``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lmdb

from sessionlog.storage import schema
from sessionlog.storage.tables import Tables


class RecordingTxn:
    """A write transaction that remembers what a command puts, for its change record.

    Events go through ``put_events`` and are remembered as a range (consecutive seqs of one
    session); every other put is kept whole, and a removal (``remove``) as a put of value None,
    in the same order, so a replica that applies them in turn ends with the same keys.
    """

    def __init__(self, txn: lmdb.Transaction, tables: Tables) -> None:
        self._txn = txn
        self._names = tables.names
        self._events_db = tables.events
        self._changes_db = tables.changes
        self.puts: list[tuple[str, bytes, bytes | None]] = []
        """(table, key, value) writes in order; a None value is a removal of the key."""
        self.deletes: list[tuple[str, bytes, bytes]] = []
        """(table, key, end_key) removals, in order; an empty end_key removes the key alone."""
        self.erased_positions: list[int] = []
        """Earlier change records an erase rewrote to placeholders (named, not carried)."""
        self.events: list[bytes] = []
        """The stored bytes of the events written, in seq order (for the record's checksum)."""
        self.event_sid = -1
        self.first_seq = 0
        self.event_count = 0

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        return self._txn.get(key, default, db=db)

    def cursor(self, db: Any = None) -> lmdb.Cursor:
        return self._txn.cursor(db=db)

    def put(self, key: bytes, value: bytes, db: Any = None, overwrite: bool = True) -> bool:
        if db is self._events_db:
            raise RuntimeError("events are written with put_events, as one range")
        written: bool = self._txn.put(key, value, db=db, overwrite=overwrite)
        if written:
            self.puts.append((self._names[id(db)], bytes(key), bytes(value)))
        return written

    def rewrite_event(self, key: bytes, value: bytes) -> None:
        """Overwrite a stored event (a redaction: the one change of an event's bytes), recorded
        as a put on the events table so replicas write the same bytes."""
        self._txn.put(key, value, db=self._events_db)
        self.puts.append((self._names[id(self._events_db)], bytes(key), bytes(value)))

    def erase_record(self, position: int, placeholder: bytes) -> None:
        """Rewrite the change record at ``position`` to its erased placeholder; the record of
        this command names the position, and replicas rewrite their own copy the same way."""
        self._txn.put(schema.u64(position), placeholder, db=self._changes_db)
        self.erased_positions.append(position)

    def delete(self, db: Any, key: bytes, end_key: bytes = b"") -> int:
        """Remove ``key``, or with ``end_key`` every key in [key, end_key); recorded for the
        change record only when something was removed. Returns how many keys were."""
        removed = delete_keys(self._txn, db, key, end_key)
        if removed:
            self.deletes.append((self._names[id(db)], bytes(key), bytes(end_key)))
        return removed

    def record_deleted(self, db: Any, key: bytes, end_key: bytes, removed: int) -> None:
        """Record that the caller removed every key in [key, end_key) itself (``removed`` of
        them), through a cursor of this transaction: a removal that stops where its time ran
        out, so only the caller knows its end."""
        if removed:
            self.deletes.append((self._names[id(db)], bytes(key), bytes(end_key)))

    def remove(self, key: bytes, db: Any = None) -> bool:
        """Delete ``key`` (an index entry: events and records of other tables are never
        deleted); recorded for the feed only when it was there."""
        if db is self._events_db:
            raise RuntimeError("events are never deleted")
        removed: bool = self._txn.delete(key, db=db)
        if removed:
            self.puts.append((self._names[id(db)], bytes(key), None))
        return removed

    def put_events(self, sid: int, first_seq: int, values: Sequence[bytes]) -> None:
        """Write events under consecutive seqs of one session from ``first_seq`` on, in one call
        to LMDB; raises if any of those keys is already taken (the log would be corrupt)."""
        if not values:
            return
        if len(values) == 1:  # the common append: one put costs a fifth of a cursor's putmulti
            key = schema.event_key(sid, first_seq)
            added = int(self._txn.put(key, values[0], db=self._events_db, overwrite=False))
        else:
            keys = [schema.event_key(sid, seq) for seq in range(first_seq, first_seq + len(values))]
            with self._txn.cursor(db=self._events_db) as cursor:
                _, added = cursor.putmulti(zip(keys, values, strict=True), overwrite=False)
        if added != len(values):
            raise RuntimeError(
                f"{len(values) - added} of the event keys {sid}/{first_seq}.. already exist: "
                "the log is corrupt"
            )
        if self.event_count == 0:
            self.event_sid, self.first_seq = sid, first_seq
        elif sid != self.event_sid or first_seq != self.first_seq + self.event_count:
            raise RuntimeError("a command wrote events that are not one consecutive range")
        self.event_count += len(values)
        self.events.extend(values)

    @property
    def local(self) -> lmdb.Transaction:
        """The transaction itself, for writes of this store's own that no record carries
        (``feed_index``: every copy keeps its own)."""
        return self._txn

    @property
    def wrote(self) -> bool:
        return bool(self.puts or self.deletes or self.erased_positions) or self.event_count > 0


def delete_keys(txn: lmdb.Transaction, db: Any, key: bytes, end_key: bytes = b"") -> int:
    """Remove ``key``, or with ``end_key`` every key in [key, end_key); how many were removed.
    What a primary's erase does, and what a replica or a rebuild does with its StorageDelete."""
    if not end_key:
        return int(txn.delete(key, db=db))
    removed = 0
    cursor = txn.cursor(db=db)
    if not cursor.set_range(key):
        return 0
    while bytes(cursor.key()) < end_key:
        removed += 1
        if not cursor.delete():  # deleting moves the cursor to the next key
            break
        if not cursor.key():
            break
    return removed
