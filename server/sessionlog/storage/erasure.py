"""Real erasure: deleting a session, redacting events, and what that means for the change feed.

The rest of the store never forgets: events are immutable and the change feed keeps every write
verbatim. An erasure (a privacy request) must reach every copy instead, so each one is a single
write command with its own change record, applied by replicas like any other:

- **DELETE** (``DeleteCommand``) removes every key of the session from every per-session table
  (``PER_SESSION``: one line per table, so a new per-session table is one more line). The
  removals travel as the record's ``deletes`` (key ranges), so a replica removes the same keys.
- **REDACT** (``RedactCommand``) rewrites chosen events to their redacted form (seq, type, time
  and surface_op kept; data and state_delta gone; ``Event.redacted`` set). The new bytes travel
  as puts on the events table.

**The feed rule.** Old records of an erased session still hold (or name) the erased content, and
their checksums cover it. So an erase also rewrites them, in the same transaction, to *erased
placeholders* (``changes.placeholder``): a DELETE's names no session and no events and keeps only
the puts the erase did not remove (the ``next_sid`` counter, a parent's fork request record); a
REDACT's keeps the record but marks it, and serves the redacted bytes of the events it names.
Each keeps its position, kind, time, epoch and its original checksum, which can no longer be
recomputed: the replica's check, ``admin verify`` and rejoin's rebuild take an erased record's
checksum as stored, and every record after it still chains from it. The erase record names the
positions it rewrote (``Change.erased_positions``) and ``changes.erase_earlier`` is the one rule
both sides apply, so a caught-up replica rewrites its own copies to the same bytes; a replica
behind the erase has received the placeholders already, leaves them, and ends the same.

A session's records are found through the feed's index (``feed_index``: its records' positions,
so an erase costs what the session wrote, not what the whole feed holds), once per erase outside
the writer (``scan``); the command itself looks only at the records written since that scan.

Every erase leaves an ``ErasureRecord`` (table ``erasures``) without content.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sessionlog import errors
from sessionlog.records import SessionRecord
from sessionlog.storage import changes, damage, feed_index, indexes, purge, schema
from sessionlog.storage.commands import Written, _check_lease
from sessionlog.storage.reads import Txn, load_lease, load_meta
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import ErasureRecord, LeaseRecord, RequestRecord, SessionMeta
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1.event_pb2 import Event, Redaction

KeyRange = tuple[bytes, bytes]
"""(key, end_key): one key when end_key is empty, else [key, end_key)."""


def _sid_range(sid: int) -> KeyRange:
    return schema.u64(sid), schema.u64(sid + 1)


PER_SESSION: tuple[tuple[str, Callable[[str, int], KeyRange]], ...] = (
    ("sessions", lambda session_id, sid: (session_id.encode(), b"")),
    ("ids", lambda session_id, sid: (schema.u64(sid), b"")),
    ("events", lambda session_id, sid: _sid_range(sid)),
    ("requests", lambda session_id, sid: _sid_range(sid)),
    ("leases", lambda session_id, sid: (session_id.encode(), b"")),
    ("audit", lambda session_id, sid: (schema.audit_prefix(session_id), _after_audit(session_id))),
    ("redactions", lambda session_id, sid: (schema.u64(sid), b"")),
    ("usage", lambda session_id, sid: _sid_range(sid)),
)
"""Every table that holds a session's keys, and the keys it holds for (session id, sid). A
table added for sessions (labels, usage totals) is one line here: DeleteSession then erases it."""


def _after_audit(session_id: str) -> bytes:
    return session_id.encode() + b"\x01"


def session_keys(session_id: str, sid: int) -> list[changes.Removal]:
    """(table, key, end_key) of everything ``PER_SESSION`` erases for the session."""
    return [(table, *keys(session_id, sid)) for table, keys in PER_SESSION]


@dataclass
class Scan:
    """Where a session's records stand in the feed, as read before the erase was queued."""

    positions: dict[str, list[int]] = field(default_factory=dict)
    """Per session id: the positions of its records (a DELETE placeholder names no session)."""
    upto: int = 0
    """The newest position the scan read; the command reads the records after it itself."""


def scan(txn: Txn, tables: Tables, session_ids: Iterable[str], after: int = 0) -> Scan:
    """The feed positions (after ``after``) of the records of ``session_ids``: read from the
    feed's index (``feed_index``) as far as it goes, and by walking the records after that."""
    wanted = set(session_ids)
    indexed = feed_index.walked_from(txn, tables)
    found = _walk(txn, tables, wanted, max(after, indexed))
    if indexed <= after:
        return found
    for session_id in wanted:
        found.positions[session_id][:0] = [
            position
            for position in itertools.takewhile(
                lambda position: position <= indexed,
                feed_index.positions(txn, tables, session_id, after),
            )
            if _names(txn, tables, position, session_id)
        ]
    return found


