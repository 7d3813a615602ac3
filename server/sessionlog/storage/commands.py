"""The writes the writer thread applies: append (and create), fork, and lease changes.

Only commands live here (with their inputs and results); what they read goes through
``reads``, the table handles are ``tables.Tables``. Each command is applied to the
``changes.RecordingTxn`` the writer hands it, which records its puts for the change feed.

Each command runs every check before its first put, so a refused command leaves the
transaction exactly as it found it (see ``writer``). Checks follow SPEC §3's order: session id
(already checked by ``prepare_append``), replayed request_id, writer lease, expected_uid (the
session's incarnation, ``schema.session_uid``), expected_seq, then the events one by one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sessionlog import errors, fold, wire
from sessionlog.records import SessionRecord
from sessionlog.storage import damage, indexes, ledger, schema
from sessionlog.storage.reads import load_lease, load_meta, read_range
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import (
    Answer,
    AuditRecord,
    LeaseRecord,
    RequestRecord,
    SessionMeta,
)
from sessionlog.storage.tables import Tables
from sessionlog.v1.event_pb2 import Event, EventType

log = logging.getLogger(__name__)

MAX_FORMER_HOLDERS = 16


def _new_session(txn: RecordingTxn, tables: Tables, session_id: str, now_ns: int) -> SessionMeta:
    raw = txn.get(schema.NEXT_SID, db=tables.counters)
    sid = 0 if raw is None else schema.read_u64(raw)
    txn.put(schema.NEXT_SID, schema.u64(sid + 1), db=tables.counters)
    txn.put(schema.u64(sid), session_id.encode(), db=tables.ids)
    return SessionMeta(sid=sid, create_time_ns=now_ns, last_append_time_ns=now_ns)


@dataclass(kw_only=True)
class Written:
    """What every write command's result carries beside its own fields: where it left the feed."""

    position: int = 0
    """The change-feed position of the record this write made; for a command that wrote nothing
    (a replayed request id, an empty append) the feed's newest position when it ran, which
    covers whatever it reports (the write it replays included). Set by the writer after the
    command applied; what ``--ack replica`` waits for replicas to hold (``cluster.sync``)."""


# -- append and create ---------------------------------------------------------------------------


@dataclass
class AppendBatch:
    """An append, checked as far as it can be without the session's state."""

    session_id: str
    events: Sequence[Event]
    prechecked: Sequence[fold.Violation | None]
    bodies: Sequence[bytes]
    """Each event serialized as it will be stored, minus its seq."""
    replaces: Sequence[tuple[int, int] | None]
    """Each event's replace range (``fold.replace_range``), read once."""
    spending: Sequence[int] = ()
    """The indices of the events that carry usage, in order."""
    expected_seq: int | None = None
    request_id: str = ""
    fingerprint: str = ""
    lease_holder: str = ""
    lease_token: int = 0
    lenient: bool = False
    create_only: bool = False
    """CreateSession / SeedSession: refuse an existing session, create even with no events."""
    record: SessionRecord | None = None
    """CreateSession: the new session's person-set fields (checked), parent_seq included."""
    parent_id: str = ""
    """CreateSession: the parent of a sub-agent child (checked to exist here)."""
    title: str | None = None
    """Append: the session's new title, set in the same commit when events are written
    (checked against the title rule by the service, ``records.check``)."""
    expected_uid: str = ""
    """Append: the Session.uid the session must have (empty: no check)."""
    moving_in: bool = False
    """Events copied in by a slot move (``shard.move``): the writer's ``admits`` hook, which
    refuses writes to sessions this group does not own, lets it through."""


@dataclass
class AppendResult(Written):
    """What an append wrote: the stored events, the session's meta after it, lenient drops.
    A create, seed or import also reports the session's record and live lease after it (a
    replayed create or seed: all three as its first reply described them)."""

    events: list[bytes]
    next_seq: int
    drops: list[tuple[int, str, str]] = field(default_factory=list)
    meta: SessionMeta | None = None
    record: SessionRecord | None = None
    lease: LeaseRecord | None = None


