"""What the sync and the asyncio client share: connection settings, retry budget, requests."""

from __future__ import annotations

import datetime as dt
import random
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from sessionlog_client.convert import TimeLike, _timestamp, event_from_dict, messages_from_dicts
from sessionlog_client.errors import InvalidPageSize, MalformedRequest, Unavailable
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1.event_pb2 import Event, EventType
from sessionlog_client.v1.message_pb2 import Message

DEFAULT_TARGET = "127.0.0.1:50051"
SESSION_HEADER = "x-session-id"
"""The metadata that names a call's session, for a proxy routing sessions to their shard
group (the server's ``sessionlog.shard.slots.SESSION_HEADER``)."""
DEFAULT_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 3.0
"""Seconds one connection attempt may take before it fails (gRPC's own is 20 s): a client's
first call to an address that accepts TCP but never answers fails after this long."""
# The server's --max-message-size defaults to 4 MiB; accept far more so a raised server limit
# needs no change here. (gRPC's own default would refuse any reply over 4 MiB.)
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

DEFAULT_FOLLOW_HEARTBEAT = 5.0
"""Seconds between the heartbeats a follow stream asks for (the server may send them less
often only if its own --heartbeat is shorter)."""
DEAD_AFTER_HEARTBEATS = 3
"""A follow stream that delivers nothing, not even a heartbeat, for this many intervals is
dead (a black-holed link, a stopped server): it is cancelled and resumed from its next seq."""
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    # While a call is open, ping after 10 s without a frame (gRPC's advised floor; sessionlog
    # servers accept pings down to every second) and close the transport when 5 s pass with
    # no ack, so a call retried after a dead stream gets a fresh connection. A follow stream
    # sends no data after its request, and gRPC stops pinging after two pings without data
    # unless told otherwise.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),  # what grpcio 1.85 times the ping by
    ("grpc.http2.max_pings_without_data", 0),
)

EventLike = Event | Mapping[str, Any]


class Popped(NamedTuple):
    """What :meth:`Client.pop_last` took off the view: the message and the seq it came from."""

    seq: int
    message: Message


UINT64_END = 2**64


