"""Request preparation: what a write needs checked and built before it reaches the writer.

Everything here needs no stored state and runs in the caller's thread: the checks of ids, lease
holders and TTLs, the stamping and serializing of events (``prepare_append``, ``prepare_seed``),
the fingerprint a request_id's retries must repeat, and the commands the store hands to the
single writer thread (``append_command``, ``fork_command``, ...). What needs the stored state
(expected seqs, leases, replays) the commands decide inside the writer's transaction.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

from sessionlog import errors, fold, wire
from sessionlog.records import SessionRecord
from sessionlog.storage import commands, records
from sessionlog.storage.commands import AppendBatch
from sessionlog.storage.tables import Tables
from sessionlog.v1.event_pb2 import Event
from sessionlog.v1.message_pb2 import Message

MAX_REQUEST_ID_BYTES = 256
MIN_LEASE_TTL_NS = 1_000_000
MAX_LEASE_TTL_NS = 24 * 3600 * 1_000_000_000
MAX_HOLDER_BYTES = 256
BULK_CHECK_FROM = 3
"""Batches of this many events or more are checked in bulk (``fold.doubtful_events``) before
one by one; one or two events are checked faster alone."""


def check_request_id(request_id: str) -> None:
    """Refuse a request_id longer than the store keeps (INVALID_REQUEST_ID)."""
    if len(request_id.encode()) > MAX_REQUEST_ID_BYTES:
        raise errors.InvalidRequestId(
            f"a request_id may be at most {MAX_REQUEST_ID_BYTES} bytes; this one has "
            f"{len(request_id.encode())}",
            limit=MAX_REQUEST_ID_BYTES,
        )


def prepare_append(
    session_id: str,
    events: Sequence[Event],
    *,
    limits: fold.Limits = fold.DEFAULT_LIMITS,
    expected_seq: int | None = None,
    request_id: str = "",
    lease_holder: str = "",
    lease_token: int = 0,
    lenient: bool = False,
    create_only: bool = False,
    now_ns: int | None = None,
    indices: Sequence[int] | None = None,
    keep_redacted: bool = False,
    serialized: Sequence[bytes] | None = None,
) -> AppendBatch:
    """Validate what needs no state, stamp missing times with now, serialize the events.

    Raises InvalidSessionId. Per-event failures are kept for the writer, which decides them in
    SPEC order once it knows the seq each event would get. ``indices`` are the numbers errors
    give the events (by default their positions; a seed uses the positions of its messages).
    The batch's ``bodies`` carry the stamped times; its ``events`` are the caller's events (left
    unchanged, so possibly without a time), which the writer reads only for their surface ops.
    An event's ``redacted`` mark is dropped (only RedactEvents sets it) unless ``keep_redacted``:
    a slot move's copy of stored events keeps them as they are. ``serialized``, when the caller
    has them in bulk (``mirrors.event_bodies``), are the events' bytes as each one's
    ``SerializeToString`` gives them; without them each event is serialized here.
    """
    fold.check_session_id(session_id)
    check_request_id(request_id)
    if len(lease_holder.encode()) > MAX_HOLDER_BYTES:
        raise errors.InvalidLease(
            f"a lease holder may be at most {MAX_HOLDER_BYTES} bytes", limit=MAX_HOLDER_BYTES
        )
    fingerprint = (
        _fingerprint(events, lenient, b"create" if create_only else b"") if request_id else ""
    )
    stamp = time.time_ns() if now_ns is None else now_ns
    # The server's time as a serialized `time` field, built once and put in place in the bytes
    # of each event that has none: no copy of the event, no Timestamp per event.
    time_field = wire.event_time_field(stamp)
    count = len(events)
    bodies: list[bytes] = []
    doubtful: Sequence[int] = range(count)
    if time_field and count >= BULK_CHECK_FROM:
        serialized = _serialized(events) if serialized is None else serialized
        if serialized is not None:
            doubtful = fold.doubtful_events(serialized, limits, len(time_field))
            # the events doubtful_events vouches for are plain and accepted: stamped in place
            bodies = [wire.put_time(body, time_field) for body in serialized]
    prechecked: list[fold.Violation | None] = [None] * count
    replaces: list[tuple[int, int] | None] = [None] * count
    spending: list[int] = []  # a plain event carries no usage
    if not bodies:
        bodies = [b""] * count
    if doubtful:
        events = _check_each(
            events, doubtful, serialized, prechecked, bodies, replaces, spending,
            limits, stamp, time_field, indices, keep_redacted,
        )  # fmt: skip
    return AppendBatch(
        session_id=session_id,
        events=events,
        prechecked=prechecked,
        bodies=bodies,
        replaces=replaces,
        spending=spending,
        expected_seq=expected_seq,
        request_id=request_id,
        fingerprint=fingerprint,
        lease_holder=lease_holder,
        lease_token=lease_token,
        lenient=lenient,
        create_only=create_only,
    )


def _check_each(
    events: Sequence[Event],
    doubtful: Sequence[int],
    serialized: Sequence[bytes] | None,
    prechecked: list[fold.Violation | None],
    bodies: list[bytes],
    replaces: list[tuple[int, int] | None],
    spending: list[int],
    limits: fold.Limits,
    stamp: int,
    time_field: bytes,
    indices: Sequence[int] | None,
    keep_redacted: bool,
) -> list[Event]:
    """Check the ``doubtful`` events one by one: their verdicts, bodies, replace ranges and
    usage go into the lists given. Returns the events as checked (some may be copies).
    ``serialized``: the events' bytes, when known."""
    stamped: list[Event] = list(events)
    plain_types, extra = fold.PLAIN_TYPES, len(time_field)
    for index in doubtful:
        original = events[index]
        number = index if indices is None else indices[index]
        if time_field:
            # A plain event (a type, maybe data, nothing else: seen in its bytes) is checked
            # by its data alone and stamped in place; any other takes the whole check below.
            if serialized is not None:
                body = serialized[index]
            else:
                try:
                    body = original.SerializeToString()
                except Exception:  # what the runtime refuses to encode is judged the reference way
                    body = b""
            event_type = wire.plain_event_type(body)
            if event_type in plain_types:
                violation = fold.check_plain_event(
                    event_type, original.data, number, limits, len(body) + extra
                )
                prechecked[index] = violation
                bodies[index] = b"" if violation else wire.with_time(body, event_type, time_field)
                continue
        event, violation, body = _checked(
            original, number, limits, stamp, time_field, keep_redacted
        )
        stamped[index] = event
        prechecked[index] = violation
        bodies[index] = b"" if violation else body
        replaces[index] = fold.replace_range(event)
        if event.HasField("usage"):
            spending.append(index)
    return stamped