class AppendCommand:
    """An append as the writer applies it."""

    def __init__(self, tables: Tables, batch: AppendBatch, request_id_ttl_ns: int) -> None:
        self._tables = tables
        self._batch = batch
        self.kind = "create" if batch.create_only else "append"
        self.session_id = batch.session_id
        self.moving_in = batch.moving_in
        self._ttl_ns = request_id_ttl_ns
        self._touched: list[str] = []

    def size(self) -> int:
        return sum(map(len, self._batch.bodies))

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: RecordingTxn, now_ns: int) -> AppendResult:
        batch, tables = self._batch, self._tables
        meta = load_meta(txn, tables, batch.session_id)
        if batch.request_id and meta is not None:
            # Before SESSION_ALREADY_EXISTS: a retried create finds the session it made.
            replay = self._replay(txn, meta, now_ns)
            if replay is not None:
                return replay
        if batch.create_only and meta is not None:
            raise errors.SessionAlreadyExists(
                f"session '{batch.session_id}' already exists; append to it, or pick a new id",
                session_id=batch.session_id,
            )
        lease = load_lease(txn, tables, batch.session_id)
        _check_lease(lease, batch.session_id, batch.lease_holder, batch.lease_token, now_ns)
        if batch.expected_uid:
            _check_uid(batch.session_id, batch.expected_uid, meta)
        next_seq = 0 if meta is None else meta.next_seq
        if batch.expected_seq is not None and batch.expected_seq != next_seq:
            raise errors.SeqConflict(
                f"session '{batch.session_id}' expected seq {batch.expected_seq} but the log is at "
                f"{next_seq}; re-read and retry with expected_seq {next_seq}",
                expected_seq=batch.expected_seq,
                next_seq=next_seq,
            )
        kept, dropped = fold.admit(
            batch.events, batch.prechecked, next_seq, lenient=batch.lenient, ranges=batch.replaces
        )
        drops = [(i, e.reason, e.message) for i, e in dropped] if dropped else []
        if not kept and not batch.create_only:
            return AppendResult([], next_seq, drops, meta)
        if batch.parent_id:
            parent_seq = None if batch.record is None else batch.record.parent_seq
            indexes.check_parent(txn, tables, batch.parent_id, parent_seq)
        before_ns = None if meta is None else meta.last_append_time_ns
        if meta is None:
            meta = _new_session(txn, tables, batch.session_id, now_ns)
            meta.parent_id = batch.parent_id
        bodies, spending = batch.bodies, batch.spending
        if len(kept) != len(bodies):  # kept holds indices in order: all of them, or fewer
            bodies, chosen = [bodies[index] for index in kept], set(kept)
            spending = [index for index in spending if index in chosen]
        stored = wire.with_seqs(meta.next_seq, bodies)
        txn.put_events(meta.sid, meta.next_seq, stored)  # one LMDB call for the batch
        events = batch.events
        spent = [events[index] for index in spending]
        if spent:
            ledger.record_appended(txn, tables, meta.sid, spent)
        meta.next_seq += len(stored)
        replaces = batch.replaces
        if any(replaces):
            meta.replace_generation += sum(1 for index in kept if replaces[index])
        meta.last_append_time_ns = now_ns
        txn.put(batch.session_id.encode(), meta.encode(), db=tables.sessions)
        indexes.touch(txn, tables, batch.session_id, before_ns, now_ns)
        if before_ns is None:
            if batch.parent_id:
                batch.record = indexes.inherit_owner(txn, tables, batch.parent_id, batch.record)
            if batch.record is not None and not batch.record.empty():
                indexes.put_record(txn, tables, batch.session_id, None, batch.record)
            if batch.parent_id:
                indexes.link_child(txn, tables, batch.parent_id, batch.session_id)
        if batch.title is not None:
            _set_title(txn, tables, batch.session_id, batch.title)
        answer = None
        if batch.create_only:
            live = lease if lease is not None and lease.live(now_ns) else None
            record = batch.record if batch.record is not None and not batch.record.empty() else None
            answer = Answer(replace(meta), record, live)
        if batch.request_id:
            request = RequestRecord(
                fingerprint=batch.fingerprint,
                first_seq=next_seq,
                count=len(stored),
                next_seq=meta.next_seq,
                drops=drops,
                time_ns=now_ns,
                answer=answer,
            )
            key = schema.request_key(meta.sid, batch.request_id)
            txn.put(key, request.encode(), db=tables.requests)
        self._touched.append(batch.session_id)
        if answer is None:
            return AppendResult(stored, meta.next_seq, drops, meta)
        return AppendResult(stored, meta.next_seq, drops, meta, answer.record, answer.lease)

    def _replay(self, txn: RecordingTxn, meta: SessionMeta, now_ns: int) -> AppendResult | None:
        batch = self._batch
        record = _fresh_request(
            txn, self._tables, meta, batch.session_id, batch.request_id, now_ns, self._ttl_ns
        )
        if record is None:
            return None
        if record.fingerprint != batch.fingerprint:
            raise _reused(batch.request_id, batch.session_id)
        stop = record.first_seq + record.count
        events = read_range(
            txn, self._tables, meta.sid, record.first_seq, stop, session_id=batch.session_id
        )
        if not batch.create_only:
            return AppendResult(events, record.next_seq, list(record.drops), meta)
        answer = record.answer or _answer_now(txn, self._tables, batch.session_id, meta, now_ns)
        drops = list(record.drops)
        return AppendResult(
            events, record.next_seq, drops, answer.meta, answer.record, answer.lease
        )