def whole(name: str, value: int) -> int:
    """``value`` when a uint64 field can carry it (a seq, a count); else the client refuses it
    with MalformedRequest naming ``name``, the same typed error the server gives a request it
    cannot read, before anything is sent (protobuf's own refusal is a bare ValueError)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < UINT64_END:
        raise MalformedRequest(
            f"{name} must be a whole number from 0 to 2**64 - 1 (got {value!r})", field=name
        )
    return value


def hide_event(start_seq: int, stop_seq: int, reason: str | None = None) -> Event:
    """An EVENT_TYPE_HIDE over the surface positions [start_seq, stop_seq] (``data.reason`` when
    given): it shadows every earlier event whose position is in the range and adds nothing."""
    made = Event(type=EventType.EVENT_TYPE_HIDE)
    made.surface_op.replace.start_seq = whole("start_seq", start_seq)
    made.surface_op.replace.stop_seq = whole("stop_seq", stop_seq)
    if reason is not None:
        made.data["reason"] = reason
    return made


def newest_position(shown: pb.SurfaceResponse) -> int | None:
    """Where the newest message of a surface stands (a summary at its range's start), or None
    for an empty surface. The surface is sorted by position, and no two entries share one."""
    if not shown.events:
        return None
    last = shown.events[-1]
    return last.surface_op.replace.start_seq if last.surface_op.HasField("replace") else last.seq


def popped(shown: pb.SurfaceResponse, derived: pb.DeriveMessagesResponse) -> Popped:
    """The newest message of ``derived``, which must be derived at ``shown``'s length."""
    seq = shown.events[-1].seq
    if not derived.seqs or derived.seqs[-1] != seq:
        raise RuntimeError(f"the surface ends at seq {seq} but the derived messages do not")
    return Popped(seq, derived.messages[-1])


MessageLike = Message | Mapping[str, Any]
CertSource = bytes | str | Path


@dataclass(frozen=True)
class Retry:
    """How long a client keeps trying when the server is UNAVAILABLE.

    Appends, creates, seeds and forks (always with a request_id, so a retry never writes twice
    and gets the first call's result), the read RPCs, lease acquire and renew (repeating them
    as the same holder changes nothing), and a ``since``/``follow`` stream reconnecting after a
    drop all retry for at most ``give_up_after`` seconds, sleeping ``initial_backoff`` doubling
    up to ``max_backoff`` (with jitter) between tries; then the last error is raised. Release
    is never retried, nor a create, seed or fork given ``request_id=""``: a retry could not
    tell its own first success from a refusal. A client given several addresses
    also moves these retried calls to another member after a deadline with no answer, and
    re-sends any write refused with NOT_PRIMARY to the primary it names (see ``_routing``).

    A slot move's refusals wrote nothing, so every call retries them, whether it retries
    UNAVAILABLE or not: ``SLOT_MOVING`` (the slot's writes pause for a move) within
    ``give_up_after``, and ``WRONG_GROUP`` (the slot moved on, and a proxy in front of the
    groups, HAProxy with ``haproxy-sync``, still sends its calls to the old group for a second
    or so) for ``wrong_group_for`` seconds; then the refusal is raised. A client given
    ``shard_map=`` routes by the map instead: it reroutes a ``WRONG_GROUP`` at once.

    ``REPLICAS_UNAVAILABLE`` (``--ack replica``: the write is committed locally on the primary
    but fewer than ``--sync-replicas`` replicas reported it within ``--sync-timeout``) is
    retried too, on the same member, at most ``replicas_retries`` times (each try waits up to
    the server's ``--sync-timeout``); then ``errors.ReplicasUnavailable`` is raised, and a retry
    with the same request id stays safe.
    """

    give_up_after: float = 30.0
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    replicas_retries: int = 2
    wrong_group_for: float = 5.0
    """How long a ``WRONG_GROUP`` refusal is retried (within ``give_up_after``; 0: never)."""

    def backoff(self) -> Backoff:
        return Backoff(self)


class Backoff:
    """The sleeps of one retry loop; ``next()`` is None once the budget is spent."""

    def __init__(self, retry: Retry) -> None:
        self._retry = retry
        self._started: float | None = None
        self._delay = retry.initial_backoff

    def reset(self) -> None:
        """Forget past failures (a stream that got a response is healthy again)."""
        self._started = None
        self._delay = self._retry.initial_backoff

    def next(self, budget: float | None = None) -> float | None:
        """The next sleep; None once ``give_up_after`` (or the smaller ``budget``) has passed
        since the first."""
        now = time.monotonic()
        if self._started is None:
            self._started = now
        limit = (
            self._retry.give_up_after if budget is None else min(budget, self._retry.give_up_after)
        )
        remaining = limit - (now - self._started)
        if remaining <= 0:
            return None
        delay = self._delay * random.uniform(0.5, 1.0)
        self._delay = min(self._delay * 2, self._retry.max_backoff)
        return min(delay, remaining)


@dataclass(frozen=True)
class Connection:
    """Everything needed to open a channel and decorate each call."""

    target: str = DEFAULT_TARGET
    timeout: float | None = DEFAULT_TIMEOUT
    token: str | None = None
    tls: bool = False
    root_certificates: CertSource | None = None
    private_key: CertSource | None = None
    certificate_chain: CertSource | None = None
    server_name: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    retry: Retry = field(default_factory=Retry)
    metadata: Sequence[tuple[str, str]] = ()
    options: Sequence[tuple[str, Any]] = ()
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    wait_for_ready: bool = False

    @property
    def secure(self) -> bool:
        return self.tls or any(
            v is not None
            for v in (self.root_certificates, self.private_key, self.certificate_chain)
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        opts: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            # Reconnect soon after a server restart instead of gRPC's default (up to 2 minutes).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # gRPC's name for the deadline of one connection attempt.
            ("grpc.min_reconnect_backoff_ms", round(self.connect_timeout * 1000)),
            *KEEPALIVE_OPTIONS,
        ]
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        # One value per option, the caller's winning (gRPC's own rule for repeats varies).
        return list({**dict(opts), **dict(self.options)}.items())

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.root_certificates),
            private_key=_read(self.private_key),
            certificate_chain=_read(self.certificate_chain),
        )

    def call_metadata(self, session_id: str = "") -> tuple[tuple[str, str], ...]:
        """The metadata of one call: the token, the caller's extra pairs and, for a call that
        names a session, ``x-session-id`` (see ``session_header``)."""
        extra = tuple(self.metadata)
        if session_id:
            extra = (*extra, (SESSION_HEADER, session_header(session_id)))
        if self.token:
            return (("authorization", f"Bearer {self.token}"), *extra)
        return extra

    def deadline(self, timeout: float | None) -> float | None:
        """A unary call's timeout: the one given, else the client's default."""
        return self.timeout if timeout is None else timeout


