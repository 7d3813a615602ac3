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

**Checksums chain the records.** Every record ends with a ``checksum`` field: the first 16 bytes
of SHA-256 over the previous record's checksum, the record's own fields as stored (without the
checksum) and its events as field 9. So the checksum at position N stands for the whole history
1..N: two stores whose records at N have the same checksum hold the same feed up to N. A replica
recomputes each checksum before it applies a record (a record that does not follow its own
previous one is refused: its history is not the primary's), and on connect it names its newest
record's checksum, which the primary checks against its own (``check_after``). Records written
before checksums existed have none; their *fingerprint* is the same hash with no previous
checksum, and the chain starts again after them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lmdb

from sessionlog import errors, wire
from sessionlog.storage import damage, feed_index, leadership, schema
from sessionlog.storage.reads import Txn, read_range
from sessionlog.storage.recording import RecordingTxn, delete_keys
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb

#: The notifier key that wakes change-feed followers; session ids cannot contain NUL.
FEED_KEY = "\x00changes"

_CHANGE = {f.name: f.number for f in rpb.Change.DESCRIPTOR.fields}
"""Change's field numbers by name, from the generated descriptor: never copied by hand."""
_PUT = {f.name: f.number for f in rpb.StoragePut.DESCRIPTOR.fields}
_EVENTS_FIELD = _CHANGE["events"]
_CHECKSUM_FIELD = _CHANGE["checksum"]
CHECKSUM_BYTES = 16
_CHECKSUM_PREFIX = wire.tag(_CHECKSUM_FIELD, wire.LENGTH_DELIMITED) + wire.varint(CHECKSUM_BYTES)
_CHECKSUM_TAIL = len(_CHECKSUM_PREFIX) + CHECKSUM_BYTES

KIND_BY_NAME = {
    "append": rpb.CHANGE_KIND_APPEND,
    "create": rpb.CHANGE_KIND_CREATE,
    "fork": rpb.CHANGE_KIND_FORK,
    "lease": rpb.CHANGE_KIND_LEASE,
    "delete": rpb.CHANGE_KIND_DELETE,
    "redact": rpb.CHANGE_KIND_REDACT,
    "update": rpb.CHANGE_KIND_UPDATE,
}


def encode_change(
    position: int,
    kind: str,
    session_id: str,
    commit_ns: int,
    recorded: RecordingTxn,
    epoch: int = 0,
) -> bytes:
    """The stored change record (without its events): the bytes ``Change.SerializeToString``
    gives, written field by field in number order (this runs once per commit, for every append,
    and building the protobuf objects cost more than the rest of a small append). Field numbers
    come from the generated descriptor (``_CHANGE``, ``_PUT``); ``test_record_formats`` checks
    the bytes against ``SerializeToString``. Every tag is encoded once, at import, and the commit
    time once per group (every command of a group shares it). ``epoch`` is the writer's, read
    from the leadership record in the same transaction (see ``leadership``)."""
    varint = wire.varint
    parts = [_POSITION_TAG, varint(position)] if position else []
    parts.append(_KIND_FIELDS[kind])
    if session_id:
        name = session_id.encode("utf-8")
        parts += (_SESSION_ID_TAG, varint(len(name)), name)
    parts.append(_commit_time_field(commit_ns))
    if recorded.first_seq:
        parts += (_FIRST_SEQ_TAG, varint(recorded.first_seq))
    if recorded.event_count:
        parts += (_EVENT_COUNT_TAG, varint(recorded.event_count))
    if recorded.event_sid > 0:
        parts += (_INTERNAL_ID_TAG, varint(recorded.event_sid))
    for table, key, value in recorded.puts:
        put = [_TABLE_FIELDS[table]]
        if key:
            put += (_KEY_TAG, varint(len(key)), key)
        if value is None:
            put.append(_REMOVE_FIELD)
        elif value:
            put += (_VALUE_TAG, varint(len(value)), value)
        body = b"".join(put)
        parts += (_PUTS_TAG, varint(len(body)), body)
    if epoch:
        parts += (_EPOCH_TAG, varint(epoch))
    for table, key, end_key in recorded.deletes:
        removal = [_TABLE_FIELDS[table]]
        if key:
            removal += (_KEY_TAG, varint(len(key)), key)
        if end_key:
            removal += (_END_KEY_TAG, varint(len(end_key)), end_key)
        body = b"".join(removal)
        parts += (_DELETES_TAG, varint(len(body)), body)
    if recorded.erased_positions:
        parts.append(wire.packed_uints(_CHANGE["erased_positions"], recorded.erased_positions))
    return b"".join(parts)


_POSITION_TAG = wire.tag(_CHANGE["position"], wire.VARINT)
_KIND_FIELDS = {name: wire.int_field(_CHANGE["kind"], kind) for name, kind in KIND_BY_NAME.items()}
_SESSION_ID_TAG = wire.tag(_CHANGE["session_id"], wire.LENGTH_DELIMITED)
_FIRST_SEQ_TAG = wire.tag(_CHANGE["first_seq"], wire.VARINT)
_EVENT_COUNT_TAG = wire.tag(_CHANGE["event_count"], wire.VARINT)
_INTERNAL_ID_TAG = wire.tag(_CHANGE["internal_id"], wire.VARINT)
_PUTS_TAG = wire.tag(_CHANGE["puts"], wire.LENGTH_DELIMITED)
_EPOCH_TAG = wire.tag(_CHANGE["epoch"], wire.VARINT)
_KEY_TAG = wire.tag(_PUT["key"], wire.LENGTH_DELIMITED)
_VALUE_TAG = wire.tag(_PUT["value"], wire.LENGTH_DELIMITED)
_DELETES_TAG = wire.tag(_CHANGE["deletes"], wire.LENGTH_DELIMITED)
_END_KEY_TAG = wire.tag(
    rpb.StorageDelete.DESCRIPTOR.fields_by_name["end_key"].number, wire.LENGTH_DELIMITED
)
_REMOVE_FIELD = wire.int_field(_PUT["remove"], 1)
_last_commit_time = (0, wire.message_field(_CHANGE["commit_time"], wire.timestamp(0)))
"""The commit_time field last encoded, with its time in ns (one tuple: swapped whole)."""


def _commit_time_field(commit_ns: int) -> bytes:
    global _last_commit_time
    last_ns, field = _last_commit_time
    if last_ns != commit_ns:
        field = wire.message_field(_CHANGE["commit_time"], wire.timestamp(commit_ns))
        _last_commit_time = (commit_ns, field)
    return field


def apply_put(txn: lmdb.Transaction, put: rpb.StoragePut, by_name: Any) -> None:
    """One recorded write, as a replica (or a rebuild) repeats it: a put, or a removal."""
    if put.remove:
        txn.delete(put.key, db=by_name[put.table])
    else:
        txn.put(put.key, put.value, db=by_name[put.table])


def chain(previous: bytes, record: bytes, events: Sequence[bytes]) -> bytes:
    """The checksum of a record (its stored bytes without a checksum) that follows a record
    whose checksum is ``previous`` (b"" for the first record, or after one that has none)."""
    digest = hashlib.sha256(previous)  # SHA-256: hardware-accelerated where BLAKE2 is not
    digest.update(record)
    digest.update(wire.length_delimited(_EVENTS_FIELD, events))
    return digest.digest()[:CHECKSUM_BYTES]


def with_checksum(record: bytes, checksum: bytes) -> bytes:
    """The stored record: its fields, then its checksum (always the last field)."""
    return record + _CHECKSUM_PREFIX + checksum


def without_checksum(record: bytes, checksum: bytes) -> bytes:
    """A stored record's bytes as they were hashed (everything but the checksum field)."""
    if (
        checksum
        and record.endswith(checksum)
        and record[-_CHECKSUM_TAIL:].startswith(_CHECKSUM_PREFIX)
    ):
        return record[:-_CHECKSUM_TAIL]
    return wire.split_field(record, _CHECKSUM_FIELD)[0]


class ChecksumChain:
    """Checks the chained checksums of a feed read in position order (``admin verify``): each
    call takes the next record as stored and its events, and says what is wrong, if anything."""

    def __init__(self) -> None:
        self._previous = b""

    def __call__(self, position: int, record: bytes, events: Sequence[bytes]) -> str | None:
        record = bytes(record)
        change = rpb.Change.FromString(record)
        checksum = change.checksum
        if change.erased:  # rewritten by an erasure: its checksum is taken as stored
            self._previous = checksum
            return None
        if not checksum:  # written before checksums: the chain starts again after it
            self._previous = chain(b"", record, [bytes(e) for e in events])
            return None
        expected = chain(
            self._previous, without_checksum(record, checksum), list(map(bytes, events))
        )
        self._previous = checksum
        if expected != checksum:
            return (
                "its checksum does not match the record, its events and the record before it: "
                "one of them is damaged"
            )
        return None


def _text_field(field_number: int, payload: bytes) -> bytes:
    """A string or bytes field; proto3 omits it when empty."""
    return wire.message_field(field_number, payload) if payload else b""


_TABLE_FIELDS = {name.decode(): _text_field(_PUT["table"], name) for name in schema.ALL_DBS}
"""StoragePut.table for every table name, encoded once."""


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


def sessions_after(
    txn: lmdb.Transaction, tables: Tables, after: int, skip: Sequence[tuple[int, int]] = ()
) -> tuple[int, set[str]]:
    """The newest position, and the sessions whose logs the changes after position ``after``
    wrote (FEED_KEY too when there are any), leaving out the changes at positions inside the
    (first, last) spans of ``skip`` (sorted). Lease changes write no log and wake no one.
    Reads the records only, never their events."""
    sessions: set[str] = set()
    position = after
    cursor = txn.cursor(db=tables.changes)
    with damage.reading(f"change-feed record {after + 1}", position=after + 1):
        if not cursor.set_range(schema.u64(after + 1)):
            return after, sessions
        spans = iter(skip)
        span = next(spans, None)
        for key, value in cursor:
            position = schema.read_u64(key)
            while span is not None and span[1] < position:
                span = next(spans, None)
            if span is not None and span[0] <= position:
                continue
            change = rpb.Change.FromString(bytes(value))
            if change.kind != rpb.CHANGE_KIND_LEASE:
                sessions.add(change.session_id)
            sessions.add(FEED_KEY)
    return position, sessions


def head(txn: lmdb.Transaction, tables: Tables) -> tuple[int, int]:
    """The newest change's (position, commit time in ns); (0, 0) when there is none."""
    with damage.reading("the newest change-feed record"):
        cursor = txn.cursor(db=tables.changes)
        if not cursor.last():
            return 0, 0
        change = rpb.Change.FromString(bytes(cursor.value()))
    return change.position, change.commit_time.ToNanoseconds()


def first(txn: lmdb.Transaction, tables: Tables) -> int:
    """The oldest stored change's position; 0 when there is none. Positions before it are not
    in this store (a store restored from a snapshot or rebuilt from another's begins later)."""
    cursor = txn.cursor(db=tables.changes)
    return schema.read_u64(cursor.key()) if cursor.first() else 0


def tail(txn: lmdb.Transaction, tables: Tables) -> tuple[int, bytes]:
    """The newest change's position and fingerprint; (0, b"") when there is none. Read inside
    the write transaction that appends after it: nothing cached decides a position."""
    cursor = txn.cursor(db=tables.changes)
    if not cursor.last():
        return 0, b""
    record = bytes(cursor.value())
    change = rpb.Change.FromString(record)
    return change.position, fingerprint(txn, tables, record, change)


def fingerprint_at(txn: lmdb.Transaction, tables: Tables, position: int) -> bytes | None:
    """The fingerprint of the change at ``position``, or None when there is none."""
    raw = txn.get(schema.u64(position), db=tables.changes)
    if raw is None:
        return None
    record = bytes(raw)
    return fingerprint(txn, tables, record, rpb.Change.FromString(record))


def fingerprint(txn: Txn, tables: Tables, record: bytes, change: rpb.Change) -> bytes:
    """A record's checksum; for a record written before checksums, the same hash of it and its
    events with no previous checksum (what a replica computes for the same record)."""
    if change.checksum:
        return change.checksum
    events: list[bytes] = []
    if change.event_count:
        stop = change.first_seq + change.event_count
        events = read_range(txn, tables, change.internal_id, change.first_seq, stop)
    return chain(b"", record, events)


def holds_after(txn: lmdb.Transaction, tables: Tables, position: int, checksum: bytes) -> bool:
    """Whether this store's history holds, at ``position``, a change whose fingerprint is
    ``checksum``: its own change there has it, or (a store that begins right after it, restored
    or rebuilt from another's) its first change's checksum chains over it."""
    mine = fingerprint_at(txn, tables, position)
    if mine is not None:
        return mine == checksum
    raw = txn.get(schema.u64(position + 1), db=tables.changes)
    if raw is None:
        return False
    record = bytes(raw)
    change = rpb.Change.FromString(record)
    if change.erased or not change.checksum:  # nothing chains over the change before it
        return False
    events: list[bytes] = []
    if change.event_count:
        stop = change.first_seq + change.event_count
        events = read_range(txn, tables, change.internal_id, change.first_seq, stop)
    return chain(checksum, without_checksum(record, change.checksum), events) == change.checksum


def check_after(txn: lmdb.Transaction, tables: Tables, start: int, checksum: bytes) -> None:
    """Refuse a feed reader whose change at ``start - 1`` is not this store's: HistoryDiverged.

    ``checksum`` is what the reader holds there; an empty one, or a start at the beginning,
    checks nothing."""
    if not checksum or start <= 1:
        return
    position = start - 1
    mine = fingerprint_at(txn, tables, position)
    newest = head(txn, tables)[0]
    raw = txn.get(schema.HISTORY_ID, db=tables.counters)
    history = "" if raw is None else bytes(raw).decode()
    if mine is None:
        raise errors.HistoryDiverged(
            f"this server's change feed ends at position {newest}, before your position "
            f"{position}: your data is not on its history (a primary restored from an older "
            "backup, or another primary). Resync the replica (sessionlog replica resync)",
            position=position,
            head_position=newest,
            history_id=history,
        )
    if mine != checksum:
        raise errors.HistoryDiverged(
            f"your change at position {position} is not this server's (the checksums differ): "
            "your data is not on its history (another primary, or one restored from a backup and "
            "written since). Resync the replica (sessionlog replica resync)",
            position=position,
            head_position=newest,
            history_id=history,
        )


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
    """What a replica applied: the last position, its commit time and fingerprint, the sessions
    touched."""

    last_position: int
    last_commit_ns: int
    last_checksum: bytes = b""
    sessions: set[str] = field(default_factory=set)


class ApplyChangesCommand:
    """Apply changes received from a primary, verbatim, under their own positions."""

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
        """Check every received change first (dense positions, all events there, each checksum
        chaining from the one before), then write them all: a refused batch writes nothing."""
        tables = self._tables
        last = ApplyResult(0, 0)
        expected, previous = tail(txn, tables)
        expected += 1
        fingerprints = []
        known = record = leadership.read(txn, tables)
        for received in self._changes:
            change = received.change
            if change.position != expected:
                raise RuntimeError(
                    f"replication gap: expected change {expected}, received {change.position}"
                )
            if len(received.events) != change.event_count:
                raise RuntimeError(f"change {change.position} arrived without all its events")
            previous = self._follows(received, previous)
            record = _in_epoch(record, change)
            fingerprints.append(previous)
            expected += 1
        if record != known:
            leadership.write(txn, tables, record)
        for received, fingerprint in zip(self._changes, fingerprints, strict=True):
            change = received.change
            apply_writes(txn, tables, change)
            for offset, event in enumerate(received.events):
                key = schema.event_key(change.internal_id, change.first_seq + offset)
                txn.put(key, event, db=tables.events)
            txn.put(schema.u64(change.position), received.record, db=tables.changes)
            feed_index.note(txn, tables, change.position, change.session_id)
            last.last_position = change.position
            last.last_commit_ns = change.commit_time.ToNanoseconds()
            last.last_checksum = fingerprint
            last.sessions.add(change.session_id)
        if last.last_position:
            feed_index.advance(txn, tables, self._changes[0].change.position, last.last_position)
        self._touched.extend(last.sessions)
        return last

    @staticmethod
    def _follows(received: ReceivedChange, previous: bytes) -> bytes:
        """The received record's fingerprint, once its checksum proves it follows ``previous``
        (this store's newest record); HistoryDiverged when it does not (nothing is applied)."""
        change, record = received.change, received.record
        if change.erased:  # rewritten by an erasure: its checksum is taken as stored
            return change.checksum
        if not change.checksum:  # a record from before checksums: nothing to check it by
            return chain(b"", record, received.events)
        expected = chain(previous, without_checksum(record, change.checksum), received.events)
        if expected != change.checksum:
            raise errors.HistoryDiverged(
                f"change {change.position} from the primary does not follow this replica's "
                f"change {change.position - 1} (the checksums differ): the replica's data is not "
                "on the primary's history. Resync it (sessionlog replica resync)",
                position=change.position,
            )
        return expected


def apply_writes(txn: lmdb.Transaction, tables: Tables, change: rpb.Change) -> None:
    """A received (or rebuilt) change's writes as the primary made them: its erased records
    first (their placeholders may read events the rest removes), then its puts (an index
    entry's removal among them, in order) and its range deletes."""
    if change.erased_positions:

        def rewrite(position: int, erased: bytes) -> None:
            txn.put(schema.u64(position), erased, db=tables.changes)

        removals = [(d.table, d.key, d.end_key) for d in change.deletes]
        erase_earlier(txn, tables, change.kind, change.erased_positions, removals, rewrite)
    by_name = tables.by_name
    for put in change.puts:
        before = txn.get(put.key, db=tables.changes) if put.table == "changes" else None
        apply_put(txn, put, by_name)
        if before is not None and not put.remove:  # a purge's placeholder
            named = rpb.Change.FromString(bytes(before)).session_id
            feed_index.rewritten(txn, tables, schema.read_u64(put.key), named, put.value)
    for removal in change.deletes:
        delete_keys(txn, by_name[removal.table], removal.key, removal.end_key)


Removal = tuple[str, bytes, bytes]
"""(table, key, end_key): one key when end_key is empty, else [key, end_key)."""


def covered(removals: Sequence[Removal], table: str, key: bytes) -> bool:
    """Whether ``key`` of ``table`` is among ``removals``."""
    for removed_table, start, end in removals:
        if removed_table == table and (key == start if not end else start <= key < end):
            return True
    return False


def erase_earlier(
    txn: Txn,
    tables: Tables,
    kind: int,
    positions: Sequence[int],
    removals: Sequence[Removal],
    write: Callable[[int, bytes], None],
) -> int:
    """Rewrite the records at ``positions`` to the placeholders of an erase of ``kind``
    (``write`` stores each); how many were rewritten. The rule, the same on a primary and its
    replicas: a DELETE's placeholder keeps the puts its ``removals`` do not remove (and none on
    the changes table), a REDACT's marks the record. A record already in that form (a replica
    behind the erase received it so) is left."""
    rewritten = 0
    for position in positions:
        raw = txn.get(schema.u64(position), db=tables.changes)
        if raw is None:
            continue
        record = bytes(raw)
        change = rpb.Change.FromString(record)
        if kind == rpb.CHANGE_KIND_DELETE:
            if not change.session_id:  # already a delete's placeholder
                continue

            def keep(put: rpb.StoragePut) -> bool:
                return put.table != "changes" and not covered(removals, put.table, put.key)

            erased = placeholder(txn, tables, record, keep)
        else:
            if change.erased:
                continue
            erased = placeholder(txn, tables, record)
        write(position, erased)
        feed_index.rewritten(txn, tables, position, change.session_id, erased)
        rewritten += 1
    return rewritten


def placeholder(
    txn: Txn,
    tables: Tables,
    record: bytes,
    keep_put: Callable[[rpb.StoragePut], bool] | None = None,
) -> bytes:
    """The erased form of a stored record (see ``Change.erased``). With ``keep_put`` (a
    DELETE's), the placeholder names no session and no events and keeps only the puts
    ``keep_put`` accepts; without it (a REDACT's), the record stays whole but is marked. The
    stored checksum is kept (for a record from before checksums, its fingerprint, computed now
    while its events are still there), so the chain after it verifies unchanged."""
    change = rpb.Change.FromString(record)
    checksum = fingerprint(txn, tables, record, change)
    if keep_put is not None:
        kept = [put for put in change.puts if keep_put(put)]
        change = rpb.Change(
            position=change.position,
            kind=change.kind,
            commit_time=change.commit_time,
            puts=kept,
            epoch=change.epoch,
            deletes=change.deletes,
        )
    change.ClearField("checksum")
    change.erased = True
    return with_checksum(change.SerializeToString(), checksum)


def _in_epoch(record: leadership.Leadership, change: rpb.Change) -> leadership.Leadership:
    """The leadership record once ``change`` is applied: its epoch joins the history when it is
    new. A change from an older epoch than the newest applied is refused (nothing is applied):
    epochs never fall along one feed."""
    if change.epoch < record.last_epoch:
        raise errors.HistoryDiverged(
            f"change {change.position} from the primary is of epoch {change.epoch}, older than "
            f"epoch {record.last_epoch} of the changes before it: the primary's feed is not this "
            "replica's history. Rejoin it (sessionlog replica rejoin)",
            position=change.position,
            epoch=change.epoch,
        )
    return leadership.observed(record, change.epoch, change.position)