def _check_uid(session_id: str, expected: str, meta: SessionMeta | None) -> None:
    uid = schema.session_uid(session_id, meta)
    if uid != expected:
        raise errors.SessionUidMismatch(
            f"session '{session_id}' is not the one expected_uid names (it was deleted and "
            "created again, or does not exist); read it again and retry",
            expected_uid=expected[:80],
            uid=uid,
        )


def _set_title(txn: RecordingTxn, tables: Tables, session_id: str, title: str) -> None:
    """An append's title: the record's title only (its update_time stays UpdateSession's: the
    append itself moves the session's update_time)."""
    current = indexes.load_record(txn, tables, session_id)
    if (current.title if current is not None else "") == title:
        return
    new = SessionRecord() if current is None else current.copy()
    new.title = title
    indexes.put_record(txn, tables, session_id, current, new)


def _answer_now(
    txn: RecordingTxn, tables: Tables, session_id: str, meta: SessionMeta, now_ns: int
) -> Answer:
    """The session as it is now, for the retry of a create, seed or fork whose request record
    keeps no answer (a slot move or an import carried it)."""
    lease = load_lease(txn, tables, session_id)
    live = lease if lease is not None and lease.live(now_ns) else None
    return Answer(meta, indexes.load_record(txn, tables, session_id), live)


def _reused(request_id: str, session_id: str) -> errors.RequestIdReused:
    return errors.RequestIdReused(
        f"request_id '{request_id}' was already used on session '{session_id}' for a different "
        "request; use a new request_id",
        request_id=request_id,
    )


def _fresh_request(
    txn: RecordingTxn,
    tables: Tables,
    meta: SessionMeta,
    session_id: str,
    request_id: str,
    now_ns: int,
    ttl_ns: int,
) -> RequestRecord | None:
    """The record ``request_id`` left on the session, unless there is none or it has expired."""
    raw = txn.get(schema.request_key(meta.sid, request_id), db=tables.requests)
    if raw is None:
        return None
    with damage.reading(
        f"the request record '{request_id}' of session '{session_id}'", session_id=session_id
    ):
        record = RequestRecord.decode(raw)
    return None if now_ns - record.time_ns > ttl_ns else record


# -- fork ---------------------------------------------------------------------------------------


@dataclass
class ForkResult(Written):
    """The child a fork made: its meta, record and live lease right after the fork (a replayed
    fork: as the first fork's reply described them)."""

    session_id: str
    meta: SessionMeta
    record: SessionRecord | None = None
    lease: LeaseRecord | None = None