def _names(txn: Txn, tables: Tables, position: int, session_id: str) -> bool:
    """Whether the record at ``position`` names ``session_id`` still (an erased one may not)."""
    with damage.reading(f"change-feed record {position}", position=position):
        raw = txn.get(schema.u64(position), db=tables.changes)
        return raw is not None and rpb.Change.FromString(bytes(raw)).session_id == session_id


def _walk(txn: Txn, tables: Tables, wanted: set[str], after: int) -> Scan:
    """``scan`` by reading every record after ``after``."""
    found = Scan(positions={session_id: [] for session_id in wanted}, upto=after)
    cursor = txn.cursor(db=tables.changes)
    with damage.reading("the change feed, for an erase"):
        if not cursor.set_range(schema.u64(after + 1)):
            return found
        for key, value in cursor:
            found.upto = schema.read_u64(key)
            change = rpb.Change.FromString(bytes(value))
            if change.session_id in wanted:
                found.positions[change.session_id].append(found.upto)
    return found


def _next_position(txn: RecordingTxn, tables: Tables) -> int:
    """The position the writer gives this command's record: one past the newest (an earlier
    command of the same group has already put its own)."""
    cursor = txn.cursor(db=tables.changes)
    return schema.read_u64(cursor.key()) + 1 if cursor.last() else 1


def _missing(session_id: str) -> errors.SessionNotFound:
    return errors.SessionNotFound(
        f"session '{session_id}' is not stored (never written, or already deleted)",
        session_id=session_id,
    )


# -- delete -------------------------------------------------------------------------------------


@dataclass
class DeleteResult(Written):
    """What a delete erased: the session as it was (its meta, record and live lease), and how
    much."""

    session_id: str
    meta: SessionMeta
    event_count: int
    feed_records: int
    record: SessionRecord | None = None
    lease: LeaseRecord | None = None


class DeleteCommand:
    """Erase one session from every per-session table, and its old records from the feed."""

    def __init__(
        self,
        tables: Tables,
        session_id: str,
        found: Scan,
        *,
        expected_seq: int | None = None,
        lease_holder: str = "",
        force: bool = False,
        actor: str = "",
        reason: str = "",
        copy_of: Callable[[str], errors.SessionLogError | None] | None = None,
        still_due: Callable[[Txn, str, SessionMeta, int], bool] | None = None,
    ) -> None:
        self._tables = tables
        self._still_due = still_due
        """The retention sweeper's re-check, asked in the transaction: False (the session was
        pinned, its expiry extended, or it was written since) refuses with NotExpired."""
        self._found = found
        self._copy_of = copy_of
        self._expected_seq = expected_seq
        self._lease_holder = lease_holder
        self._force = force
        self._actor = actor
        self._reason = reason
        self.kind = "delete"
        self.session_id = session_id
        self.moving_in = copy_of is not None
        """A slot move's stale copy (``copy_of``): the writer's ownership check is not asked (the
        group does not own it); ``copy_of`` is, in the transaction, and refuses an owned one."""
        self._touched: list[str] = []

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: RecordingTxn, now_ns: int) -> DeleteResult:
        tables, session_id = self._tables, self.session_id
        if self._copy_of is not None:
            refusal = self._copy_of(session_id)
            if refusal is not None:
                raise refusal
        meta = load_meta(txn, tables, session_id)
        if meta is None:
            raise _missing(session_id)
        if self._still_due is not None and not self._still_due(txn, session_id, meta, now_ns):
            raise errors.NotExpired(
                f"session '{session_id}' is no longer due for retention", session_id=session_id
            )
        if self._expected_seq is not None and self._expected_seq != meta.next_seq:
            raise errors.SeqConflict(
                f"session '{session_id}' expected seq {self._expected_seq} but the log is at "
                f"{meta.next_seq}; re-read it before deleting, or leave expected_seq unset",
                expected_seq=self._expected_seq,
                next_seq=meta.next_seq,
            )
        lease = load_lease(txn, tables, session_id)
        if not self._force:
            _check_lease(lease, session_id, self._lease_holder, 0, now_ns)
        record = indexes.load_record(txn, tables, session_id)
        live = lease if lease is not None and lease.live(now_ns) else None
        position = _next_position(txn, tables)
        removals = [
            *session_keys(session_id, meta.sid),
            *_index_keys(txn, tables, session_id, meta),
            *_fork_requests(txn, tables, session_id, meta),
        ]
        if meta.next_seq >= purge.PURGE_FROM:
            rewritten = _tombstone(txn, tables, session_id, meta.sid, position, removals)
        else:
            # a session the scan left out (it was long then) is looked up from position 1
            scanned = session_id in self._found.positions
            later = scan(txn, tables, [session_id], self._found.upto if scanned else 0)
            olds = [*self._found.positions.get(session_id, []), *later.positions[session_id]]
            earlier = _earlier_life(txn, tables, session_id)
            olds = [position for position in olds if position > earlier]
            rewritten = changes.erase_earlier(
                txn, tables, rpb.CHANGE_KIND_DELETE, sorted(olds), removals, txn.erase_record
            )
            for table, key, end_key in removals:
                txn.delete(tables.by_name[table], key, end_key)
        audit = ErasureRecord(
            kind=schema.DELETE,
            session_id=session_id,
            sid=meta.sid,
            actor=self._actor,
            reason=self._reason,
            time_ns=now_ns,
            event_count=meta.next_seq,
            seqs=[],
            feed_records=rewritten,
        )
        txn.put(schema.u64(position), audit.encode(), db=tables.erasures)
        self._touched.append(session_id)
        return DeleteResult(session_id, meta, meta.next_seq, rewritten, record, live)


