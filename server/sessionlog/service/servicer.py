"""SessionLogService over gRPC: decode, call the store, encode. Nothing else.

Handlers take and return raw bytes. Decoding here, not in grpc's deserializer, turns any request
that fails to parse (bad UTF-8, Struct nested past the protobuf runtime's recursion limit) into
INVALID_ARGUMENT / MALFORMED_REQUEST instead of grpc's INTERNAL; and returning bytes lets stored
events go out exactly as stored, with no parse and no re-serialize.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sessionlog import errors, fold, mirrors, wire
from sessionlog.cluster.sync import SyncTracker
from sessionlog.defaults import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_MAX_EVENTS_PER_APPEND,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from sessionlog.listing import Listing, decode_listing_token, encode_listing_token
from sessionlog.records import SessionRecord, parse_filter
from sessionlog.service import (
    access,
    expiration,
    follow_sessions,
    importing,
    ledger,
    paging,
    queries,
)
from sessionlog.service.auth import Authorizer
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
from sessionlog.shard import scatter
from sessionlog.shard.ownership import MOVE_COPY, MOVE_HEADER, Ownership
from sessionlog.storage import leadership, schema
from sessionlog.storage.records import BY_ID, BY_UPDATE, given_record
from sessionlog.storage.store import Store, prepare_append, prepare_seed
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
    pairs = [
        (key, value.decode() if isinstance(value, bytes) else str(value))
        for key, value in metadata or ()
    ]
    named = next((v for k, v in pairs if k == EPOCH_GROUP_METADATA_KEY), None)
    if named is not None and named != group:
        return 0  # another group's epoch, learnt through a proxy that serves several groups
    for key, text in pairs:
        if key != EPOCH_METADATA_KEY:
            continue
        if not (text.isascii() and text.isdigit()) or len(text) > 20:
            raise errors.MalformedRequest(
                f"the {EPOCH_METADATA_KEY} request metadata must be a whole number (the "
                f"highest leadership epoch the caller has seen), not {text[:40]!r}",
                field=EPOCH_METADATA_KEY,
            )
        return int(text)
    return 0


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
    """SessionLogService: the log RPCs of SPEC §8 and the session lifecycle of §7."""

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
        streams: StreamLimiter | None = None,
        counters: Counters | None = None,
        sync: SyncTracker | None = None,
        ownership: Ownership | None = None,
    ) -> None:
        self.store = store
        self.sync = sync
        """With --ack replica: every write's reply waits until enough replicas hold it."""
        self.counters = counters or Counters()
        self.authorizer = authorizer
        self.max_events_per_append = max_events_per_append
        self.streams = streams or StreamLimiter()
        self.primary = primary
        """Set on a replica: the primary that takes the writes refused here."""
        self.refusal: Callable[[], errors.NotPrimary | None] | None = None
        """A cluster member's process-level answer (``cluster.member``): the NOT_PRIMARY a
        write gets while the member does not lead with a live lease, else None."""
        self.notifier = notifier
        self.max_message_bytes = max_message_bytes
        self._recent_batches: dict[tuple[Any, ...], tuple[bytes, int, int]] = {}
        # A Since response holds whole events; leave room for the framing around them.
        self.since_batch_bytes = min(SINCE_BATCH_BYTES, max_message_bytes - FRAMING_BYTES)
        self.heartbeat_seconds = heartbeat_seconds
        self.scatter: scatter.Scatter | None = None
        """Set on a sharded server: ListSessions answers for every group (``shard.scatter``)."""
        self.ownership = ownership or Ownership(sharded=False)
        """Which sessions this server's group owns (--shard-map): every RPC naming a session
        checks it first, before anything else is done for the call."""

    def handlers(self) -> grpc.GenericRpcHandler:
        """Method handlers that pass raw bytes in and out (see the module docstring)."""
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Append": grpc.unary_unary_rpc_method_handler(self.append),
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

    @unary_write
    async def append(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.AppendRequest, raw)
        copy = _is_move_copy(context)
        if copy:  # a slot move fills the slot's next owner (shard.move)
            self.ownership.check_copy(
                request.session_id,
                request.expected_seq if request.HasField("expected_seq") else None,
            )
            access.require_admin(self.authorizer, context, "a slot move's copy")
        else:
            self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id)
        self._check_count(len(request.events))
        batch = prepare_append(
            request.session_id,
            request.events,
            limits=self.store.config.limits,
            expected_seq=request.expected_seq if request.HasField("expected_seq") else None,
            request_id=request.request_id,
            lease_holder=request.lease_holder,
            lease_token=request.lease_token,
            lenient=request.lenient,
            keep_redacted=copy,
        )
        batch.moving_in = copy
        self._check_reply_fits(batch.bodies)
        result = await self.store.commit_append(batch)
        await self._replicated(result.position)
        for index, reason, _ in result.drops:
            self.counters.dropped(reason)
            log.warning(
                "lenient append dropped an event",
                extra={"session_id": request.session_id, "index": index, "reason": reason},
            )
        return encode_append_response(result)

    def _sid(self, session_id: str) -> int:
        """The session's internal id (0: not stored), which a page token is bound to."""
        return self.store.log_number(session_id)

    def _check_count(self, count: int) -> None:
        if count > self.max_events_per_append:
            raise errors.TooManyEvents(
                f"{count} events in one call; the limit is {self.max_events_per_append} "
                "(--max-events-per-append): split the batch",
                count=count,
                limit=self.max_events_per_append,
            )

    def _require_primary(self, context: grpc.aio.ServicerContext) -> None:
        """The fast refusal of a write this server will not take (the writer's check inside
        the write transaction is the authoritative one: see ``storage.leadership``). A replica
        names the primary it follows now (its leadership record's, once it turned to a new
        one). A caller that has seen a newer epoch than this server's is refused too: a newer
        primary exists, so this one was deposed without knowing it (an old primary restarted
        after a promotion that did not fence it). That refusal changes nothing here: a client's
        word does not depose a server, a replica's (``ChangesRequest.epoch``) does."""
        lead = self.store.writer.lead
        if self.refusal is not None:
            refused = self.refusal()
            if refused is not None:
                raise refused
        if self.primary:
            primary = lead.primary if lead.role == leadership.REPLICA else ""
            primary = primary or self.primary
            raise errors.NotPrimary(
                f"this server is a read replica of {primary}; send writes there",
                primary=primary,
                epoch=lead.epoch,
            )
        if not lead.may_write:
            raise leadership.not_primary(lead)
        seen = caller_epoch(context.invocation_metadata(), self.ownership.group)
        if leadership.behind(lead, seen) is not None:
            # The writer's copy may predate a commit by another worker (a fresh store's first
            # write takes epoch 1): decide by the record as committed now.
            behind = leadership.behind(self.store.leadership(), seen)
            if behind is not None:
                raise behind

    async def _replicated(self, position: int) -> None:
        """With --ack replica, wait until enough replicas hold the change at ``position`` (or
        raise ReplicasUnavailable: the write stays committed here). Every write RPC calls it."""
        if self.sync is not None:
            await self.sync.wait(position)

    def _check_reply_fits(self, bodies: Sequence[bytes]) -> None:
        """Refuse, before writing, an append whose reply (the events with their seqs) would not
        fit in one message: a reply that cannot be sent would hide a committed write."""
        worst = sum(map(len, bodies)) + STORED_EVENT_OVERHEAD * len(bodies) + FRAMING_BYTES
        if worst > self.max_message_bytes:
            raise errors.BatchTooLarge(
                f"this append's reply would be up to {worst} bytes, over the "
                f"{self.max_message_bytes}-byte message limit; split it into smaller appends",
                reply_bytes=worst,
                limit=self.max_message_bytes,
            )

    @staticmethod
    def _since_subject(raw: bytes) -> str:
        try:
            return f"session '{pb.SinceRequest.FromString(raw).session_id}'"
        except DecodeError:
            return "the stream"

    def _since_scope(self, raw: bytes, context: grpc.aio.ServicerContext) -> None:
        if self.authorizer is not None:
            access.scope(self.authorizer, context, decode(pb.SinceRequest, raw).session_id)

    async def since(self, raw: bytes, context: grpc.aio.ServicerContext) -> Outgoing:
        """Stored events from seq on in byte-bounded batches; with follow, then live ones.

        Yields each response with the seq a client resumes from once it has read it.
        """
        try:
            request = decode(pb.SinceRequest, raw)
            self.ownership.check(request.session_id)
            fold.check_session_id(request.session_id)
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
            self.ownership.check()  # sharded: a map must be held to know which are mine
            prefix = access.listing_prefix(self.authorizer, context, request.prefix)
            query = parse_filter(request.filter)
            start = follow_sessions.start_position(self.store, request)
        except errors.SessionLogError as error:
            await abort(context, error)
            return
        owns = self.ownership.owns

        def admits(session_id: str) -> bool:
            return session_id.startswith(prefix) and owns(session_id)

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
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        fold.check_session_id(request.session_id)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        folded = self.store.surface(request.session_id, at_seq)
        response = pb.SurfaceResponse(
            events=folded.surface,
            event_count=folded.count,
            replace_generation=folded.replace_generation,
        )
        # Deterministic: a replica must answer with the very bytes its primary does.
        serialized: bytes = response.SerializeToString(deterministic=True)
        return self._fitting(serialized, request.session_id)

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

    @unary
    async def derive_messages(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.DeriveMessagesRequest, raw)
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        fold.check_session_id(request.session_id)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        if request.page_size or request.page_token:
            return self._derive_page(request, at_seq)
        folded = None
        if at_seq is None and request.HasField("known_event_count"):
            folded = self.store.derive_tail(
                request.session_id, request.known_event_count, request.known_replace_generation
            )
        incremental = folded is not None
        if folded is None:
            folded = self.store.surface(request.session_id, at_seq, messages=True)
        reply = mirrors.DeriveMessagesResponse(
            messages=folded.projected,
            seqs=folded.seqs,
            event_count=folded.count,
            replace_generation=folded.replace_generation,
            incremental=incremental,
        )
        return self._fitting(_serialize(reply), request.session_id)

    def _derive_page(self, request: pb.DeriveMessagesRequest, at_seq: int | None) -> bytes:
        """The last page_size messages of a pinned view (see ``Store.derive_page``)."""
        session_id = request.session_id
        size = paging.page_size(request.page_size)
        sid = self._sid(session_id)
        cursor = None
        if request.page_token:
            cursor = paging.MessagesCursor.decode(request.page_token, session_id, at_seq, sid)
        page = self.store.derive_page(
            session_id,
            size,
            at_seq=at_seq,
            pinned=None if cursor is None else cursor.pinned,
            before=None if cursor is None else cursor.before,
            resume=None if cursor is None else cursor.walk,
        )
        if cursor is not None:
            generation = cursor.generation
        elif at_seq is None:  # the view is the whole log as it was read
            generation = page.replace_generation
        else:
            generation = 0
        token = ""
        if page.more:
            cursor = paging.MessagesCursor(
                page.count, page.first_position, generation, at_seq, page.walk
            )
            token = cursor.encode(session_id, sid)
        reply = mirrors.DeriveMessagesResponse(
            messages=page.projected,
            seqs=page.seqs,
            event_count=page.count,
            replace_generation=generation,
            next_page_token=token,
        )
        return self._fitting(_serialize(reply), session_id)

    @unary
    async def list_events(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """One page of stored events, oldest or newest first, sent as stored."""
        request = decode(pb.ListEventsRequest, raw)
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        session_id = request.session_id
        fold.check_session_id(session_id)
        size = paging.page_size(request.page_size)
        desc = paging.descending(request.order_by)
        kind = paging.DESCENDING if desc else paging.ASCENDING
        sid = self._sid(session_id)
        cursor = None
        if request.page_token:
            (cursor,) = paging.decode(request.page_token, kind, session_id, "ListEvents", sid=sid)
        budget = self.max_message_bytes - FRAMING_BYTES - STORED_EVENT_OVERHEAD * size
        page = self.store.list_events(session_id, cursor, size, descending=desc, max_bytes=budget)
        if desc:
            after = page.first_seq - len(page.events) + 1  # the oldest seq of this page
            more = bool(page.events) and after > 0
        else:
            after = page.first_seq + len(page.events)  # the next seq to read
            more = after < page.next_seq
        token = paging.encode(kind, session_id, after, sid=sid) if more else ""
        events = wire.length_delimited(_LIST_EVENTS, page.events)
        reply = pb.ListEventsResponse(next_page_token=token, event_count=page.next_seq)
        return events + _serialize(reply)

    @unary
    async def get_state(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetStateRequest, raw)
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        fold.check_session_id(request.session_id)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        state, count = self.store.state(request.session_id, at_seq)
        reply = pb.GetStateResponse(state=state, event_count=count)
        # Deterministic (the state is a map): a replica answers with its primary's bytes.
        serialized: bytes = reply.SerializeToString(deterministic=True)
        return self._fitting(serialized, request.session_id)

    @unary
    async def get_usage(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetUsageRequest, raw)
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        fold.check_session_id(request.session_id)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        if at_seq is not None and request.include_descendants:
            raise errors.MalformedRequest(
                "at_seq and include_descendants cannot be combined: a descendant's log has no "
                "place in its ancestor's seqs; ask for one or the other",
                field="at_seq",
            )
        principal = access.principal_of(self.authorizer, context)
        spent = self.store.usage(
            request.session_id,
            at_seq,
            include_descendants=request.include_descendants,
            # A tenant's tree stops at its prefix: a fork another token made outside it is not
            # the tenant's to read.
            admits=None if principal is None else principal.admits,
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
        parent = request.parent_session_id
        if parent:
            self.ownership.check_fork(parent, request.session_id)
        self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id, *([parent] if parent else []))
        self._check_count(len(request.events))
        if parent:
            fold.check_session_id(parent)
        elif request.HasField("parent_seq"):
            raise errors.InvalidSessionField(
                "parent_seq needs parent_session_id: name the parent session",
                field="parent_seq",
            )
        record = given_record(
            request.title,
            request.labels,
            request.owner,
            request.status,
            request.parent_seq if request.HasField("parent_seq") else None,
            expire_time_ns=expiration.requested(request),
            pinned=request.pinned,
        )
        batch = prepare_append(
            request.session_id,
            request.events,
            limits=self.store.config.limits,
            create_only=True,
            lease_holder=request.lease_holder,
            lease_token=request.lease_token,
            request_id=request.request_id,
        )
        batch.record, batch.parent_id = record, parent
        if batch.fingerprint:  # a retry must repeat the record and the parent link too
            # the expiry as asked (a ttl, not the time it gave), so that a retry matches
            asked_record = replace(record, expire_time_ns=0)
            asked = f"{batch.fingerprint}|{parent}|{schema.encode_record(asked_record).hex()}"
            if request.HasField("expiration"):
                asked += f"|{expiration.asked(request)}"
            batch.fingerprint = hashlib.sha256(asked.encode()).hexdigest()
        result = await self.store.commit_append(batch)
        await self._replicated(result.position)
        session = session_message(request.session_id, result.meta, result.lease, result.record)
        return _serialize(mirrors.CreateSessionResponse(session=session, events=result.events))

    @unary_write
    async def update_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.UpdateSessionRequest, raw)
        session_id = request.session.session_id
        self.ownership.check_write(session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, session_id)
        fold.check_session_id(session_id)
        given = request.session
        record = SessionRecord(given.title, dict(given.labels), given.owner, given.status)
        paths = list(request.update_mask.paths) if request.HasField("update_mask") else None
        if paths is not None:
            paths = expiration.update_paths(given, record, paths)
        updated = await self.store.commit_update(session_id, record, paths)
        await self._replicated(updated.position)
        view = self.store.session(session_id)
        session = session_message(session_id, updated.meta, view.lease, updated.record)
        return _serialize(pb.UpdateSessionResponse(session=session))

    @unary_write
    async def seed_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.SeedSessionRequest, raw)
        self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id)
        self._check_count(len(request.messages))
        batch, dropped = prepare_seed(
            request.session_id,
            request.messages,
            limits=self.store.config.limits,
            lease_holder=request.lease_holder,
            lease_token=request.lease_token,
            request_id=request.request_id,
        )
        result = await self.store.commit_append(batch)
        await self._replicated(result.position)
        drops = [pb.SeedDrop(index=i, reason="UNKNOWN_ROLE") for i in dropped]
        session = session_message(request.session_id, result.meta, result.lease, result.record)
        reply = mirrors.SeedSessionResponse(session=session, events=result.events, drops=drops)
        return _serialize(reply)

    @unary
    async def get_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetSessionRequest, raw)
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        fold.check_session_id(request.session_id)
        view = self.store.session(request.session_id)
        session = session_message(view.session_id, view.meta, view.lease, view.record)
        if view.meta is not None:
            spent = self.store.usage_of([view.session_id])[view.session_id]
            session.usage.extend(ledger.model_usages(spent))
        response = pb.GetSessionResponse(
            session=session,
            lease_audit=[audit_message(record) for record in view.audit],
        )
        return _serialize(response)

    @unary
    async def list_sessions(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ListSessionsRequest, raw)
        self.ownership.check()  # sharded: a map must be held; the page keeps my group's own
        prefix = access.listing_prefix(self.authorizer, context, request.prefix)
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        order = listing_order(request.order_by)
        query = parse_filter(request.filter)
        listing = Listing(prefix, request.filter, order)
        after = decode_listing_token(request.page_token, listing)
        metadata = context.invocation_metadata()
        if self.scatter is not None and not scatter.local_only(metadata) and order == BY_UPDATE:

            def recent(after: bytes, prefix: str, size: int) -> tuple[list[pb.Session], bytes]:
                return queries.local_page(
                    self.store,
                    self.ownership,
                    after,
                    Listing(prefix, request.filter, order),
                    query,
                    size,
                )

            sessions, cursor = await self.scatter.list_recent(
                recent,
                after,
                prefix,
                size,
                metadata,
                context.time_remaining(),
                filter_text=request.filter,
            )
        elif self.scatter is not None and not scatter.local_only(metadata):
            sessions, last = await self.scatter.list(
                functools.partial(
                    queries.local_sessions,
                    self.store,
                    self.ownership,
                    query=query,
                    filter_text=request.filter,
                ),
                after.decode(),
                prefix,
                size,
                metadata,
                context.time_remaining(),
                filter_text=request.filter,
            )
            cursor = last.encode()
        else:
            sessions, cursor = queries.local_page(
                self.store, self.ownership, after, listing, query, size
            )
        token = encode_listing_token(cursor, listing) if cursor else ""
        response = pb.ListSessionsResponse(
            sessions=sessions, next_page_token=token, usage_total=ledger.page_total(sessions)
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
        self.ownership.check(request.parent_session_id)
        # No id asked for: sharded, one made up here, in the parent's group (the store's own
        # would lie anywhere); unsharded, "" (the store makes one up). Either way inside the
        # caller's token prefix, where the caller may use it.
        principal = access.principal_of(self.authorizer, context)
        under = "" if principal is None else principal.session_prefix
        target = request.session_id or self.ownership.fork_id(under)
        self.ownership.check_fork(request.parent_session_id, target)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.parent_session_id, target)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        result = await self.store.commit_fork(
            request.parent_session_id,
            at_seq,
            target,
            lease_holder=request.lease_holder,
            lease_token=request.lease_token,
            request_id=request.request_id,
            generated_id=not request.session_id,
        )
        await self._replicated(result.position)
        session = session_message(result.session_id, result.meta, result.lease, result.record)
        return _serialize(pb.ForkSessionResponse(session=session))

    # -- erasure (storage.erasure) -------------------------------------------------------------

    @unary_write
    async def delete_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.DeleteSessionRequest, raw)
        self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id)
        if request.force:
            access.require_admin(self.authorizer, context, "a forced delete")
        # The feed scan reads every record: off the loop, beside the writer.
        command = await asyncio.to_thread(
            self.store.delete_command,
            request.session_id,
            expected_seq=request.expected_seq if request.HasField("expected_seq") else None,
            lease_holder=request.lease_holder,
            force=request.force,
            actor=access.actor(self.authorizer, context),
            reason=request.reason,
        )
        result = await self.store.commit_delete(command)
        await self._replicated(result.position)
        session = session_message(result.session_id, result.meta, result.lease, result.record)
        reply = pb.DeleteSessionResponse(
            session=session, event_count=result.event_count, position=result.position
        )
        return _serialize(reply)

    @unary_write
    async def redact_events(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.RedactEventsRequest, raw)
        self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id)
        command = await asyncio.to_thread(
            self.store.redact_command,
            request.session_id,
            list(request.seqs),
            reason=request.reason,
            lease_holder=request.lease_holder,
            actor=access.actor(self.authorizer, context),
        )
        result = await self.store.writer.submit_on_loop(command)
        await self._replicated(result.position)
        position = result.position if result.seqs else 0  # the proto: 0 when nothing changed
        return _serialize(pb.RedactEventsResponse(seqs=result.seqs, position=position))

    @unary_write
    async def import_session(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ImportSessionRequest, raw)
        copy = _is_move_copy(context)
        if copy:  # a slot move fills the slot's next owner (shard.move)
            self.ownership.check_copy(request.session_id, request.first_seq)
            access.require_admin(self.authorizer, context, "a slot move's copy")
        else:
            self.ownership.check_write(request.session_id)
        self._require_primary(context)
        # The parent link too, as CreateSession's: a tenant must not hang a session under
        # another tenant's (it would count in that session's tree usage and children).
        parent = [request.parent_session_id] if request.parent_session_id else []
        access.scope(self.authorizer, context, request.session_id, *parent)
        if importing.has_extras(request):
            access.require_admin(
                self.authorizer, context, "importing request records, a lease or its audit"
            )
        self._check_count(len(request.events))
        batch = importing.prepare_import(request, self.store.config.limits, moving_in=copy)
        result = await self.store.commit_import(batch)
        await self._replicated(result.position)
        reply = pb.ImportSessionResponse(
            session=session_message(request.session_id, result.meta, result.lease, result.record),
            imported_count=len(result.events),
        )
        return _serialize(reply)

    @unary
    async def get_session_records(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.GetSessionRecordsRequest, raw)
        self.ownership.check(request.session_id)
        access.scope(self.authorizer, context, request.session_id)
        access.require_admin(
            self.authorizer, context, "reading a session's request records and lease"
        )
        fold.check_session_id(request.session_id)
        found = self.store.session_records(request.session_id)
        lease = (
            found.lease if found.lease is not None and found.lease.live(time.time_ns()) else None
        )
        reply = pb.GetSessionRecordsResponse(
            session=session_message(request.session_id, found.meta, lease, found.record),
            request_records=[importing.request_message(i, r) for i, r in found.requests],
            lease_audit=[audit_message(record) for record in found.audit],
        )
        if found.lease is not None:
            reply.lease.CopyFrom(importing.lease_record_message(found.lease))
        return self._fitting(_serialize(reply), request.session_id)

    @unary_write
    async def acquire_lease(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        lease = await self._extend_lease("acquire", pb.AcquireLeaseRequest, raw, context)
        return _serialize(pb.AcquireLeaseResponse(lease=lease))

    @unary_write
    async def renew_lease(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        lease = await self._extend_lease("renew", pb.RenewLeaseRequest, raw, context)
        return _serialize(pb.RenewLeaseResponse(lease=lease))

    async def _extend_lease(
        self,
        action: str,
        request_type: type[pb.AcquireLeaseRequest] | type[pb.RenewLeaseRequest],
        raw: bytes,
        context: grpc.aio.ServicerContext,
    ) -> pb.Lease:
        """Acquire or renew: the same request shape, the same checks, a new expiry."""
        request = decode(request_type, raw)
        self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id)
        change = await self.store.commit_lease(
            action, request.session_id, request.holder, _ttl_ns(request)
        )
        await self._replicated(change.position)
        return lease_message(change.lease)

    @unary_write
    async def release_lease(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.ReleaseLeaseRequest, raw)
        self.ownership.check_write(request.session_id)
        self._require_primary(context)
        access.scope(self.authorizer, context, request.session_id, admin=request.force)
        change = await self.store.commit_lease(
            "release", request.session_id, request.holder, force=request.force
        )
        await self._replicated(change.position)
        response = pb.ReleaseLeaseResponse()
        if change.lease is not None:
            response.released.CopyFrom(lease_message(change.lease))
        return _serialize(response)


RECENT_BATCHES = 64
"""Since batches kept for followers waking at the same seq (each at most SINCE_BATCH_BYTES)."""
SINCE_BATCH_BYTES = 256 << 10
"""Since sends whatever is ready in responses of about this size (a few hundred events)."""
FRAMING_BYTES = 1024
"""Room for a response's own fields around its events."""
STORED_EVENT_OVERHEAD = 16
"""Bytes an event may gain on the way out: its seq field and its length prefix."""
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
DEFAULT_LEASE_TTL_NS = 30 * 1_000_000_000


def _is_move_copy(context: grpc.aio.ServicerContext) -> bool:
    """The call carries MOVE_HEADER: a slot move's copy (see ``Ownership.check_copy``)."""
    for key, value in context.invocation_metadata() or ():
        if key == MOVE_HEADER:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text == MOVE_COPY
    return False


def _ttl_ns(request: pb.AcquireLeaseRequest | pb.RenewLeaseRequest) -> int:
    if not request.HasField("ttl"):
        return DEFAULT_LEASE_TTL_NS
    ttl: int = request.ttl.ToNanoseconds()
    return ttl


def listing_order(order_by: str) -> str:
    """The listing order an order_by names, or InvalidOrderBy."""
    spelled = " ".join(order_by.split())
    if spelled in ("", BY_ID, f"{BY_ID} asc"):
        return BY_ID
    if spelled == BY_UPDATE:
        return BY_UPDATE
    raise errors.InvalidOrderBy(
        f'order_by {order_by[:60]!r} is not offered; use "session_id" (the default) or '
        '"update_time desc"',
        order_by=order_by[:60],
    )