class ForkCommand:
    """Copy events 0..at_seq of a parent into a new session, bytes unchanged."""

    def __init__(
        self,
        tables: Tables,
        parent_id: str,
        at_seq: int | None,
        child_id: str,
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str = "",
        request_id_ttl_ns: int = 0,
        generated_id: bool = False,
    ) -> None:
        self._tables = tables
        self._lease_holder = lease_holder
        self._lease_token = lease_token
        self._parent_id = parent_id
        self._at_seq = at_seq
        self._request_id = request_id
        self._ttl_ns = request_id_ttl_ns
        asked = "" if generated_id else child_id
        self._fingerprint = _fork_fingerprint(at_seq, asked, lease_holder, lease_token)
        self._child_id = child_id or f"fork-{uuid.uuid4().hex}"
        self.kind = "fork"
        self.moving_in = False
        self.session_id = self._child_id
        self._touched: list[str] = []

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: RecordingTxn, now_ns: int) -> ForkResult:
        tables = self._tables
        parent = load_meta(txn, tables, self._parent_id)
        if self._request_id and parent is not None:
            replay = self._replay(txn, parent, now_ns)
            if replay is not None:
                return replay
        count = 0 if parent is None else parent.next_seq
        at_seq = count - 1 if self._at_seq is None else self._at_seq
        if count == 0:
            raise errors.BoundaryOutOfRange(
                f"cannot fork session '{self._parent_id}': it has no events", next_seq=0
            )
        if not 0 <= at_seq < count:
            raise errors.BoundaryOutOfRange(
                f"cannot fork session '{self._parent_id}' at seq {at_seq}: it has {count} events "
                f"(seqs 0 to {count - 1})",
                at_seq=at_seq,
                next_seq=count,
            )
        assert parent is not None
        if load_meta(txn, tables, self._child_id) is not None:
            raise errors.SessionAlreadyExists(
                f"session '{self._child_id}' already exists; fork into a new id",
                session_id=self._child_id,
            )
        lease = load_lease(txn, tables, self._child_id)
        _check_lease(lease, self._child_id, self._lease_holder, self._lease_token, now_ns)
        copied = read_range(txn, tables, parent.sid, 0, at_seq + 1, session_id=self._parent_id)
        events = damage.decode_events(copied, 0, self._parent_id)
        if len(events) != at_seq + 1:
            raise damage.missing_events(self._parent_id, len(events), at_seq + 1)
        _refuse_open_turn(events, self._parent_id, at_seq)
        child = _new_session(txn, tables, self._child_id, now_ns)
        txn.put_events(child.sid, 0, copied)
        ledger.record_fork(txn, tables, child.sid, events)
        child.next_seq = len(copied)
        child.replace_generation = sum(1 for e in events if fold.replace_range(e) is not None)
        child.parent_id = self._parent_id
        child.parent_length = len(copied)
        txn.put(self._child_id.encode(), child.encode(), db=tables.sessions)
        indexes.touch(txn, tables, self._child_id, None, now_ns)
        indexes.link_child(txn, tables, self._parent_id, self._child_id)
        owned = indexes.inherit_owner(txn, tables, self._parent_id, None)
        if owned is not None:
            indexes.put_record(txn, tables, self._child_id, None, owned)
        live = lease if lease is not None and lease.live(now_ns) else None
        answer = Answer(replace(child), owned, live)
        if self._request_id:
            record = RequestRecord(
                fingerprint=self._fingerprint,
                first_seq=0,
                count=0,
                next_seq=parent.next_seq,
                drops=[],
                time_ns=now_ns,
                child_id=self._child_id,
                answer=answer,
            )
            key = schema.request_key(parent.sid, self._request_id)
            txn.put(key, record.encode(), db=tables.requests)
        self._touched.append(self._child_id)
        return ForkResult(self._child_id, child, owned, live)

    def _replay(self, txn: RecordingTxn, parent: SessionMeta, now_ns: int) -> ForkResult | None:
        """The child a fork with this request_id already made, if it did."""
        record = _fresh_request(
            txn, self._tables, parent, self._parent_id, self._request_id, now_ns, self._ttl_ns
        )
        if record is None:
            return None
        if record.fingerprint != self._fingerprint or not record.child_id:
            raise _reused(self._request_id, self._parent_id)
        child = load_meta(txn, self._tables, record.child_id)
        if child is None:
            raise errors.DataCorrupted(
                f"the fork request '{self._request_id}' of session '{self._parent_id}' names "
                f"child '{record.child_id}', which is not stored: the data file is damaged; "
                f"{damage.VERIFY_HINT}",
                kind="missing session",
                session_id=record.child_id,
            )
        self._child_id = self.session_id = record.child_id
        answer = record.answer or _answer_now(txn, self._tables, record.child_id, child, now_ns)
        return ForkResult(record.child_id, answer.meta, answer.record, answer.lease)