def _serialized(events: Sequence[Event]) -> list[bytes] | None:
    """Each event's bytes; None when the runtime refuses to encode one (the events are then
    checked one by one, the reference way)."""
    try:
        return [event.SerializeToString() for event in events]
    except Exception:
        return None


def _checked(
    original: Event,
    number: int,
    limits: fold.Limits,
    stamp: int,
    time_field: bytes,
    keep_redacted: bool,
) -> tuple[Event, fold.Violation | None, bytes]:
    """Any event, checked by every rule: the event as checked (a copy when its redaction mark
    was dropped or its time set), its violation, and its bytes as stored when it has none."""
    event = original
    if not keep_redacted and original.HasField("redacted"):
        event = Event()
        event.CopyFrom(original)
        event.ClearField("redacted")
    stamp_it = not event.HasField("time")
    body: bytes | None = None
    violation: fold.Violation | None = None
    if time_field or not stamp_it:
        try:
            body = event.SerializeToString()
        except Exception:  # whatever the runtime refuses to encode is judged the reference way
            body = None
    if body is not None:
        # Checked at the size it is stored with (the time field added when the server adds
        # it), and stamped only once accepted: a refused event costs no copy of its bytes.
        size = len(body) + (len(time_field) if stamp_it else 0)
        violation = fold.check_event(event, number, limits, size=size)
        if not violation and stamp_it:
            body = wire.with_time(body, event.type, time_field) or None
    if body is None:  # the reference path: a copy of the event with its time set
        event = Event()
        event.CopyFrom(original)  # never change the caller's event: a retry must match
        if not event.HasField("time"):
            event.time.FromNanoseconds(stamp)
        violation = fold.check_event(event, number, limits)
        body = b"" if violation else event.SerializeToString()
    return event, violation, body