def _earlier_life(txn: Txn, tables: Tables, session_id: str) -> int:
    """The newest position of an earlier session of this id whose purge is pending (0: none):
    its records, which still name the id, are that purge's to rewrite with that session's
    removals; rewritten here with this one's, they would keep that session's puts."""
    lives = [mark.upto for mark in purge.pending(txn, tables) if mark.session_id == session_id]
    return max(lives, default=0)


def _tombstone(
    txn: RecordingTxn,
    tables: Tables,
    session_id: str,
    sid: int,
    position: int,
    removals: Sequence[changes.Removal],
) -> int:
    """A long session's delete (``purge``): remove now what readers find it by, and mark its
    records and its sid ranges for the chunks. No record is rewritten here (0)."""
    later = {(table, schema.u64(sid), schema.u64(sid + 1)) for table in purge.CHUNKED}
    for table, key, end_key in removals:
        if (table, key, end_key) not in later:  # a parent's fork request goes now
            txn.delete(tables.by_name[table], key, end_key)
    purge.mark(txn, tables, session_id, sid, position, removals)
    return 0


def _index_keys(
    txn: RecordingTxn, tables: Tables, session_id: str, meta: SessionMeta
) -> list[changes.Removal]:
    """The session's record and its index entries (``indexes``): its place in ``recent``, its
    labels, owner and status in ``labels``, and its entry under its parent in ``children``. Its
    own children's entries stay: they still exist and still name it as their parent."""
    record = indexes.load_record(txn, tables, session_id)
    found: list[changes.Removal] = [
        ("records", session_id.encode(), b""),
        ("recent", schema.recent_key(indexes.update_time(meta, record), session_id), b""),
    ]
    for key, value in indexes.indexed_pairs(record).items():
        found.append(("labels", schema.label_prefix(key, value) + session_id.encode(), b""))
    if meta.parent_id:
        found.append(("children", schema.child_prefix(meta.parent_id) + session_id.encode(), b""))
    expiry = indexes.expiry_key(session_id, record)
    if expiry is not None:
        found.append(("expiry", expiry, b""))
    return found


def _fork_requests(
    txn: RecordingTxn, tables: Tables, session_id: str, meta: SessionMeta
) -> list[changes.Removal]:
    """The parent's request records of the fork that made this session (a fork's request id is
    kept under its parent and names the child): a retry of that fork must not find a child that
    is gone. Without the record, it forks again."""
    if not meta.parent_id:
        return []
    parent = load_meta(txn, tables, meta.parent_id)
    if parent is None:
        return []
    found: list[changes.Removal] = []
    start, end = _sid_range(parent.sid)
    cursor = txn.cursor(db=tables.requests)
    if not cursor.set_range(start):
        return found
    for key, value in cursor:
        if bytes(key) >= end:
            break
        with damage.reading(f"a request record of session '{meta.parent_id}'"):
            record = RequestRecord.decode(value)
        if record.child_id == session_id:
            found.append(("requests", bytes(key), b""))
    return found


# -- redact -------------------------------------------------------------------------------------


@dataclass
class RedactResult(Written):
    """The seqs a redaction changed (those already redacted are left out)."""

    seqs: list[int]