def _fork_fingerprint(at_seq: int | None, child_id: str, holder: str, token: int) -> str:
    """A fork request, for its request record: what a retry must repeat (the parent is the key)."""
    asked = {"kind": "fork", "at_seq": at_seq, "child": child_id, "holder": holder, "token": token}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def _refuse_open_turn(events: list[Event], parent_id: str, at_seq: int) -> None:
    open_turns: list[int] = []
    for event in events:
        if event.type == EventType.EVENT_TYPE_TURN_START:
            open_turns.append(event.seq)
        elif event.type == EventType.EVENT_TYPE_TURN_END and open_turns:
            open_turns.pop()
    if open_turns:
        turn = open_turns[-1]
        raise errors.OpenTurn(
            f"forking session '{parent_id}' at seq {at_seq} would cut the turn started at seq "
            f"{turn} before its TURN_END; fork before seq {turn} or after the turn ends",
            turn_start_seq=turn,
            at_seq=at_seq,
        )


# -- leases -------------------------------------------------------------------------------------


def _check_lease(
    lease: LeaseRecord | None, session_id: str, holder: str, token: int, now_ns: int
) -> None:
    """Refuse an append that a lease forbids.

    No holder named: fine unless a live lease exists (LEASE_HELD). A holder named: it must be the
    lease's current holder (live, or expired but not yet taken over) and, when a token is given,
    hold that token; a holder that lost the lease gets LEASE_LOST, any other LEASE_HELD.
    """
    if not holder and not token:
        if lease is not None and lease.live(now_ns):
            raise _held(session_id, lease)
        return
    if lease is not None and lease.holder == holder and (not token or token == lease.token):
        return
    once_held = lease is not None and (
        holder == lease.holder or holder in lease.former_holders or 0 < token < lease.token
    )
    if lease is not None and lease.live(now_ns) and not once_held:
        raise _held(session_id, lease)
    raise errors.LeaseLost(
        f"'{holder}' no longer holds the writer lease of session '{session_id}'"
        + (f" (now held by '{lease.holder}')" if lease is not None and lease.holder else "")
        + "; stop writing, or acquire the lease again",
        holder=holder,
        current_holder="" if lease is None else lease.holder,
        current_token=0 if lease is None else lease.token,
    )


def _held(session_id: str, lease: LeaseRecord) -> errors.LeaseHeld:
    return errors.LeaseHeld(
        f"session '{session_id}' has a live writer lease held by '{lease.holder}'; send the "
        "write (an append, a redaction, a delete, a fork into it) with lease_holder set to it, "
        "or wait until the lease expires",
        holder=lease.holder,
        token=lease.token,
        expire_time_ns=lease.expire_time_ns,
    )


@dataclass
class LeaseChange(Written):
    """The lease after (or, for a release, before) a lease command."""

    lease: LeaseRecord | None


