"""ImportSession and GetSessionRecords between protobuf and the store (``storage.imports``).

What is checked here needs no stored state: the chunk's seqs (events[i].seq = first_seq + i),
the events as ``prepare_append`` checks them, the number of request records, and that the
records agree with each other and with this server (INVALID_IMPORT): no time past
``FUTURE_SLACK_NS`` from now, a lease that expires after it was taken and within the longest
lease TTL from now, request records inside the session's events after the chunk (a chunk that
is not refused leaves the session at first_seq + len(events)), a last-append time not before
the create time, a parent_event_count within the events the creating chunk says the session
holds (its record's event_count, or the events it sends) and only with a parent. The writer
checks the last-append time against a stored create time. An
event's own time is not bounded: Append stores a client's time as given, so a move copies it.
Whether the caller may send a move's extras (admin) is the servicer's question.
"""

from __future__ import annotations

import time

from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import errors, fold, retention
from sessionlog.records import SessionRecord
from sessionlog.storage import imports, schema
from sessionlog.storage.records import given_record
from sessionlog.storage.schema import AuditRecord, LeaseRecord, RequestRecord
from sessionlog.storage.store import MAX_LEASE_TTL_NS, check_request_id, prepare_append
from sessionlog.v1 import session_log_service_pb2 as pb

AUDIT_KINDS = {
    pb.LEASE_AUDIT_KIND_TAKEOVER: schema.TAKEOVER,
    pb.LEASE_AUDIT_KIND_FORCED_RELEASE: schema.FORCED_RELEASE,
}

FUTURE_SLACK_NS = 3600 * 1_000_000_000
"""How far past this server's now an imported record's time may lie: clocks of two groups
differ by far less; a time past it is a mistake (or a unit error), not skew."""


def has_extras(request: pb.ImportSessionRequest) -> bool:
    """The chunk carries what only a slot move (an admin) may send."""
    return bool(request.request_records or request.HasField("lease") or request.lease_audit)


def prepare_import(
    request: pb.ImportSessionRequest, limits: fold.Limits, *, moving_in: bool
) -> imports.ImportBatch:
    """The chunk as the writer takes it; INVALID_ARGUMENT for what is wrong in itself."""
    fold.check_session_id(request.session_id)
    for index, event in enumerate(request.events):
        if event.seq != request.first_seq + index:
            raise errors.ImportSeqNotDense(
                f"imported event {index} carries seq {event.seq}, but a chunk starting at seq "
                f"{request.first_seq} gives it seq {request.first_seq + index}: the seqs of a "
                "chunk follow each other from first_seq",
                index=index,
                seq=event.seq,
                expected_seq=request.first_seq + index,
            )
        event.ClearField("seq")
    if len(request.request_records) > imports.MAX_REQUEST_RECORDS:
        raise errors.MalformedRequest(
            f"{len(request.request_records)} request records in one chunk; the limit is "
            f"{imports.MAX_REQUEST_RECORDS}: spread them over several chunks",
            limit=imports.MAX_REQUEST_RECORDS,
        )
    now_ns = time.time_ns()
    _check_times(request, now_ns)
    _check_parent(request)
    # An import copies history as it was, an erased event's mark included (a slot move of a
    # redacted session, an export re-imported).
    events = prepare_append(
        request.session_id, request.events, limits=limits, now_ns=now_ns, keep_redacted=True
    )
    next_seq = request.first_seq + len(request.events)  # after this chunk, if it is taken
    last_event = None
    if request.events:
        last = request.events[-1]
        last_event = _stamp(last.time, "events.time") if last.HasField("time") else now_ns
    return imports.ImportBatch(
        events=events,
        first_seq=request.first_seq,
        create_time_ns=_ns(request, "create_time"),
        last_append_time_ns=_ns(request, "last_append_time"),
        last_event_time_ns=last_event,
        parent_id=request.parent_session_id,
        parent_length=request.parent_event_count,
        requests=[_request_record(r, next_seq, now_ns) for r in request.request_records],
        lease=_lease_record(request.lease, now_ns) if request.HasField("lease") else None,
        audit=[_audit_record(entry, now_ns) for entry in request.lease_audit],
        moving_in=moving_in,
        record=_record(request.record) if request.HasField("record") else None,
    )


