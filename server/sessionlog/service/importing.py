"""ImportSession and GetSessionRecords between protobuf and the store (``storage.imports``).

What is checked here needs no stored state: the chunk's seqs (events[i].seq = first_seq + i),
the events as ``prepare_append`` checks them, the number of request records. Whether the caller
may send a move's extras (admin) is the servicer's question.
"""

from __future__ import annotations

import time

from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import errors, fold
from sessionlog.records import SessionRecord
from sessionlog.storage import imports, schema
from sessionlog.storage.records import given_record
from sessionlog.storage.schema import AuditRecord, LeaseRecord, RequestRecord
from sessionlog.storage.store import check_request_id, prepare_append
from sessionlog.v1 import session_log_service_pb2 as pb

AUDIT_KINDS = {
    pb.LEASE_AUDIT_KIND_TAKEOVER: schema.TAKEOVER,
    pb.LEASE_AUDIT_KIND_FORCED_RELEASE: schema.FORCED_RELEASE,
}


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
    # An import copies history as it was, an erased event's mark included (a slot move of a
    # redacted session, an export re-imported).
    events = prepare_append(
        request.session_id, request.events, limits=limits, now_ns=now_ns, keep_redacted=True
    )
    last_event = None
    if request.events:
        last = request.events[-1]
        last_event = last.time.ToNanoseconds() if last.HasField("time") else now_ns
    return imports.ImportBatch(
        events=events,
        first_seq=request.first_seq,
        create_time_ns=_ns(request, "create_time"),
        last_append_time_ns=_ns(request, "last_append_time"),
        last_event_time_ns=last_event,
        parent_id=request.parent_session_id,
        parent_length=request.parent_event_count,
        requests=[_request_record(r) for r in request.request_records],
        lease=_lease_record(request.lease) if request.HasField("lease") else None,
        audit=[_audit_record(entry) for entry in request.lease_audit],
        moving_in=moving_in,
        record=_record(request.record) if request.HasField("record") else None,
    )


def _ns(message: pb.ImportSessionRequest, name: str) -> int | None:
    if not message.HasField(name):
        return None
    stamp: int = getattr(message, name).ToNanoseconds()
    return stamp


def _request_record(message: pb.SessionRequestRecord) -> tuple[str, RequestRecord]:
    check_request_id(message.request_id)
    if not message.request_id:
        raise errors.MalformedRequest("an imported request record names its request_id")
    record = RequestRecord(
        fingerprint=message.fingerprint,
        first_seq=message.first_seq,
        count=message.event_count,
        next_seq=message.next_seq,
        drops=[(d.index, d.reason, d.message) for d in message.drops],
        time_ns=message.time.ToNanoseconds(),
        child_id=message.child_session_id,
    )
    return message.request_id, record


def _lease_record(message: pb.SessionLeaseRecord) -> LeaseRecord:
    lease = message.lease
    return LeaseRecord(
        holder=lease.holder,
        token=lease.token,
        acquire_time_ns=lease.acquire_time.ToNanoseconds(),
        expire_time_ns=lease.expire_time.ToNanoseconds(),
        former_holders=list(message.former_holders),
    )


def _audit_record(entry: pb.LeaseAuditEntry) -> AuditRecord:
    kind = AUDIT_KINDS.get(entry.kind)
    if kind is None:
        raise errors.MalformedRequest(
            "an imported lease audit entry needs a kind (TAKEOVER or FORCED_RELEASE)"
        )
    return AuditRecord(
        kind=kind,
        actor=entry.actor,
        previous_holder=entry.previous_holder,
        previous_token=entry.previous_token,
        time_ns=entry.time.ToNanoseconds(),
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
        record.update_time_ns = session.update_time.ToNanoseconds()
    # A moved or restored session keeps its expiry as it was, even one already past (the
    # target's sweeper then deletes it) and its pin.
    if session.HasField("expire_time"):
        record.expire_time_ns = max(0, session.expire_time.ToNanoseconds())
    record.pinned = session.pinned
    return record
