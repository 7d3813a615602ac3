"""Proto <-> domain for the gRPC services: requests decoded from raw bytes, stored records and
results encoded as the messages the replies carry. No checks and no storage calls here."""

from __future__ import annotations

from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import errors, mirrors, wire
from sessionlog.records import SessionRecord
from sessionlog.storage.indexes import update_time
from sessionlog.storage.schema import AuditRecord, LeaseRecord, SessionMeta, session_uid
from sessionlog.storage.store import AppendResult
from sessionlog.v1 import session_log_service_pb2 as pb

M = TypeVar("M", bound=Message)


def decode(message_type: type[M], raw: bytes) -> M:
    """Parse a request, or raise MalformedRequest saying what it should have been."""
    try:
        message: M = message_type.FromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        name = message_type.DESCRIPTOR.full_name
        raise errors.MalformedRequest(
            f"the request could not be decoded as {name} ({exc}); check the message type, that "
            "strings are valid UTF-8, and that data is nested no deeper than the limit",
            message_type=name,
        ) from None
    return message


_SINCE_EVENTS = pb.SinceResponse.DESCRIPTOR.fields_by_name["events"].number
_LIST_EVENTS = pb.ListEventsResponse.DESCRIPTOR.fields_by_name["events"].number


def encode_events(events: list[bytes]) -> bytes:
    """A SinceResponse holding stored event bytes as they are. The one reply still encoded by
    hand (``wire``): for Since batches it measured faster than the generated mirror
    (``bench/encode.py``); every other reply uses ``mirrors``."""
    return wire.length_delimited(_SINCE_EVENTS, events)


def encode_append_response(result: AppendResult, session_id: str) -> bytes:
    uid = session_uid(session_id, result.meta)
    if not result.drops:  # the usual reply: a third cheaper without an empty drops argument
        return _serialize(
            mirrors.AppendResponse(events=result.events, next_seq=result.next_seq, session_uid=uid)
        )
    drops = [
        pb.AppendDrop(index=i, reason=reason, message=message)
        for i, reason, message in result.drops
    ]
    reply = mirrors.AppendResponse(
        events=result.events, next_seq=result.next_seq, drops=drops, session_uid=uid
    )
    return _serialize(reply)


def _serialize(message: Message | Any) -> bytes:
    serialized: bytes = message.SerializeToString()
    return serialized


def _timestamp(ns: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(ns)
    return stamp


def session_message(
    session_id: str,
    meta: SessionMeta | None,
    lease: LeaseRecord | None = None,
    record: SessionRecord | None = None,
) -> pb.Session:
    session = pb.Session(session_id=session_id, exists=meta is not None)
    if meta is not None:
        session.event_count = meta.next_seq
        session.replace_generation = meta.replace_generation
        session.create_time.CopyFrom(_timestamp(meta.create_time_ns))
        session.last_append_time.CopyFrom(_timestamp(meta.last_append_time_ns))
        session.parent_session_id = meta.parent_id
        session.parent_event_count = meta.parent_length
        session.uid = session_uid(session_id, meta)
        session.update_time.CopyFrom(_timestamp(update_time(meta, record)))
    if meta is not None and record is not None:
        session.title = record.title
        session.labels.update(record.labels)
        session.owner = record.owner
        session.status = record.status
        if record.parent_seq is not None:
            session.parent_seq = record.parent_seq
        if record.expire_time_ns:
            session.expire_time.CopyFrom(_timestamp(record.expire_time_ns))
        session.pinned = record.pinned
    if lease is not None:
        session.lease.CopyFrom(lease_message(lease))
    return session


def lease_message(lease: LeaseRecord | None) -> pb.Lease:
    if lease is None:
        return pb.Lease()
    return pb.Lease(
        holder=lease.holder,
        token=lease.token,
        acquire_time=_timestamp(lease.acquire_time_ns),
        expire_time=_timestamp(lease.expire_time_ns),
    )


def audit_message(record: AuditRecord) -> pb.LeaseAuditEntry:
    return pb.LeaseAuditEntry(
        kind=f"LEASE_AUDIT_KIND_{record.kind}",
        actor=record.actor,
        previous_holder=record.previous_holder,
        previous_token=record.previous_token,
        time=_timestamp(record.time_ns),
    )