def _stamp(stamp: Timestamp, field: str) -> int:
    """A Timestamp as ns, refused when it is not one (nanos outside [0, 1e9), seconds outside
    years 1-9999): INVALID_IMPORT naming ``field``."""
    try:
        ns: int = stamp.ToNanoseconds()
    except ValueError as error:
        raise errors.InvalidImport(f"imported {field}: {error}", field=field) from None
    return ns


def _ns(message: pb.ImportSessionRequest, name: str) -> int | None:
    if not message.HasField(name):
        return None
    stamp = _stamp(getattr(message, name), name)
    return stamp


def _check_times(request: pb.ImportSessionRequest, now_ns: int) -> None:
    """The session's own times: none in the future, the last append not before the create."""
    created = _ns(request, "create_time")
    appended = _ns(request, "last_append_time")
    _not_future(created, now_ns, "create_time")
    _not_future(appended, now_ns, "last_append_time")
    if request.HasField("record") and request.record.HasField("update_time"):
        _not_future(
            _stamp(request.record.update_time, "record.update_time"), now_ns, "record.update_time"
        )
    if created is not None and appended is not None and appended < created:
        raise errors.InvalidImport(
            f"session '{request.session_id}': last_append_time {_text(appended)} is before "
            f"its create_time {_text(created)}; a session is appended to after it is created",
            field="last_append_time",
        )


def _check_parent(request: pb.ImportSessionRequest) -> None:
    """A fork copied parent_event_count events, so the session holds at least that many: the
    chunk that creates it (the one that reads the parent) must say so, by its record's
    event_count (a chunked import) or by the events it sends."""
    count = request.parent_event_count
    if count and not request.parent_session_id:
        raise errors.InvalidImport(
            f"session '{request.session_id}': parent_event_count {count} without a "
            "parent_session_id; a session copies events only from a parent",
            field="parent_event_count",
        )
    if request.first_seq != 0:
        return
    held = len(request.events)
    if request.HasField("record"):
        held = max(held, request.record.event_count)
    if count > held:
        raise errors.InvalidImport(
            f"session '{request.session_id}': parent_event_count {count} is more than the "
            f"{held} event(s) the import says it holds (the events sent, or its record's "
            "event_count); a fork holds every event it copied",
            field="parent_event_count",
            parent_event_count=count,
            event_count=held,
        )


def _not_future(ns: int | None, now_ns: int, name: str) -> None:
    if ns is not None and ns > now_ns + FUTURE_SLACK_NS:
        raise errors.InvalidImport(
            f"imported {name} {_text(ns)} is more than {FUTURE_SLACK_NS // 3_600_000_000_000} "
            f"h past this server's now ({_text(now_ns)}); send the time it was recorded",
            field=name,
        )


def _text(ns: int) -> str:
    return _timestamp(ns).ToJsonString()


def _request_record(
    message: pb.SessionRequestRecord, next_seq: int, now_ns: int
) -> tuple[str, RequestRecord]:
    check_request_id(message.request_id)
    if not message.request_id:
        raise errors.MalformedRequest("an imported request record names its request_id")
    what = f"imported request record '{message.request_id}'"
    if message.first_seq + message.event_count > message.next_seq:
        raise errors.InvalidImport(
            f"{what} wrote {message.event_count} event(s) from seq {message.first_seq}, which "
            f"ends past the next seq it names ({message.next_seq})",
            field="request_records.next_seq",
        )
    if message.next_seq > next_seq:
        raise errors.InvalidImport(
            f"{what} left the session at seq {message.next_seq}, but after this chunk it "
            f"holds {next_seq} event(s): send a request record with the chunk that holds "
            "its events, or later",
            field="request_records.next_seq",
        )
    _not_future(_stamp(message.time, "request_records.time"), now_ns, "request_records.time")
    record = RequestRecord(
        fingerprint=message.fingerprint,
        first_seq=message.first_seq,
        count=message.event_count,
        next_seq=message.next_seq,
        drops=[(d.index, d.reason, d.message) for d in message.drops],
        time_ns=_stamp(message.time, "request_records.time"),
        child_id=message.child_session_id,
    )
    return message.request_id, record