def redacted(event: Event, now_ns: int, reason: str) -> Event:
    """The redacted form of a stored event: seq, type, time, surface_op and usage, and the
    mark. Usage stays: it holds no content (a model name and counts), the ledger's totals keep
    counting it, and the reads that fold usage from events (GetUsage at_seq, a fork's totals)
    must agree with them."""
    out = Event(seq=event.seq, type=event.type)
    if event.HasField("time"):
        out.time.CopyFrom(event.time)
    if event.HasField("surface_op"):
        out.surface_op.CopyFrom(event.surface_op)
    if event.HasField("usage"):
        out.usage.CopyFrom(event.usage)
    mark = Redaction(reason=reason)
    mark.redact_time.FromNanoseconds(now_ns)
    out.redacted.CopyFrom(mark)
    return out


class RedactCommand:
    """Rewrite chosen events of a session to their redacted form."""

    def __init__(
        self,
        tables: Tables,
        session_id: str,
        seqs: Sequence[int],
        found: Scan,
        *,
        reason: str = "",
        lease_holder: str = "",
        actor: str = "",
    ) -> None:
        self._tables = tables
        self._found = found
        self._seqs = sorted(set(seqs))
        self._reason = reason
        self._lease_holder = lease_holder
        self._actor = actor
        self.kind = "redact"
        self.session_id = session_id
        self.moving_in = False
        self._touched: list[str] = []

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: RecordingTxn, now_ns: int) -> RedactResult:
        tables, session_id = self._tables, self.session_id
        meta = load_meta(txn, tables, session_id)
        if meta is None:
            raise _missing(session_id)
        _check_lease(load_lease(txn, tables, session_id), session_id, self._lease_holder, 0, now_ns)
        past = [seq for seq in self._seqs if seq >= meta.next_seq]
        if past:
            raise errors.BoundaryOutOfRange(
                f"cannot redact seq {past[0]} of session '{session_id}': it has "
                f"{meta.next_seq} events (seqs 0 to {meta.next_seq - 1}); nothing was redacted",
                seq=past[0],
                next_seq=meta.next_seq,
            )
        stored: list[tuple[bytes, Event]] = []
        for seq in self._seqs:
            key = schema.event_key(meta.sid, seq)
            raw = txn.get(key, db=tables.events)
            if raw is None:
                raise damage.missing_events(session_id, seq, seq + 1)
            event = damage.decode_events([bytes(raw)], seq, session_id)[0]
            if not event.HasField("redacted"):
                stored.append((key, event))
        if not stored:
            return RedactResult([])
        position = _next_position(txn, tables)
        olds = self._records_naming(txn, meta.sid, [event.seq for _, event in stored])
        # Before the events change: an unchecksummed record's fingerprint reads them.
        rewritten = changes.erase_earlier(
            txn, tables, rpb.CHANGE_KIND_REDACT, sorted(olds), [], txn.erase_record
        )
        for key, event in stored:
            txn.rewrite_event(key, redacted(event, now_ns, self._reason).SerializeToString())
        raw_count = txn.get(schema.u64(meta.sid), db=tables.redactions)
        count = 0 if raw_count is None else schema.read_u64(raw_count)
        txn.put(schema.u64(meta.sid), schema.u64(count + 1), db=tables.redactions)
        seqs = [event.seq for _, event in stored]
        audit = ErasureRecord(
            kind=schema.REDACT,
            session_id=session_id,
            sid=meta.sid,
            actor=self._actor,
            reason=self._reason,
            time_ns=now_ns,
            event_count=len(seqs),
            seqs=seqs,
            feed_records=rewritten,
        )
        txn.put(schema.u64(position), audit.encode(), db=tables.erasures)
        self._touched.append(session_id)
        return RedactResult(seqs)

    def _records_naming(self, txn: RecordingTxn, sid: int, seqs: Sequence[int]) -> list[int]:
        """The feed records not yet erased that name any of ``seqs`` of ``sid``: of those the
        scan found (and the records written since it), the ones whose events include one."""
        session_id = self.session_id
        later = scan(txn, self._tables, [session_id], self._found.upto).positions[session_id]
        wanted = set(seqs)
        out: list[int] = []
        for position in [*self._found.positions.get(session_id, []), *later]:
            raw = txn.get(schema.u64(position), db=self._tables.changes)
            if raw is None:
                continue
            change = rpb.Change.FromString(bytes(raw))
            names = range(change.first_seq, change.first_seq + change.event_count)
            if change.internal_id == sid and not change.erased and wanted.intersection(names):
                out.append(position)
        return out