def prepare_seed(
    session_id: str,
    messages: Sequence[Message],
    *,
    limits: fold.Limits = fold.DEFAULT_LIMITS,
    lease_holder: str = "",
    lease_token: int = 0,
    request_id: str = "",
    now_ns: int | None = None,
) -> tuple[AppendBatch, list[int]]:
    """A create-only batch with one surface event per message (SPEC §5 Seed).

    Returns the batch and the indices of messages dropped for an unknown role. The events are
    then checked like any append, so a seed either writes every kept message or nothing.
    """
    events: list[Event] = []
    kept: list[int] = []
    dropped: list[int] = []
    for index, message in enumerate(messages):
        event = fold.event_from_message(message)
        if event is None:
            dropped.append(index)
        else:
            events.append(event)
            kept.append(index)
    batch = prepare_append(
        session_id,
        events,
        limits=limits,
        create_only=True,
        lease_holder=lease_holder,
        lease_token=lease_token,
        request_id=request_id,
        now_ns=now_ns,
        indices=kept,
    )
    if request_id:
        # The dropped messages count too: a retry must send the same messages, not just the
        # same kept ones.
        marker = b"seed:" + ",".join(map(str, kept)).encode() + b"/" + str(len(messages)).encode()
        batch.fingerprint = _fingerprint(events, False, marker)
    return batch, dropped


def _fingerprint(events: Sequence[Event], lenient: bool, kind: bytes = b"") -> str:
    """What a request_id's retries must repeat. ``kind`` sets creates and seeds apart from
    appends (empty, as before, so stored append records keep matching)."""
    parts = [b"lenient" if lenient else b"strict"]
    if kind:
        parts.append(kind)
    for event in events:
        body = event.SerializeToString(deterministic=True)
        parts.append(len(body).to_bytes(8, "big"))
        parts.append(body)
    return hashlib.sha256(b"".join(parts)).hexdigest()


def check_holder(holder: str) -> None:
    """Refuse a lease holder that is empty or longer than the store keeps (INVALID_LEASE)."""
    size = len(holder.encode())
    if not 1 <= size <= MAX_HOLDER_BYTES:
        raise errors.InvalidLease(
            f"a lease holder must be 1 to {MAX_HOLDER_BYTES} bytes; this one has {size}",
            length=size,
        )


def append_command(
    tables: Tables, batch: AppendBatch, request_id_ttl_seconds: int
) -> commands.AppendCommand:
    """The writer's command for a prepared append (or create)."""
    return commands.AppendCommand(tables, batch, request_id_ttl_seconds * 1_000_000_000)


def fork_command(
    tables: Tables,
    request_id_ttl_seconds: int,
    parent_id: str,
    at_seq: int | None,
    child_id: str,
    lease_holder: str,
    lease_token: int,
    request_id: str,
    generated_id: bool,
) -> commands.ForkCommand:
    """The writer's command for a fork, its ids and request_id checked."""
    fold.check_session_id(parent_id)
    if child_id:
        fold.check_session_id(child_id)
    check_request_id(request_id)
    return commands.ForkCommand(
        tables,
        parent_id,
        at_seq,
        child_id,
        lease_holder,
        lease_token,
        request_id=request_id,
        request_id_ttl_ns=request_id_ttl_seconds * 1_000_000_000,
        generated_id=generated_id,
    )


def lease_command(
    tables: Tables, action: str, session_id: str, holder: str, ttl_ns: int, force: bool
) -> commands.LeaseCommand:
    """The writer's command for a lease change, its id, holder and TTL checked."""
    fold.check_session_id(session_id)
    check_holder(holder)
    if action != "release" and not MIN_LEASE_TTL_NS <= ttl_ns <= MAX_LEASE_TTL_NS:
        raise errors.InvalidLease(
            f"a lease TTL must be between 1 ms and 24 h; got {ttl_ns / 1e9:g} s",
            ttl_seconds=ttl_ns / 1e9,
        )
    return commands.LeaseCommand(tables, action, session_id, holder, ttl_ns, force)


def update_command(
    tables: Tables, session_id: str, given: SessionRecord, paths: Sequence[str] | None
) -> records.UpdateSessionCommand:
    """The writer's command for an UpdateSession."""
    fold.check_session_id(session_id)
    return records.UpdateSessionCommand(tables, session_id, given, paths)