class LeaseCommand:
    """Acquire, renew or release a session's writer lease."""

    def __init__(
        self,
        tables: Tables,
        action: str,
        session_id: str,
        holder: str,
        ttl_ns: int = 0,
        force: bool = False,
    ) -> None:
        self._tables = tables
        self._action = action
        self._session_id = session_id
        self._holder = holder
        self._ttl_ns = ttl_ns
        self._force = force
        self.kind = "lease"
        self.moving_in = False
        self.session_id = session_id

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: RecordingTxn, now_ns: int) -> LeaseChange:
        lease = load_lease(txn, self._tables, self._session_id)
        if self._action == "acquire":
            return LeaseChange(self._acquire(txn, lease, now_ns))
        if self._action == "renew":
            return LeaseChange(self._renew(txn, lease, now_ns))
        return LeaseChange(self._release(txn, lease, now_ns))

    def _put(self, txn: RecordingTxn, lease: LeaseRecord) -> LeaseRecord:
        txn.put(self._session_id.encode(), lease.encode(), db=self._tables.leases)
        return lease

    def _acquire(self, txn: RecordingTxn, lease: LeaseRecord | None, now_ns: int) -> LeaseRecord:
        holder = self._holder
        if lease is not None and lease.live(now_ns):
            if lease.holder != holder:
                raise _held(self._session_id, lease)
            lease.expire_time_ns = now_ns + self._ttl_ns
            return self._put(txn, lease)
        former = [] if lease is None else list(lease.former_holders)
        if lease is not None and lease.holder and lease.holder != holder:
            self._audit(txn, schema.TAKEOVER, lease, now_ns)
            log.info(
                "lease taken over",
                extra={
                    "session_id": self._session_id,
                    "holder": holder,
                    "previous_holder": lease.holder,
                },
            )
            former.append(lease.holder)
        fresh = LeaseRecord(
            holder=holder,
            token=(0 if lease is None else lease.token) + 1,
            acquire_time_ns=now_ns,
            expire_time_ns=now_ns + self._ttl_ns,
            former_holders=[h for h in former if h != holder][-MAX_FORMER_HOLDERS:],
            audit_count=0 if lease is None else lease.audit_count,
        )
        return self._put(txn, fresh)

    def _renew(self, txn: RecordingTxn, lease: LeaseRecord | None, now_ns: int) -> LeaseRecord:
        if lease is None or lease.holder != self._holder:
            raise errors.LeaseLost(
                f"'{self._holder}' does not hold the writer lease of session "
                f"'{self._session_id}'; acquire it instead",
                holder=self._holder,
                current_holder="" if lease is None else lease.holder,
                current_token=0 if lease is None else lease.token,
            )
        lease.expire_time_ns = now_ns + self._ttl_ns
        return self._put(txn, lease)

    def _release(
        self, txn: RecordingTxn, lease: LeaseRecord | None, now_ns: int
    ) -> LeaseRecord | None:
        if lease is None or not lease.holder:
            return None
        released = LeaseRecord(**vars(lease))
        if lease.holder != self._holder:
            if not self._force:
                raise errors.LeaseHeld(
                    f"the writer lease of session '{self._session_id}' is held by "
                    f"'{lease.holder}', not '{self._holder}'; only its holder may release it "
                    "(an operator can set force)",
                    holder=lease.holder,
                    token=lease.token,
                )
            self._audit(txn, schema.FORCED_RELEASE, lease, now_ns)
            log.info(
                "lease released by force",
                extra={
                    "session_id": self._session_id,
                    "by": self._holder,
                    "previous_holder": lease.holder,
                },
            )
        lease.former_holders = [*lease.former_holders, lease.holder][-MAX_FORMER_HOLDERS:]
        lease.holder = ""
        lease.expire_time_ns = now_ns
        self._put(txn, lease)
        return released

    def _audit(self, txn: RecordingTxn, kind: str, lease: LeaseRecord, now_ns: int) -> None:
        """Record a takeover or forced release; ``lease`` is the lease being lost."""
        record = AuditRecord(
            kind=kind,
            actor=self._holder,
            previous_holder=lease.holder,
            previous_token=lease.token,
            time_ns=now_ns,
        )
        key = schema.audit_key(self._session_id, lease.audit_count)
        txn.put(key, record.encode(), db=self._tables.audit)
        lease.audit_count += 1