def session_header(session_id: str) -> str:
    """The ``x-session-id`` value of a session id: the id itself when it is plain ASCII (every
    id made of ``A-Za-z0-9_.-``), else its UTF-8 bytes percent-encoded, since gRPC metadata
    values are printable ASCII only (a proxy decodes them before hashing: HAProxy's
    ``url_dec``). Session ids never hold ``%``, so the plain form is never ambiguous."""
    return urllib.parse.quote(session_id, safe="")


def session_of(request: Any) -> str:
    """The session a request names, for the ``x-session-id`` header: a fork's source, every
    other session call's ``session_id``; "" for a request that names none (ListSessions)."""
    if isinstance(request, pb.ForkSessionRequest):
        return request.parent_session_id
    if isinstance(request, pb.UpdateSessionRequest):
        return request.session.session_id
    return str(getattr(request, "session_id", ""))


def _read(source: CertSource | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


# -- requests -------------------------------------------------------------------------------------


def new_request_id() -> str:
    return uuid.uuid4().hex


def append_request(
    session_id: str,
    events: Iterable[EventLike],
    *,
    expected_seq: int | None,
    request_id: str,
    lease_holder: str,
    lease_token: int,
    lenient: bool,
    title: str | None = None,
    expected_uid: str = "",
) -> pb.AppendRequest:
    request = pb.AppendRequest(
        session_id=session_id,
        events=[event_from_dict(e) for e in events],
        request_id=request_id,
        lease_holder=lease_holder,
        lease_token=lease_token,
        lenient=lenient,
        expected_uid=expected_uid,
    )
    if expected_seq is not None:
        request.expected_seq = whole("expected_seq", expected_seq)
    if title is not None:
        request.title = title
    return request


def since_request(
    session_id: str, seq: int, follow: bool, heartbeat: float | None = None
) -> pb.SinceRequest:
    return pb.SinceRequest(
        session_id=session_id,
        seq=whole("seq", seq),
        follow=follow,
        heartbeat_interval=duration(heartbeat) if follow else None,
    )


def follow_sessions_request(
    prefix: str, filter_text: str, after: int | None, heartbeat: float | None, checksum: bytes
) -> pb.FollowSessionsRequest:
    """A FollowSessions request resuming after ``after`` (None: from now; 0: from the start),
    on the history whose change there has ``checksum`` (empty: not checked)."""
    return pb.FollowSessionsRequest(
        prefix=prefix,
        filter=filter_text,
        after_position=after or 0,
        from_start=after == 0,
        heartbeat_interval=duration(heartbeat),
        after_checksum=checksum if after else b"",
    )


def checksum_at(response: pb.FollowSessionsResponse, position: int) -> bytes:
    """The checksum a FollowSessions response gives for the change at ``position``: its
    position_checksum when that is its position, else none known (a change inside a batch)."""
    return response.position_checksum if position == response.position else b""


def dead_stream(silence: float | None) -> Unavailable:
    """What a follow stream raises when it kept going silent until its retry budget ran out."""
    return Unavailable(
        f"the follow stream heard nothing, not even a heartbeat, for {silence:g} s each time it "
        "reconnected: the server or the link to it is down"
    )


def silence_limit(heartbeat: float | None) -> float | None:
    """How long a follow stream asking for ``heartbeat`` may stay silent before it is dead;
    None (no heartbeat asked for): no limit."""
    if heartbeat is None:
        return None
    if heartbeat <= 0:
        raise MalformedRequest(
            f"heartbeat must be a positive number of seconds or None, not {heartbeat}",
            field="heartbeat",
        )
    return DEAD_AFTER_HEARTBEATS * heartbeat


def surface_request(session_id: str, at_seq: int | None) -> pb.SurfaceRequest:
    request = pb.SurfaceRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = whole("at_seq", at_seq)
    return request


def state_request(session_id: str, at_seq: int | None) -> pb.GetStateRequest:
    request = pb.GetStateRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = whole("at_seq", at_seq)
    return request


def usage_request(
    session_id: str, at_seq: int | None, include_descendants: bool
) -> pb.GetUsageRequest:
    request = pb.GetUsageRequest(session_id=session_id, include_descendants=include_descendants)
    if at_seq is not None:
        request.at_seq = whole("at_seq", at_seq)
    return request


def delete_request(
    session_id: str, expected_seq: int | None, lease_holder: str, force: bool, reason: str
) -> pb.DeleteSessionRequest:
    request = pb.DeleteSessionRequest(
        session_id=session_id, lease_holder=lease_holder, force=force, reason=reason
    )
    if expected_seq is not None:
        request.expected_seq = whole("expected_seq", expected_seq)
    return request


def redact_request(
    session_id: str, seqs: Iterable[int], reason: str, lease_holder: str
) -> pb.RedactEventsRequest:
    return pb.RedactEventsRequest(
        session_id=session_id,
        seqs=[whole("seqs", seq) for seq in seqs],
        reason=reason,
        lease_holder=lease_holder,
    )


def derive_request(
    session_id: str,
    at_seq: int | None,
    known: pb.DeriveMessagesResponse | None = None,
    page_size: int = 0,
    page_token: str = "",
) -> pb.DeriveMessagesRequest:
    request = pb.DeriveMessagesRequest(
        session_id=session_id, page_size=checked_page_size(page_size), page_token=page_token
    )
    if at_seq is not None:
        request.at_seq = whole("at_seq", at_seq)
    if known is not None:
        request.known_event_count = known.event_count
        request.known_replace_generation = known.replace_generation
    return request


MAX_PAGE_SIZE = 1000
"""The most a server puts in one page of ListEvents or of a paged DeriveMessages."""

LISTING_PAGE_SIZE = 100
"""The page size a server gives ListSessions when none is asked for."""


def smaller_listing_page(page_size: int, with_state: bool) -> int | None:
    """The page size to ask for again after a page of ``page_size`` sessions came back too
    large for this client's message limit; None when a smaller page cannot help. Only a page
    with each session's state (SESSION_VIEW_FULL) grows with what the sessions hold. The
    server keeps every page within its own --max-message-size (fewer sessions than asked for
    when they are large), so this is needed only by a client whose ``max_message_bytes`` is
    below the server's: it halves the page, down to one session (which fits whenever that
    session's GetState would)."""
    size = page_size or LISTING_PAGE_SIZE
    return size // 2 if with_state and size > 1 else None


_PAGE_SIZE_END = 2**31
"""Past every page_size field's range (int32 or uint32); a server caps a page far below it."""


def checked_page_size(value: int) -> int:
    """``value`` for a request's page_size: a negative one is InvalidPageSize, as the server
    refuses it (an unsigned field would make it protobuf's bare ValueError), and one past the
    field's range asks for the most a server gives (the server caps it anyway)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedRequest(
            f"page_size must be a whole number (got {value!r})", field="page_size"
        )
    if value < 0:
        raise InvalidPageSize(
            f"page_size must not be negative (got {value}); 0 means the default", page_size=value
        )
    return min(value, _PAGE_SIZE_END - 1)


def list_events_request(
    session_id: str, page_size: int, page_token: str, order_by: str
) -> pb.ListEventsRequest:
    return pb.ListEventsRequest(
        session_id=session_id,
        page_size=checked_page_size(page_size),
        page_token=page_token,
        order_by=order_by,
    )


def last_page_size(wanted: int, held: int) -> int:
    """The page size that asks for what is still wanted (at most a server's maximum)."""
    whole("n", wanted)
    return min(wanted - held, MAX_PAGE_SIZE)


def prepend_page(
    held: pb.DeriveMessagesResponse | None, page: pb.DeriveMessagesResponse
) -> pb.DeriveMessagesResponse:
    """``page`` (an older page of the same pinned view) put before ``held``; the result keeps
    ``page``'s next_page_token, the newest page's counts."""
    if held is None:
        return page
    merged = pb.DeriveMessagesResponse()
    merged.CopyFrom(held)
    del merged.messages[:]
    del merged.seqs[:]
    merged.messages.extend([*page.messages, *held.messages])
    merged.seqs.extend([*page.seqs, *held.seqs])
    merged.next_page_token = page.next_page_token
    return merged


def create_request(
    session_id: str,
    events: Iterable[EventLike],
    lease_holder: str,
    lease_token: int,
    request_id: str = "",
    record: SessionFields | None = None,
) -> pb.CreateSessionRequest:
    request = pb.CreateSessionRequest(
        session_id=session_id,
        events=[event_from_dict(e) for e in events],
        lease_holder=lease_holder,
        lease_token=lease_token,
        request_id=request_id,
    )
    if record is not None:
        request.title = record.title
        request.labels.update(record.labels or {})
        request.owner = record.owner
        request.status = record.status
        request.parent_session_id = record.parent_session_id
        if record.parent_seq is not None:
            request.parent_seq = whole("parent_seq", record.parent_seq)
        if record.ttl is not None and record.expire_time is not None:
            raise MalformedRequest("create_session: give ttl or expire_time, not both", field="ttl")
        ttl = duration(record.ttl)
        if ttl is not None:
            request.ttl.CopyFrom(ttl)
        if record.expire_time is not None:
            request.expire_time.CopyFrom(_timestamp(record.expire_time))
        request.pinned = record.pinned
    return request


@dataclass(frozen=True)
class SessionFields:
    """What CreateSession may set besides the events: the person-set fields and a sub-agent
    child's parent link."""

    title: str = ""
    labels: Mapping[str, str] | None = None
    owner: str = ""
    status: str = ""
    parent_session_id: str = ""
    parent_seq: int | None = None
    ttl: float | dt.timedelta | None = None
    """Expire this long after the create (seconds or a timedelta); None: no ttl."""
    expire_time: TimeLike | None = None
    """Expire at this time; None: no expire_time (give ttl or expire_time, not both)."""
    pinned: bool = False


UNSET: Any = object()
"""An UpdateSession argument left out: not in the mask."""


def update_request(
    session_id: str,
    title: Any = UNSET,
    labels: Any = UNSET,
    owner: Any = UNSET,
    status: Any = UNSET,
    set_labels: Mapping[str, str] | None = None,
    remove_labels: Iterable[str] = (),
    *,
    ttl: Any = UNSET,
    expire_time: Any = UNSET,
    pinned: Any = UNSET,
) -> pb.UpdateSessionRequest:
    """An UpdateSession whose mask names exactly the fields given: ``labels`` replaces the map,
    ``set_labels`` / ``remove_labels`` change single keys ("labels.KEY" paths); ``ttl`` sets
    the expiry to the server's now plus it, ``expire_time`` to a time (None: never expire),
    ``pinned`` pins or unpins."""
    session = pb.Session(session_id=session_id)
    paths: list[str] = []
    for name, value in (("title", title), ("owner", owner), ("status", status)):
        if value is not UNSET:
            setattr(session, name, value)
            paths.append(name)
    if labels is not UNSET:
        session.labels.update(labels)
        paths.append("labels")
    for key, value in (set_labels or {}).items():
        session.labels[key] = value
        paths.append(f"labels.{key}")
    paths += [f"labels.{key}" for key in remove_labels]
    if ttl is not UNSET and expire_time is not UNSET:
        raise MalformedRequest("update_session: give ttl or expire_time, not both", field="ttl")
    if ttl is not UNSET:
        given = duration(ttl)
        if given is None:
            raise MalformedRequest(
                "update_session: ttl=None; clear the expiry with expire_time=None", field="ttl"
            )
        session.ttl.CopyFrom(given)
        paths.append("ttl")
    if expire_time is not UNSET:
        if expire_time is not None:
            session.expire_time.CopyFrom(_timestamp(expire_time))
        paths.append("expire_time")
    if pinned is not UNSET:
        session.pinned = bool(pinned)
        paths.append("pinned")
    if not paths:
        raise MalformedRequest("update_session: name at least one field to set", field="fields")
    return pb.UpdateSessionRequest(session=session, update_mask=FieldMask(paths=paths))


def import_request(
    session_id: str,
    events: Iterable[EventLike],
    first_seq: int,
    create_time: TimeLike | None,
    last_append_time: TimeLike | None,
    parent_session_id: str,
    parent_event_count: int,
    record: pb.Session | None = None,
) -> pb.ImportSessionRequest:
    """An ImportSession chunk. Events without a seq (0) are numbered from ``first_seq``; an
    event carrying one keeps it (the server refuses seqs that do not follow each other)."""
    whole("first_seq", first_seq)
    whole("parent_event_count", parent_event_count)
    built = []
    for index, value in enumerate(events):
        made = Event()
        made.CopyFrom(event_from_dict(value))  # never the caller's event: its seq may be set
        made.seq = made.seq or first_seq + index
        built.append(made)
    request = pb.ImportSessionRequest(
        session_id=session_id,
        first_seq=first_seq,
        events=built,
        parent_session_id=parent_session_id,
        parent_event_count=parent_event_count,
    )
    if create_time is not None:
        request.create_time.CopyFrom(_timestamp(create_time))
    if last_append_time is not None:
        request.last_append_time.CopyFrom(_timestamp(last_append_time))
    if record is not None:
        request.record.CopyFrom(record)
    return request


def seed_request(
    session_id: str,
    messages: Iterable[MessageLike],
    lease_holder: str,
    lease_token: int,
    request_id: str = "",
) -> pb.SeedSessionRequest:
    return pb.SeedSessionRequest(
        session_id=session_id,
        messages=messages_from_dicts(messages),
        lease_holder=lease_holder,
        lease_token=lease_token,
        request_id=request_id,
    )


def list_request(
    page_size: int,
    page_token: str,
    prefix: str,
    filter: str = "",
    order_by: str = "",
    with_state: bool = False,
) -> pb.ListSessionsRequest:
    view = pb.SESSION_VIEW_FULL if with_state else pb.SESSION_VIEW_UNSPECIFIED
    return pb.ListSessionsRequest(
        page_size=checked_page_size(page_size),
        page_token=page_token,
        prefix=prefix,
        filter=filter,
        order_by=order_by,
        view=view,
    )


def fork_request(
    parent_session_id: str,
    at_seq: int | None,
    session_id: str,
    lease_holder: str,
    lease_token: int,
    request_id: str = "",
) -> pb.ForkSessionRequest:
    request = pb.ForkSessionRequest(
        parent_session_id=parent_session_id,
        session_id=session_id,
        lease_holder=lease_holder,
        lease_token=lease_token,
        request_id=request_id,
    )
    if at_seq is not None:
        request.at_seq = whole("at_seq", at_seq)
    return request


def duration(ttl: float | dt.timedelta | None) -> Duration | None:
    """A TTL in seconds (or a timedelta) as a Duration; None leaves the server's default."""
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, dt.timedelta) else float(ttl)
    out = Duration()
    out.FromNanoseconds(round(seconds * 1e9))
    return out
