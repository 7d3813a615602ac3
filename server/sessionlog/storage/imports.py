"""ImportSession's write: a session as it was elsewhere, seqs, times and record kept.

An import comes in chunks. The first (``first_seq`` 0, no session yet) creates the session
with the record it names (create time, fork parent) and marks it imported (the meta's format
byte, ``schema.META_FORMAT_IMPORTED``); each later chunk continues it at exactly its next seq.
A chunk is one command, so one transaction and one change-feed record whose puts (the meta,
request records, lease, audit) a replica copies.

Invariants:

- seqs stay dense: a chunk whose ``first_seq`` is not the session's next seq (a gap or an
  overlap) writes nothing (IMPORT_SEQ_MISMATCH, naming the next seq);
- only an imported session takes chunks: a session created any other way is refused
  (SESSION_ALREADY_EXISTS), so an import can never rewrite or extend a session's own history.
  A slot move's chunk is the exception: it only reaches a group that does not own the slot
  (``Ownership.check_copy``), where such a session is the copy a move away left behind, a
  prefix of the session's history that a move back continues at its next seq;
- events are checked as an append checks them (``fold.admit``, strict);
- a chunk's explicit last-append time is not before the session's create time (INVALID_IMPORT;
  the other record checks need no state, ``service.importing``);
- the extras of a slot move (request records, lease, audit) come only from a caller the
  servicer checked for the admin permission. The lease check an append makes is skipped for a
  move's chunk (the lease it carries is the source's, held by a worker), made for any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sessionlog import errors, fold, wire
from sessionlog.records import SessionRecord
from sessionlog.storage import damage, indexes, ledger, schema
from sessionlog.storage.commands import AppendBatch, AppendResult, _check_lease, _new_session
from sessionlog.storage.reads import Txn, load_lease, load_meta
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import AuditRecord, LeaseRecord, RequestRecord, SessionMeta
from sessionlog.storage.tables import Tables

MAX_REQUEST_RECORDS = 10_000
"""Request records one chunk may carry, and the newest a session's records read returns."""


@dataclass
class ImportBatch:
    """One chunk, checked as far as it can be without the session's state."""

    events: AppendBatch
    """The events as an append would write them (``prepare_append``; seqs cleared)."""
    first_seq: int
    create_time_ns: int | None = None
    last_append_time_ns: int | None = None
    """Unset: the chunk's last event's time (see the proto's ImportSessionRequest)."""
    last_event_time_ns: int | None = None
    parent_id: str = ""
    parent_length: int = 0
    requests: Sequence[tuple[str, RequestRecord]] = ()
    lease: LeaseRecord | None = None
    audit: Sequence[AuditRecord] = ()
    moving_in: bool = False
    """A slot move's chunk: ``admits`` is not asked, the lease is not checked."""
    record: SessionRecord | None = None
    """The session's record (title, labels, owner, status, parent_seq, update time), checked:
    it replaces the one stored (a slot move's last chunk carries the latest)."""


@dataclass
class SessionRecords:
    """What a session holds besides its events and its meta (GetSessionRecords)."""

    meta: SessionMeta | None
    requests: list[tuple[str, RequestRecord]] = field(default_factory=list)
    lease: LeaseRecord | None = None
    audit: list[AuditRecord] = field(default_factory=list)
    record: SessionRecord | None = None
    """The person-set fields, read with the meta so the two agree."""


