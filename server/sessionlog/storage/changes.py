"""The global change feed: one durable record per committed write, in commit order.

Every command the writer commits (an append, a create, a fork, a lease change) leaves one record
in the ``changes`` table, keyed by its position (dense from 1), in the same transaction as the
write itself, so the feed and the data can never disagree. A record is a serialized
``sessionlog.v1.Change`` holding every put the command made *except* its events, which are
immutable and already stored once: the feed names them by (internal id, first seq, count) and
``read_changes`` appends their stored bytes when it sends the change. Protobuf merges a repeated
field written after the others, so the appended bytes parse as the same message.

A replica applies the puts verbatim and the events under the same keys, and writes the record
under the same position: its data is byte-identical to the primary's, and a replica can itself
serve the feed (or be promoted and carry on from the same positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lmdb

from sessionlog import wire
from sessionlog.storage import damage, schema
from sessionlog.storage.commands import Tables, read_range
from sessionlog.v1 import replication_service_pb2 as rpb

#: The notifier key that wakes change-feed followers; session ids cannot contain NUL.
FEED_KEY = "\x00changes"

_EVENTS_FIELD = rpb.Change.DESCRIPTOR.fields_by_name["events"].number

KIND_BY_NAME = {
    "append": rpb.CHANGE_KIND_APPEND,
    "create": rpb.CHANGE_KIND_CREATE,
    "fork": rpb.CHANGE_KIND_FORK,
    "lease": rpb.CHANGE_KIND_LEASE,
}


class RecordingTxn:
    """A write transaction that remembers what a command puts, for its change record.

    Events go through ``put_events`` and are remembered as a range (consecutive seqs of one
    session); every other put is kept whole.
    """

    def __init__(self, txn: lmdb.Transaction, tables: Tables) -> None:
        self._txn = txn
        self._names = tables.names
        self._events_db = tables.events
        self.puts: list[tuple[str, bytes, bytes]] = []
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

    def put_events(self, sid: int, first_seq: int, values: Sequence[bytes]) -> None:
        """Write events under consecutive seqs of one session from ``first_seq`` on, in one call
        to LMDB; raises if any of those keys is already taken (the log would be corrupt)."""
        if not values:
            return
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

    @property
    def wrote(self) -> bool:
        return bool(self.puts) or self.event_count > 0


def encode_change(
    position: int, kind: str, session_id: str, commit_ns: int, recorded: RecordingTxn
) -> bytes:
    """The stored change record (without its events): the bytes ``Change.SerializeToString``
    gives, written field by field in number order (this runs once per commit, for every append,
    and building the protobuf objects cost more than the rest of a small append)."""
    parts = [
        wire.uint_field(1, position),
        wire.int_field(2, KIND_BY_NAME[kind]),
        _text_field(3, session_id.encode("utf-8")),
        wire.message_field(4, wire.timestamp(commit_ns)),
        wire.uint_field(5, recorded.first_seq),
        wire.uint_field(6, recorded.event_count),
        wire.uint_field(7, max(recorded.event_sid, 0)),
    ]
    for table, key, value in recorded.puts:
        put = _TABLE_FIELDS[table] + _text_field(2, key) + _text_field(3, value)
        parts.append(wire.message_field(8, put))
    return b"".join(parts)


def _text_field(field_number: int, payload: bytes) -> bytes:
    """A string or bytes field; proto3 omits it when empty."""
    return wire.message_field(field_number, payload) if payload else b""


_TABLE_FIELDS = {name.decode(): _text_field(1, name) for name in schema.ALL_DBS}
"""StoragePut.table (field 1) for every table name, encoded once."""


def read_changes(txn: lmdb.Transaction, tables: Tables, start: int, max_bytes: int) -> list[bytes]:
    """Stored changes from position ``start`` on, each with its events appended: the first
    whatever its size, then more while the total stays within ``max_bytes``. A damaged record,
    or one whose events are damaged or missing, raises DataCorrupted naming its position."""
    out: list[bytes] = []
    total = 0
    position = max(start, 1)
    with damage.reading(f"change-feed record {position}", position=position):
        cursor = txn.cursor(db=tables.changes)
        if not cursor.set_range(schema.u64(position)):
            return out
    while True:
        with damage.reading(f"change-feed record {position}", position=position):
            record = _with_events(txn, tables, bytes(cursor.value()))
        total += len(record)
        if out and total > max_bytes:
            break
        out.append(record)
        position += 1
        with damage.reading(f"change-feed record {position}", position=position):
            if not cursor.next():
                break
    return out


def _with_events(txn: lmdb.Transaction, tables: Tables, record: bytes) -> bytes:
    """A stored change record with the events it names appended, as the feed sends it."""
    change = rpb.Change.FromString(record)
    if not change.event_count:
        return record
    stop = change.first_seq + change.event_count
    events = read_range(
        txn, tables, change.internal_id, change.first_seq, stop, session_id=change.session_id
    )
    if len(events) != change.event_count:
        raise damage.missing_events(change.session_id, change.first_seq + len(events), stop)
    return record + wire.length_delimited(_EVENTS_FIELD, events)


def head(txn: lmdb.Transaction, tables: Tables) -> tuple[int, int]:
    """The newest change's (position, commit time in ns); (0, 0) when there is none."""
    with damage.reading("the newest change-feed record"):
        cursor = txn.cursor(db=tables.changes)
        if not cursor.last():
            return 0, 0
        change = rpb.Change.FromString(bytes(cursor.value()))
    return change.position, change.commit_time.ToNanoseconds()


@dataclass
class ReceivedChange:
    """A change as a replica received it: its record (everything but the events, exactly the
    bytes the primary stored) and its events' stored bytes, never re-serialized."""

    record: bytes
    change: rpb.Change
    events: list[bytes]

    @classmethod
    def parse(cls, raw: bytes) -> ReceivedChange:
        record, events = wire.split_field(raw, _EVENTS_FIELD)
        return cls(record, rpb.Change.FromString(record), events)


@dataclass
class ApplyResult:
    """What a replica applied: the last position and its commit time, the sessions touched."""

    last_position: int
    last_commit_ns: int
    sessions: set[str] = field(default_factory=set)


class ApplyChangesCommand:
    """Apply changes received from a primary, verbatim, under their own positions."""

    replicated = True
    kind = "replicate"
    session_id = ""

    def __init__(self, tables: Tables, changes: Sequence[ReceivedChange]) -> None:
        self._tables = tables
        self._changes = changes
        self._touched: list[str] = []

    def size(self) -> int:
        return sum(len(c.record) + sum(map(len, c.events)) for c in self._changes)

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: lmdb.Transaction, now_ns: int) -> ApplyResult:
        tables = self._tables
        by_name = tables.by_name
        last = ApplyResult(0, 0)
        expected = head(txn, tables)[0] + 1
        for received in self._changes:
            change = received.change
            if change.position != expected:
                raise RuntimeError(
                    f"replication gap: expected change {expected}, received {change.position}"
                )
            expected += 1
            for put in change.puts:
                txn.put(put.key, put.value, db=by_name[put.table])
            if len(received.events) != change.event_count:
                raise RuntimeError(f"change {change.position} arrived without all its events")
            for offset, event in enumerate(received.events):
                key = schema.event_key(change.internal_id, change.first_seq + offset)
                txn.put(key, event, db=tables.events)
            txn.put(schema.u64(change.position), received.record, db=tables.changes)
            last.last_position = change.position
            last.last_commit_ns = change.commit_time.ToNanoseconds()
            last.sessions.add(change.session_id)
        self._touched.extend(last.sessions)
        return last