def _lease_record(message: pb.SessionLeaseRecord, now_ns: int) -> LeaseRecord:
    lease = message.lease
    acquired = _stamp(lease.acquire_time, "lease.acquire_time")
    expires = _stamp(lease.expire_time, "lease.expire_time")
    _not_future(acquired, now_ns, "lease.acquire_time")
    if expires < acquired:
        raise errors.InvalidImport(
            f"the imported lease expires at {_text(expires)}, before it was acquired at "
            f"{_text(acquired)}",
            field="lease.expire_time",
        )
    if expires > now_ns + MAX_LEASE_TTL_NS + FUTURE_SLACK_NS:
        raise errors.InvalidImport(
            f"the imported lease expires at {_text(expires)}, further from now than the "
            f"longest lease TTL ({MAX_LEASE_TTL_NS // 3_600_000_000_000} h) reaches",
            field="lease.expire_time",
        )
    return LeaseRecord(
        holder=lease.holder,
        token=lease.token,
        acquire_time_ns=acquired,
        expire_time_ns=expires,
        former_holders=list(message.former_holders),
    )


def _audit_record(entry: pb.LeaseAuditEntry, now_ns: int) -> AuditRecord:
    kind = AUDIT_KINDS.get(entry.kind)
    if kind is None:
        raise errors.MalformedRequest(
            "an imported lease audit entry needs a kind (TAKEOVER or FORCED_RELEASE)"
        )
    _not_future(_stamp(entry.time, "lease_audit.time"), now_ns, "lease_audit.time")
    return AuditRecord(
        kind=kind,
        actor=entry.actor,
        previous_holder=entry.previous_holder,
        previous_token=entry.previous_token,
        time_ns=_stamp(entry.time, "lease_audit.time"),
    )


def _timestamp(ns: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(ns)
    return stamp


def request_message(request_id: str, record: RequestRecord) -> pb.SessionRequestRecord:
    return pb.SessionRequestRecord(
        request_id=request_id,
        fingerprint=record.fingerprint,
        first_seq=record.first_seq,
        event_count=record.count,
        next_seq=record.next_seq,
        drops=[pb.AppendDrop(index=i, reason=r, message=m) for i, r, m in record.drops],
        time=_timestamp(record.time_ns),
        child_session_id=record.child_id,
    )


def lease_record_message(lease: LeaseRecord) -> pb.SessionLeaseRecord:
    return pb.SessionLeaseRecord(
        lease=pb.Lease(
            holder=lease.holder,
            token=lease.token,
            acquire_time=_timestamp(lease.acquire_time_ns),
            expire_time=_timestamp(lease.expire_time_ns),
        ),
        former_holders=lease.former_holders,
    )


def _record(session: pb.Session) -> SessionRecord:
    """The record fields an import keeps, checked as CreateSession checks them."""
    record = given_record(
        session.title,
        session.labels,
        session.owner,
        session.status,
        session.parent_seq if session.HasField("parent_seq") else None,
    )
    if session.HasField("update_time"):
        record.update_time_ns = _stamp(session.update_time, "record.update_time")
    # A moved or restored session keeps its expiry as it was, even one already past (the
    # target's sweeper then deletes it) and its pin.
    if session.HasField("expire_time"):
        expires = _stamp(session.expire_time, "record.expire_time")
        if expires > time.time_ns() + retention.MAX_AHEAD_NS + FUTURE_SLACK_NS:
            raise errors.InvalidImport(
                f"imported expire_time {_text(expires)} is more than 100 years ahead (the most "
                "CreateSession and UpdateSession give)",
                field="record.expire_time",
            )
        record.expire_time_ns = max(1, expires)  # at or before 1970: past, deleted by a sweep
    record.pinned = session.pinned
    return record