class ImportCommand:
    """One import chunk as the writer applies it (the module docstring's rules)."""

    def __init__(self, tables: Tables, batch: ImportBatch) -> None:
        self._tables = tables
        self._batch = batch
        self.kind = "append"
        self.session_id = batch.events.session_id
        self.moving_in = batch.moving_in
        self._touched: list[str] = []

    def size(self) -> int:
        return sum(map(len, self._batch.events.bodies))

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: RecordingTxn, now_ns: int) -> AppendResult:
        batch, tables, session_id = self._batch, self._tables, self.session_id
        meta = load_meta(txn, tables, session_id)
        if meta is not None and not meta.imported and not batch.moving_in:
            raise errors.SessionAlreadyExists(
                f"session '{session_id}' already exists and was not made by an import; "
                "import under another id (--session-id)",
                session_id=session_id,
            )
        next_seq = 0 if meta is None else meta.next_seq
        if batch.first_seq != next_seq:
            raise errors.ImportSeqMismatch(
                f"session '{session_id}' continues at seq {next_seq}, but this chunk starts at "
                f"seq {batch.first_seq}; send the chunk that starts at {next_seq}",
                session_id=session_id,
                first_seq=batch.first_seq,
                next_seq=next_seq,
            )
        if not batch.moving_in:
            _check_lease(load_lease(txn, tables, session_id), session_id, "", 0, now_ns)
        events = batch.events
        kept, _ = fold.admit(
            events.events, events.prechecked, next_seq, lenient=False, ranges=events.replaces
        )
        before_ns = None if meta is None else meta.last_append_time_ns
        if meta is None:
            created = batch.create_time_ns
            if created is None:
                created = now_ns if batch.last_event_time_ns is None else _first_time(batch)
        else:
            created = meta.create_time_ns
        if batch.last_append_time_ns is not None and batch.last_append_time_ns < created:
            raise errors.InvalidImport(
                f"session '{session_id}': the chunk's last_append_time is before the session's "
                "create time; a session is appended to after it is created",
                field="last_append_time",
            )
        if meta is None:
            self.kind = "create"
            meta = _new_session(txn, tables, session_id, created)
            meta.imported = True
            meta.parent_id, meta.parent_length = batch.parent_id, batch.parent_length
        stored = [wire.with_seq(seq, events.bodies[i]) for seq, i in enumerate(kept, next_seq)]
        txn.put_events(meta.sid, next_seq, stored)
        imported = [events.events[i] for i in kept]
        ledger.record_imported(txn, tables, meta.sid, next_seq, imported, meta.parent_length)
        meta.next_seq += len(stored)
        meta.replace_generation += sum(1 for i in kept if events.replaces[i])
        if batch.last_append_time_ns is not None:
            meta.last_append_time_ns = batch.last_append_time_ns
        elif batch.last_event_time_ns is not None:
            meta.last_append_time_ns = batch.last_event_time_ns
        txn.put(session_id.encode(), meta.encode(), db=tables.sessions)
        old_record = None if before_ns is None else indexes.load_record(txn, tables, session_id)
        new_record = old_record
        if batch.record is not None and (old_record is not None or not batch.record.empty()):
            indexes.put_record(txn, tables, session_id, old_record, batch.record)
            new_record = batch.record
        if before_ns is None and meta.parent_id:
            indexes.link_child(txn, tables, meta.parent_id, session_id)
        _move_recent(txn, tables, session_id, before_ns, old_record, meta, new_record)
        for request_id, record in batch.requests:
            key = schema.request_key(meta.sid, request_id)
            txn.put(key, record.encode(), db=tables.requests)
        self._put_lease(txn, now_ns)
        self._touched.append(session_id)
        lease = load_lease(txn, tables, session_id)
        live = lease if lease is not None and lease.live(now_ns) else None
        return AppendResult(stored, meta.next_seq, [], meta, new_record, live)

    def _put_lease(self, txn: RecordingTxn, now_ns: int) -> None:
        """The move's lease record and the audit entries this store lacks."""
        batch, tables, session_id = self._batch, self._tables, self.session_id
        if batch.lease is None and not batch.audit:
            return
        held = load_lease(txn, tables, session_id)
        have = 0 if held is None else held.audit_count
        for n in range(have, len(batch.audit)):
            key = schema.audit_key(session_id, n)
            txn.put(key, batch.audit[n].encode(), db=tables.audit)
        lease = batch.lease or held
        if lease is None:  # audit without any lease record: keep its count in an empty one
            lease = LeaseRecord("", 0, now_ns, now_ns, [])
        lease.audit_count = max(have, len(batch.audit))
        txn.put(session_id.encode(), lease.encode(), db=tables.leases)


def _move_recent(
    txn: RecordingTxn,
    tables: Tables,
    session_id: str,
    before_ns: int | None,
    old: SessionRecord | None,
    meta: SessionMeta,
    new: SessionRecord | None,
) -> None:
    """Keep the session's one ``recent`` key at its update time (the later of its last append
    and its record's update time) after a chunk that may have changed both."""
    now = indexes.update_time(meta, new)
    if before_ns is not None:
        was = max(before_ns, 0 if old is None else old.update_time_ns)
        if was == now:
            return
        txn.remove(schema.recent_key(was, session_id), db=tables.recent)
    txn.put(schema.recent_key(now, session_id), b"", db=tables.recent)


def _first_time(batch: ImportBatch) -> int:
    """The first event's time (its own, or the stamp ``prepare_append`` gave it)."""
    event = batch.events.events[0]
    if event.HasField("time"):
        stamp: int = event.time.ToNanoseconds()
        return stamp
    return batch.last_event_time_ns or 0


def read_records(
    txn: Txn, tables: Tables, session_id: str, now_ns: int, ttl_ns: int
) -> SessionRecords:
    """A session's meta, record, unexpired request records (the newest MAX_REQUEST_RECORDS,
    oldest first), lease record and audit, read in the caller's transaction."""
    meta = load_meta(txn, tables, session_id)
    found = SessionRecords(meta, lease=load_lease(txn, tables, session_id))
    found.record = indexes.load_record(txn, tables, session_id)
    what = f"the records of session '{session_id}'"
    with damage.reading(what, session_id=session_id):
        if meta is not None:
            prefix = schema.u64(meta.sid)
            cursor = txn.cursor(db=tables.requests)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not bytes(key).startswith(prefix):
                        break
                    record = RequestRecord.decode(value)
                    if now_ns - record.time_ns <= ttl_ns:
                        found.requests.append((bytes(key)[len(prefix) :].decode(), record))
            found.requests.sort(key=lambda pair: pair[1].time_ns)
            del found.requests[:-MAX_REQUEST_RECORDS]
        audit_prefix = schema.audit_prefix(session_id)
        cursor = txn.cursor(db=tables.audit)
        if cursor.set_range(audit_prefix):
            for key, value in cursor:
                if not bytes(key).startswith(audit_prefix):
                    break
                found.audit.append(AuditRecord.decode(value))
    return found
