"""SessionLogService over gRPC: decode, call one use case (``service.usecases``), encode.

Handlers take and return raw bytes. Decoding here, not in grpc's deserializer, turns any request
that fails to parse (bad UTF-8, Struct nested past the protobuf runtime's recursion limit) into
INVALID_ARGUMENT / MALFORMED_REQUEST instead of grpc's INTERNAL; and returning bytes lets stored
events go out exactly as stored, with no parse and no re-serialize.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sessionlog import errors, mirrors, wire
from sessionlog.cluster.sync import SyncTracker
from sessionlog.defaults import (
    DEFAULT_APPEND_STREAM_WINDOW,
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_MAX_EVENTS_PER_APPEND,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from sessionlog.records import parse_filter
from sessionlog.service import access, follow_sessions, importing, ledger, usecases
from sessionlog.service.append_stream import AppendStreams
from sessionlog.service.auth import Authorizer, Principal
from sessionlog.service.convert import (
    _LIST_EVENTS,
    _serialize,
    audit_message,
    decode,
    encode_append_response,
    encode_events,
    lease_message,
    session_message,
)
from sessionlog.service.counters import CANCELLED, INTERNAL, OK, Counters
from sessionlog.service.errors import abort, refusal_level
from sessionlog.service.follow import follow, heartbeat_interval
from sessionlog.service.limits import Outgoing, StreamLimiter
from sessionlog.service.notifier import Notifier
from sessionlog.service.usecases import DEFAULT_LEASE_TTL_NS, FRAMING_BYTES
from sessionlog.shard import scatter
from sessionlog.shard.ownership import MOVE_COPY, MOVE_HEADER, Ownership
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = "sessionlog.v1.SessionLogService"

Handler = Callable[[Any, bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


EPOCH_METADATA_KEY = "sessionlog-epoch"
"""The trailing metadata of every write RPC's reply, success or error: the server's epoch."""
EPOCH_GROUP_METADATA_KEY = "sessionlog-epoch-group"
"""Beside ``sessionlog-epoch`` on a sharded server's write replies: the group whose epoch it is.
Each group elects its own leaders, so epochs of two groups mean nothing to each other: a client
sends the group with the epoch, and a server of another group ignores that epoch."""


def caller_epoch(metadata: Any, group: str = "") -> int:
    """The highest epoch a caller says it has seen of ``group``, this server's group (request
    metadata ``sessionlog-epoch``, which the clients send with every write, and
    ``sessionlog-epoch-group`` when it is a sharded group's); 0 when it sends none, or one of
    another group. MalformedRequest unless it is a whole number."""
    named: Any = None
    epoch: Any = None
    for key, value in metadata or ():  # every write passes here: no list, nothing decoded twice
        if key == EPOCH_METADATA_KEY:
            epoch = value if epoch is None else epoch
        elif key == EPOCH_GROUP_METADATA_KEY:
            named = value if named is None else named
    if named is not None and _text(named) != group:
        return 0  # another group's epoch, learnt through a proxy that serves several groups
    if epoch is None:
        return 0
    text = _text(epoch)
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise errors.MalformedRequest(
            f"the {EPOCH_METADATA_KEY} request metadata must be a whole number (the "
            f"highest leadership epoch the caller has seen), not {text[:40]!r}",
            field=EPOCH_METADATA_KEY,
        )
    return int(text)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def unary(method: Handler) -> Handler:
    """Turn a raised SessionLogError into its status; anything else into INTERNAL, logged.
    Each call is counted in ``self.counters`` (method, reason, latency, reply bytes)."""
    return _unary(method, write=False)


def unary_write(method: Handler) -> Handler:
    """``unary`` for a write RPC: its reply, success or error, also carries the epoch of the
    leadership record the write met (``sessionlog-epoch`` trailing metadata): on success the
    one it was taken in, as the call began (the record cannot move to another epoch under a
    write that commits: a fence refuses it, a new election's epoch passes through a fenced
    moment that refuses it too), on error the server's epoch now (it may have just learnt a
    newer one)."""
    return _unary(method, write=True)


def _epoch_metadata(servicer: Any, met: int = 0) -> tuple[tuple[str, str], ...]:
    """``met``: the epoch when the call began (0: none then, a store's first write); with the
    group's name on a sharded server."""
    epoch = ((EPOCH_METADATA_KEY, str(met or servicer.store.writer.lead.epoch)),)
    group = servicer.ownership.group if servicer.ownership.sharded else ""
    return (*epoch, (EPOCH_GROUP_METADATA_KEY, group)) if group else epoch


def _unary(method: Handler, write: bool) -> Handler:
    rpc = "".join(part.title() for part in method.__name__.split("_"))

    @functools.wraps(method)
    async def handler(self: Any, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        started = time.perf_counter()
        reason, sent = CANCELLED, 0
        refusal: errors.SessionLogError | None = None
        met = self.store.writer.lead.epoch if write else 0
        try:
            if len(request) > self.max_message_bytes:
                raise errors.RequestTooLarge(
                    f"the request is {len(request)} bytes, over the {self.max_message_bytes}-byte "
                    "message limit (--max-message-size); split it into smaller calls",
                    size=len(request),
                    limit=self.max_message_bytes,
                )
            reply = await method(self, request, context)
            reason, sent = OK, len(reply)
            if write:
                context.set_trailing_metadata(_epoch_metadata(self, met))
            return reply
        except errors.SessionLogError as error:
            reason, refusal = error.reason, error
            _log_refusal(rpc, error)
        except Exception:
            reason = INTERNAL
            log.exception("unexpected failure in %s", rpc)
            refusal = errors.SessionLogError(f"internal error in {rpc}; see the server log")
        finally:
            self.counters.record(rpc, reason, time.perf_counter() - started, sent)
        # Abort outside the except: an exception raised inside it would keep this frame (and
        # the request's bytes) alive through the traceback until a full garbage collection.
        del request
        await abort(context, refusal, _epoch_metadata(self) if write else ())
        return b""  # abort returned: the client is gone and there is no one to tell

    return handler


def _log_refusal(rpc: str, error: errors.SessionLogError) -> None:
    """One line per refused call: the method and the reason, never the request's data."""
    log.log(refusal_level(error), "request refused", extra={"method": rpc, "reason": error.reason})


class SessionLogServicer:
    """SessionLogService: the log RPCs of SPEC §8 and the session lifecycle of §7. Each unary
    method decodes its request, calls one use case of ``self.cases`` (``service.usecases``)
    and encodes the result; the streams read through the same checks."""

    def __init__(
        self,
        store: Store,
        notifier: Notifier,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        primary: str = "",
        authorizer: Authorizer | None = None,
        max_events_per_append: int = DEFAULT_MAX_EVENTS_PER_APPEND,
        append_stream_window: int = DEFAULT_APPEND_STREAM_WINDOW,
        streams: StreamLimiter | None = None,
        counters: Counters | None = None,
        sync: SyncTracker | None = None,
        ownership: Ownership | None = None,
    ) -> None:
        self.store = store
        self.counters = counters or Counters()
        self.authorizer = authorizer
        self.streams = streams or StreamLimiter()
        self.notifier = notifier
        self.max_message_bytes = max_message_bytes
        self._recent_batches: dict[tuple[Any, ...], tuple[bytes, int, int]] = {}
        # A Since response holds whole events; leave room for the framing around them.
        self.since_batch_bytes = min(SINCE_BATCH_BYTES, max_message_bytes - FRAMING_BYTES)
        self.heartbeat_seconds = heartbeat_seconds
        self.ownership = ownership or Ownership(sharded=False)
        """Which sessions this server's group owns (--shard-map): every RPC naming a session
        checks it first, before anything else is done for the call."""
        self.cases = usecases.SessionLog(
            store,
            self.ownership,
            max_events_per_append=max_events_per_append,
            max_message_bytes=max_message_bytes,
            sync=sync,
            primary=primary,
        )
        self.append_streams = AppendStreams(
            self.cases,
            self.counters,
            notifier,
            self.streams,
            window=append_stream_window,
            max_message_bytes=max_message_bytes,
        )

    # What the composition sets after start (a replica's primary, a member's refusal, the
    # sharded listing), kept by the use cases.

    @property
    def primary(self) -> str:
        return self.cases.primary

    @primary.setter
    def primary(self, primary: str) -> None:
        self.cases.primary = primary

    @property
    def refusal(self) -> Callable[[], errors.NotPrimary | None] | None:
        return self.cases.refusal

    @refusal.setter
    def refusal(self, refusal: Callable[[], errors.NotPrimary | None] | None) -> None:
        self.cases.refusal = refusal

    @property
    def scatter(self) -> scatter.Scatter | None:
        return self.cases.scatter

    @scatter.setter
    def scatter(self, spread: scatter.Scatter | None) -> None:
        self.cases.scatter = spread

    def handlers(self) -> grpc.GenericRpcHandler:
        """Method handlers that pass raw bytes in and out (see the module docstring)."""
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Append": grpc.unary_unary_rpc_method_handler(self.append),
                "AppendStream": grpc.stream_stream_rpc_method_handler(self.append_stream),
                "Since": grpc.unary_stream_rpc_method_handler(
                    self.streams.guard(self.since, self._since_scope, self._since_subject)
                ),
                "ListEvents": grpc.unary_unary_rpc_method_handler(self.list_events),
                "Surface": grpc.unary_unary_rpc_method_handler(self.surface),
                "DeriveMessages": grpc.unary_unary_rpc_method_handler(self.derive_messages),
                "GetState": grpc.unary_unary_rpc_method_handler(self.get_state),
                "GetUsage": grpc.unary_unary_rpc_method_handler(self.get_usage),
                "CreateSession": grpc.unary_unary_rpc_method_handler(self.create_session),
                "SeedSession": grpc.unary_unary_rpc_method_handler(self.seed_session),
                "GetSession": grpc.unary_unary_rpc_method_handler(self.get_session),
                "ListSessions": grpc.unary_unary_rpc_method_handler(self.list_sessions),
                "UpdateSession": grpc.unary_unary_rpc_method_handler(self.update_session),
                "ForkSession": grpc.unary_unary_rpc_method_handler(self.fork_session),
                "AcquireLease": grpc.unary_unary_rpc_method_handler(self.acquire_lease),
                "RenewLease": grpc.unary_unary_rpc_method_handler(self.renew_lease),
                "ReleaseLease": grpc.unary_unary_rpc_method_handler(self.release_lease),
                "GetShardMap": grpc.unary_unary_rpc_method_handler(self.get_shard_map),
                "ImportSession": grpc.unary_unary_rpc_method_handler(self.import_session),
                "GetSessionRecords": grpc.unary_unary_rpc_method_handler(self.get_session_records),
                "DeleteSession": grpc.unary_unary_rpc_method_handler(self.delete_session),
                "RedactEvents": grpc.unary_unary_rpc_method_handler(self.redact_events),
                "FollowSessions": grpc.unary_stream_rpc_method_handler(
                    self.streams.guard(
                        self.follow_sessions, subject=lambda raw: "the followed sessions"
                    )
                ),
            },
        )

    # -- who calls ---------------------------------------------------------------------------

    def _principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        if self.authorizer is None:
            return None  # auth off: the call's metadata is not read (it is built per call)
        return access.principal_of(self.authorizer, context.invocation_metadata())

    def _caller(self, context: grpc.aio.ServicerContext) -> usecases.Caller:
        """A write's caller: its token, the epoch it has seen, whether it is a move's copy."""
        metadata = context.invocation_metadata()
        return usecases.Caller(
            access.principal_of(self.authorizer, metadata),
            caller_epoch(metadata, self.ownership.group),
            _is_move_copy(metadata),
        )

    def _fitting(self, reply: bytes, session_id: str) -> bytes:
        if len(reply) > self.max_message_bytes:
            raise errors.ResponseTooLarge(
                f"the answer for session '{session_id}' is {len(reply)} bytes, over the "
                f"{self.max_message_bytes}-byte message limit; read it with Since, or raise the "
                "server's message size limit",
                size=len(reply),
                limit=self.max_message_bytes,
            )
        return reply

    # -- the log (SPEC §8) ---------------------------------------------------------------------

    @unary_write
    async def append(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.AppendRequest, raw)
        result = await self.cases.append(self._caller(context), request)
        for index, reason, _ in result.drops:
            self.counters.dropped(reason)
            log.warning(
                "lenient append dropped an event",
                extra={"session_id": request.session_id, "index": index, "reason": reason},
            )
        return encode_append_response(result, request.session_id)

    async def append_stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        """Appends pipelined on one stream, each answered on its own (``append_stream``).
        Counted by the stream limits while open: each holds up to its window of requests.
        Its initial metadata carries the server's epoch as the stream opens (as a unary
        write's trailers do), so a client learns it before the first reply and can tell a
        deposed server's acknowledgements from the primary's; its trailers, the epoch again."""
        peer = context.peer() or ""
        try:
            caller = self._caller(context)
            self.streams.acquire(peer, follows=False)
        except errors.SessionLogError as error:
            await abort(context, error, _epoch_metadata(self))
            return
        try:
            await context.send_initial_metadata(_epoch_metadata(self))
            await self.append_streams.serve(
                requests, context, caller, functools.partial(_epoch_metadata, self)
            )
        finally:
            self.streams.release(peer, follows=False)

    @staticmethod
    def _since_subject(raw: bytes) -> str:
        try:
            return f"session '{pb.SinceRequest.FromString(raw).session_id}'"
        except DecodeError:
            return "the stream"

    def _since_scope(self, raw: bytes, context: grpc.aio.ServicerContext) -> None:
        if self.authorizer is not None:
            access.scope(self._principal(context), decode(pb.SinceRequest, raw).session_id)

    async def since(self, raw: bytes, context: grpc.aio.ServicerContext) -> Outgoing:
        """Stored events from seq on in byte-bounded batches; with follow, then live ones.

        Yields each response with the seq a client resumes from once it has read it.
        """
        try:
            request = decode(pb.SinceRequest, raw)
            self.cases.reading(self._principal(context), request.session_id)
        except errors.SessionLogError as error:
            await abort(context, error)
            return
        session_id = request.session_id
        started: list[Any] = []
        """The log the stream first read (its version's identity): another one means deleted."""

        def read(cursor: int) -> tuple[bytes, int, bool]:
            self.ownership.check(session_id)  # the map may have moved it (the stream ends)
            encoded, count, next_seq, version = self._read_since(session_id, cursor)
            if next_seq or started:
                if not started:
                    started.append(version[0])
                elif version[0] != started[0]:
                    raise errors.SessionNotFound(
                        f"session '{session_id}' was deleted while you read it; anything of the "
                        "same id now is a new log: read it again from seq 0",
                        session_id=session_id,
                    )
            return encoded, count, cursor + count < next_seq

        def marker(caught_up: bool) -> bytes:
            marked = pb.SinceResponse(caught_up=caught_up, next_seq=self.store.next_seq(session_id))
            return _serialize(marked)

        stream = follow(
            functools.partial(abort, context),
            self.notifier,
            key=session_id,
            subject=f"session '{session_id}'",
            cursor=request.seq,
            live=request.follow,
            heartbeat_seconds=heartbeat_interval(
                request.heartbeat_interval, self.heartbeat_seconds
            ),
            read=read,
            marker=marker,
            pace=self.streams.pace,
        )
        async for response in stream:
            yield response

    async def follow_sessions(self, raw: bytes, context: grpc.aio.ServicerContext) -> Outgoing:
        """The events of every followed session from a feed position on (``follow_sessions``):
        the prefix narrowed to the caller's token, the sessions kept to this group's own."""
        try:
            request = decode(pb.FollowSessionsRequest, raw)
            admits = self.cases.followed(self._principal(context), request.prefix)
            query = parse_filter(request.filter)
            start = follow_sessions.start_position(self.store, request)
        except errors.SessionLogError as error:
            await abort(context, error)
            return
        stream = follow_sessions.follow_sessions(
            functools.partial(abort, context),
            self.store,
            self.notifier,
            start=start,
            admits=admits,
            query=query,
            heartbeat_seconds=heartbeat_interval(
                request.heartbeat_interval, self.heartbeat_seconds
            ),
            max_bytes=self.since_batch_bytes,
            pace=self.streams.pace,
        )
        async for response in stream:
            yield response

    def _read_since(self, session_id: str, start: int) -> tuple[bytes, int, int, Any]:
        """One Since batch from ``start``: the encoded response, its event count, the
        session's next seq, which bounds the read (seqs are dense: no key compare per event),
        and the version of its log (``Store.log_version``)."""
        store = self.store
        next_seq, version = store.log_version(session_id)
        if start >= next_seq:
            return b"", 0, next_seq, version
        key = (session_id, start, next_seq, version)  # version: a delete or redaction since
        shared = self._recent_batches.get(key)
        if shared is None:
            events = store.read_session(session_id, start, next_seq, self.since_batch_bytes)
            shared = encode_events(events), len(events), next_seq
            self._share(key, shared)
        return (*shared, version)

    def _share(self, key: tuple[Any, ...], batch: tuple[bytes, int, int]) -> None:
        """Keep a few recent batches: after a commit every follower of a session wakes at the
        same seq, and one read and encode then serves them all. A key names the whole state it
        was read at (start and next seq), so a hit is exactly what a fresh read would return."""
        recent = self._recent_batches
        recent[key] = batch
        while len(recent) > RECENT_BATCHES:
            del recent[next(iter(recent))]

    @unary
    async def surface(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.SurfaceRequest, raw)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        folded = self.cases.surface(self._principal(context), request.session_id, at_seq)
        response = pb.SurfaceResponse(
            events=folded.surface,
            event_count=folded.count,
            replace_generation=folded.replace_generation,
        )
        # Deterministic: a replica must answer with the very bytes its primary does.
        serialized: bytes = response.SerializeToString(deterministic=True)
        return self._fitting(serialized, request.session_id)

    @unary
    async def derive_messages(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.DeriveMessagesRequest, raw)
        principal, session_id = self._principal(context), request.session_id
        at_seq = request.at_seq if request.HasField("at_seq") else None
        if request.page_size or request.page_token:
            page = self.cases.messages_page(
                principal, session_id, at_seq, request.page_size, request.page_token
            )
            reply = mirrors.DeriveMessagesResponse(
                messages=page.page.projected,
                seqs=page.page.seqs,
                event_count=page.page.count,
                replace_generation=page.replace_generation,
                next_page_token=page.next_page_token,
            )
            return self._fitting(_serialize(reply), session_id)
        known = None
        if request.HasField("known_event_count"):
            known = (request.known_event_count, request.known_replace_generation)
        read = self.cases.messages(principal, session_id, at_seq, known)
        reply = mirrors.DeriveMessagesResponse(
            messages=read.snapshot.projected,
            seqs=read.snapshot.seqs,
            event_count=read.snapshot.count,
            replace_generation=read.snapshot.replace_generation,
            incremental=read.incremental,
        )
        return self._fitting(_serialize(reply), session_id)

    @unary
    async def list_events(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """One page of stored events, oldest or newest first, sent as stored."""
        request = decode(pb.ListEventsRequest, raw)
        read = self.cases.events(
            self._principal(context),
            request.session_id,
            request.page_size,
            request.order_by,
            request.page_token,
        )
        events = wire.length_delimited(_LIST_EVENTS, read.page.events)
        reply = pb.ListEventsResponse(
            next_page_token=read.next_page_token,
            event_count=read.page.next_seq,
            session_uid=read.page.uid,
        )
        return events + _serialize(reply)

    @unary
    async def get_state(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetStateRequest, raw)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        state, count = self.cases.state(self._principal(context), request.session_id, at_seq)
        reply = pb.GetStateResponse(state=state, event_count=count)
        # Deterministic (the state is a map): a replica answers with its primary's bytes.
        serialized: bytes = reply.SerializeToString(deterministic=True)
        return self._fitting(serialized, request.session_id)

    @unary
    async def get_usage(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetUsageRequest, raw)
        spent = self.cases.usage(
            self._principal(context),
            request.session_id,
            request.at_seq if request.HasField("at_seq") else None,
            request.include_descendants,
        )
        reply = pb.GetUsageResponse(
            usage=ledger.model_usages(spent.totals),
            event_count=spent.event_count,
            own_usage=ledger.model_usages(spent.own),
            descendant_session_ids=spent.descendants,
        )
        return self._fitting(_serialize(reply), request.session_id)

    # -- lifecycle (SPEC §5 Seed, §7) ---------------------------------------------------------

    @unary_write
    async def create_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.CreateSessionRequest, raw)
        result = await self.cases.create_session(self._caller(context), request)
        session = session_message(request.session_id, result.meta, result.lease, result.record)
        return _serialize(mirrors.CreateSessionResponse(session=session, events=result.events))

    @unary_write
    async def update_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.UpdateSessionRequest, raw)
        updated, view = await self.cases.update_session(self._caller(context), request)
        session_id = request.session.session_id
        session = session_message(session_id, updated.meta, view.lease, updated.record)
        return _serialize(pb.UpdateSessionResponse(session=session))

    @unary_write
    async def seed_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.SeedSessionRequest, raw)
        seeded = await self.cases.seed_session(self._caller(context), request)
        result = seeded.result
        drops = [pb.SeedDrop(index=i, reason="UNKNOWN_ROLE") for i in seeded.dropped]
        session = session_message(request.session_id, result.meta, result.lease, result.record)
        reply = mirrors.SeedSessionResponse(session=session, events=result.events, drops=drops)
        return _serialize(reply)

    @unary
    async def get_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetSessionRequest, raw)
        read = self.cases.session(self._principal(context), request.session_id)
        view = read.view
        session = session_message(view.session_id, view.meta, view.lease, view.record)
        if read.usage is not None:
            session.usage.extend(ledger.model_usages(read.usage))
        response = pb.GetSessionResponse(
            session=session,
            lease_audit=[audit_message(record) for record in view.audit],
        )
        return _serialize(response)

    @unary
    async def list_sessions(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ListSessionsRequest, raw)
        query = usecases.SessionQuery(
            prefix=request.prefix,
            filter_text=request.filter,
            order_by=request.order_by,
            page_size=request.page_size,
            page_token=request.page_token,
            view=request.view,
        )
        page = await self.cases.list_sessions(
            self._principal(context),
            query,
            tuple(context.invocation_metadata() or ()),
            context.time_remaining(),
        )
        response = pb.ListSessionsResponse(
            sessions=page.sessions,
            next_page_token=page.next_page_token,
            usage_total=ledger.page_total(page.sessions),
        )
        return _serialize(response)

    @unary
    async def get_shard_map(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        decode(pb.GetShardMapRequest, raw)
        ownership = self.ownership
        reply = pb.GetShardMapResponse(group=ownership.group)
        held = ownership.map
        if held is not None:
            reply.shard_map.epoch = held.epoch
            for group in held.groups:
                reply.shard_map.groups.append(
                    pb.ShardGroup(
                        name=group.name,
                        members=group.members,
                        slot_ranges=[pb.SlotRange(first=a, last=b) for a, b in group.ranges],
                        primary=ownership.primary_of(group),
                    )
                )
        return _serialize(reply)

    @unary_write
    async def fork_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ForkSessionRequest, raw)
        result = await self.cases.fork_session(self._caller(context), request)
        session = session_message(result.session_id, result.meta, result.lease, result.record)
        return _serialize(pb.ForkSessionResponse(session=session))

    # -- erasure (storage.erasure) -------------------------------------------------------------

    @unary_write
    async def delete_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.DeleteSessionRequest, raw)
        result = await self.cases.delete_session(self._caller(context), request)
        session = session_message(result.session_id, result.meta, result.lease, result.record)
        reply = pb.DeleteSessionResponse(
            session=session, event_count=result.event_count, position=result.position
        )
        return _serialize(reply)

    @unary_write
    async def redact_events(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.RedactEventsRequest, raw)
        result = await self.cases.redact_events(self._caller(context), request)
        position = result.position if result.seqs else 0  # the proto: 0 when nothing changed
        return _serialize(pb.RedactEventsResponse(seqs=result.seqs, position=position))

    @unary_write
    async def import_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ImportSessionRequest, raw)
        result = await self.cases.import_session(self._caller(context), request)
        reply = pb.ImportSessionResponse(
            session=session_message(request.session_id, result.meta, result.lease, result.record),
            imported_count=len(result.events),
        )
        return _serialize(reply)

    @unary
    async def get_session_records(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetSessionRecordsRequest, raw)
        found, live = self.cases.session_records(self._principal(context), request.session_id)
        reply = pb.GetSessionRecordsResponse(
            session=session_message(request.session_id, found.meta, live, found.record),
            request_records=[importing.request_message(i, r) for i, r in found.requests],
            lease_audit=[audit_message(record) for record in found.audit],
        )
        if found.lease is not None:
            reply.lease.CopyFrom(importing.lease_record_message(found.lease))
        return self._fitting(_serialize(reply), request.session_id)

    @unary_write
    async def acquire_lease(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.AcquireLeaseRequest, raw)
        change = await self.cases.lease(
            self._caller(context), "acquire", request.session_id, request.holder, _ttl_ns(request)
        )
        return _serialize(pb.AcquireLeaseResponse(lease=lease_message(change.lease)))

    @unary_write
    async def renew_lease(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.RenewLeaseRequest, raw)
        change = await self.cases.lease(
            self._caller(context), "renew", request.session_id, request.holder, _ttl_ns(request)
        )
        return _serialize(pb.RenewLeaseResponse(lease=lease_message(change.lease)))

    @unary_write
    async def release_lease(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ReleaseLeaseRequest, raw)
        change = await self.cases.lease(
            self._caller(context),
            "release",
            request.session_id,
            request.holder,
            force=request.force,
        )
        response = pb.ReleaseLeaseResponse()
        if change.lease is not None:
            response.released.CopyFrom(lease_message(change.lease))
        return _serialize(response)


RECENT_BATCHES = 64
"""Since batches kept for followers waking at the same seq (each at most SINCE_BATCH_BYTES)."""
SINCE_BATCH_BYTES = 256 << 10
"""Since sends whatever is ready in responses of about this size (a few hundred events)."""


def _is_move_copy(metadata: Any) -> bool:
    """The call carries MOVE_HEADER: a slot move's copy (see ``Ownership.check_copy``)."""
    for key, value in metadata or ():
        if key == MOVE_HEADER:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text == MOVE_COPY
    return False


def _ttl_ns(request: pb.AcquireLeaseRequest | pb.RenewLeaseRequest) -> int:
    if not request.HasField("ttl"):
        return DEFAULT_LEASE_TTL_NS
    ttl: int = request.ttl.ToNanoseconds()
    return ttl
