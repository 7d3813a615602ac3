"""The session log's use cases: what each SessionLogService call does, once, for every front end.

The gRPC servicer decodes a request, calls one use case and encodes what it returns (as etcd's
``v3rpc`` does over ``etcdserver``); the web console calls the same ones for its pages (listing
sessions, reading one, its state and transcript). Use cases take the caller's principal (None
with auth off) and plain values (ids, numbers, the fields of a decoded request) and return the
store's results; they know no transport: no grpc, no HTTP, no reply encoding, no message size.

Every check of a call is made here, before anything is read or written, in one order: the
group owns the session (``Ownership``), this server takes writes (for a write), the caller's
token admits it (``access``), and the request is well formed (``fold.check_session_id``, the
limits). A refusal raises its ``errors.SessionLogError`` and changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf.struct_pb2 import Struct

from sessionlog import errors, fold, mirrors, records
from sessionlog.cluster.sync import SyncTracker
from sessionlog.listing import Listing, decode_listing_token, encode_listing_token, order
from sessionlog.records import SessionRecord, parse_filter
from sessionlog.service import access, expiration, importing, paging, queries
from sessionlog.service.auth import Principal
from sessionlog.shard import scatter as scattering
from sessionlog.shard.ownership import Ownership
from sessionlog.storage import leadership, schema
from sessionlog.storage.commands import ForkResult, LeaseChange
from sessionlog.storage.erasure import DeleteResult, RedactResult
from sessionlog.storage.imports import SessionRecords
from sessionlog.storage.ledger import SessionUsage
from sessionlog.storage.records import BY_ID, BY_UPDATE, Updated, given_record
from sessionlog.storage.schema import LeaseRecord
from sessionlog.storage.store import (
    BULK_CHECK_FROM,
    AppendResult,
    EventsPage,
    MessagesPage,
    SessionView,
    Store,
    SurfaceSnapshot,
    prepare_append,
    prepare_seed,
)
from sessionlog.v1 import session_log_service_pb2 as pb

FRAMING_BYTES = 1024
"""Room for a response's own fields around its events."""
STORED_EVENT_OVERHEAD = 16
"""Bytes an event may gain on the way out: its seq field and its length prefix."""
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
DEFAULT_LEASE_TTL_NS = 30 * 1_000_000_000


@dataclass(frozen=True)
class Caller:
    """Who makes a write, as its front end read it from the call."""

    principal: Principal | None = None
    """The caller's token (None: auth is off)."""
    epoch: int = 0
    """The highest leadership epoch of this group the caller says it has seen (0: none)."""
    move_copy: bool = False
    """The call is a slot move's copy into this group (``Ownership.check_copy``)."""


@dataclass(frozen=True)
class SessionQuery:
    """A listing of sessions: ListSessions' fields, or the console's."""

    prefix: str = ""
    filter_text: str = ""
    order_by: str = ""
    """"" or "session_id" (id order), or "update_time desc" (newest update first)."""
    page_size: int = 0
    """0: DEFAULT_PAGE_SIZE; at most MAX_PAGE_SIZE."""
    page_token: str = ""
    """A previous page's ``next_page_token`` (ListSessions)."""
    after: str = ""
    """Or the session id the page starts after (the console's cursor; id order only)."""
    view: int = 0
    """A ``pb.SessionView``: SESSION_VIEW_FULL puts each session's state in the page."""


@dataclass
class SessionPage:
    sessions: list[pb.Session]
    """A sharded listing's page holds other groups' sessions, as their servers sent them."""
    next_page_token: str


@dataclass
class SessionRead:
    view: SessionView
    usage: fold.UsageByModel | None
    """The session's whole-log usage; None when it does not exist."""


@dataclass
class EventsRead:
    page: EventsPage
    next_page_token: str


@dataclass
class MessagesRead:
    snapshot: SurfaceSnapshot
    incremental: bool
    """Only the messages past the view the caller said it holds."""


@dataclass
class MessagesPageRead:
    page: MessagesPage
    replace_generation: int
    """The generation of the view the pages are pinned to (0 for a view at a seq)."""
    next_page_token: str


@dataclass
class Seeded:
    result: AppendResult
    dropped: list[int]
    """The indexes of the messages left out (a role the log has no event for)."""


_LISTING_ORDERS = {(BY_ID, False): BY_ID, (BY_UPDATE.split()[0], True): BY_UPDATE}
"""ListSessions' orders: session id ascending (the default) or update time descending."""


def listing_order(order_by: str) -> str:
    """The listing order an order_by names, or InvalidOrderBy (``listing.order``)."""
    return order(order_by, _LISTING_ORDERS, "ListSessions")


class SessionLog:
    """The use cases over one server's store, its group's ownership and its replication."""

    def __init__(
        self,
        store: Store,
        ownership: Ownership,
        *,
        max_events_per_append: int,
        max_message_bytes: int,
        sync: SyncTracker | None = None,
        primary: str = "",
    ) -> None:
        self.store = store
        self.ownership = ownership
        self.max_events_per_append = max_events_per_append
        self.max_message_bytes = max_message_bytes
        self.sync = sync
        """With --ack replica: every write returns once enough replicas hold it."""
        self.primary = primary
        """Set on a replica: the primary that takes the writes refused here."""
        self.refusal: Callable[[], errors.NotPrimary | None] | None = None
        """A cluster member's process-level answer (``cluster.member``): the NOT_PRIMARY a
        write gets while the member does not lead with a live lease, else None."""
        self.scatter: scattering.Scatter | None = None
        """Set on a sharded server: a listing answers for every group (``shard.scatter``)."""

    # -- checks --------------------------------------------------------------------------------

    def reading(self, principal: Principal | None, session_id: str) -> None:
        """The checks of every read of one session: owned here, admitted, a valid id."""
        self.ownership.check(session_id)
        access.scope(principal, session_id)
        fold.check_session_id(session_id)

    def followed(self, principal: Principal | None, prefix: str) -> Callable[[str], bool]:
        """The checks of FollowSessions, and which sessions it then carries: those under the
        asked prefix narrowed to the caller's token, of this group's own."""
        self.ownership.check()  # sharded: a map must be held to know which are mine
        narrowed = access.listing_prefix(principal, prefix)
        owns = self.ownership.owns

        def admits(session_id: str) -> bool:
            return session_id.startswith(narrowed) and owns(session_id)

        return admits

    def _writing(self, caller: Caller, session_id: str, *others: str) -> None:
        """The checks of a write to ``session_id`` (``others``: sessions it also names, which
        the caller's token must admit too)."""
        self.ownership.check_write(session_id)
        self._require_primary(caller.epoch)
        access.scope(caller.principal, session_id, *others)

    def _copying(self, caller: Caller, session_id: str, expected_seq: int | None) -> None:
        """The ownership checks of a write that may be a slot move's copy (admin only)."""
        if caller.move_copy:
            self.ownership.check_copy(session_id, expected_seq)
            access.require_admin(caller.principal, "a slot move's copy")
        else:
            self.ownership.check_write(session_id)
        self._require_primary(caller.epoch)

    def _require_primary(self, seen: int) -> None:
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
        if leadership.behind(lead, seen) is not None:
            # The writer's copy may predate a commit by another worker (a fresh store's first
            # write takes epoch 1): decide by the record as committed now.
            behind = leadership.behind(self.store.leadership(), seen)
            if behind is not None:
                raise behind

    def _check_count(self, count: int) -> None:
        if count > self.max_events_per_append:
            raise errors.TooManyEvents(
                f"{count} events in one call; the limit is {self.max_events_per_append} "
                "(--max-events-per-append): split the batch",
                count=count,
                limit=self.max_events_per_append,
            )

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

    async def _replicated(self, position: int) -> None:
        """With --ack replica, wait until enough replicas hold the change at ``position`` (or
        raise ReplicasUnavailable: the write stays committed here). Every write calls it."""
        sync = self.sync
        if sync is not None and sync.required:
            await sync.wait(position)

    def _sid(self, session_id: str) -> int:
        """The session's internal id (0: not stored), which a page token is bound to."""
        return self.store.log_number(session_id)

    # -- reads ---------------------------------------------------------------------------------

    def session(self, principal: Principal | None, session_id: str) -> SessionRead:
        """A session's metadata, lease, record and audit, with its usage (GetSession)."""
        self.reading(principal, session_id)
        view = self.store.session(session_id)
        usage = None
        if view.meta is not None:
            usage = self.store.usage_of([view.session_id])[view.session_id]
        return SessionRead(view, usage)

    def surface(
        self, principal: Principal | None, session_id: str, at_seq: int | None
    ) -> SurfaceSnapshot:
        self.reading(principal, session_id)
        return self.store.surface(session_id, at_seq)

    def state(
        self, principal: Principal | None, session_id: str, at_seq: int | None = None
    ) -> tuple[Struct, int]:
        """The session's state after its log (to ``at_seq``) and the count of events read."""
        self.reading(principal, session_id)
        return self.store.state(session_id, at_seq)

    def usage(
        self,
        principal: Principal | None,
        session_id: str,
        at_seq: int | None,
        include_descendants: bool,
    ) -> SessionUsage:
        self.reading(principal, session_id)
        if at_seq is not None and include_descendants:
            raise errors.MalformedRequest(
                "at_seq and include_descendants cannot be combined: a descendant's log has no "
                "place in its ancestor's seqs; ask for one or the other",
                field="at_seq",
            )
        return self.store.usage(
            session_id,
            at_seq,
            include_descendants=include_descendants,
            # A tenant's tree stops at its prefix: a fork another token made outside it is not
            # the tenant's to read.
            admits=None if principal is None else principal.admits,
        )

    def messages(
        self,
        principal: Principal | None,
        session_id: str,
        at_seq: int | None = None,
        known: tuple[int, int] | None = None,
    ) -> MessagesRead:
        """The derived messages of the whole view; with ``known`` (an event count and replace
        generation the caller holds) only those past it when that view still stands."""
        self.reading(principal, session_id)
        folded = None
        if at_seq is None and known is not None:
            folded = self.store.derive_tail(session_id, *known)
        if folded is not None:
            return MessagesRead(folded, incremental=True)
        return MessagesRead(self.store.surface(session_id, at_seq, messages=True), False)

    def messages_page(
        self,
        principal: Principal | None,
        session_id: str,
        at_seq: int | None,
        page_size: int,
        page_token: str,
    ) -> MessagesPageRead:
        """The last ``page_size`` messages of a pinned view (see ``Store.derive_page``), fewer
        when they would not fit in one reply, and the token of the page before them."""
        self.reading(principal, session_id)
        size = paging.page_size(page_size)
        sid = self._sid(session_id)
        cursor = None
        if page_token:
            cursor = paging.MessagesCursor.decode(page_token, session_id, at_seq, sid)
        page = self.store.derive_page(
            session_id,
            size,
            at_seq=at_seq,
            pinned=None if cursor is None else cursor.pinned,
            before=None if cursor is None else cursor.before,
            resume=None if cursor is None else cursor.walk,
            max_bytes=self.max_message_bytes - FRAMING_BYTES,
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
        return MessagesPageRead(page, generation, token)

    def events(
        self,
        principal: Principal | None,
        session_id: str,
        page_size: int,
        order_by: str,
        page_token: str,
    ) -> EventsRead:
        """One page of stored events, oldest or newest first, within one reply's bytes."""
        self.reading(principal, session_id)
        size = paging.page_size(page_size)
        desc = paging.descending(order_by)
        kind = paging.DESCENDING if desc else paging.ASCENDING
        sid, cursor = 0, None
        if page_token:
            sid = self._sid(session_id)
            (cursor,) = paging.decode(page_token, kind, session_id, "ListEvents", sid=sid)
        budget = self.max_message_bytes - FRAMING_BYTES - STORED_EVENT_OVERHEAD * size
        page = self.store.list_events(session_id, cursor, size, descending=desc, max_bytes=budget)
        if page_token and page.log_number != sid:  # written again since the token's check
            raise paging.invalid("ListEvents", session_id)
        sid = page.log_number  # a first page's token binds the log it read, in its transaction
        if desc:
            after = page.first_seq - len(page.events) + 1  # the oldest seq of this page
            more = bool(page.events) and after > 0
        else:
            after = page.first_seq + len(page.events)  # the next seq to read
            more = after < page.next_seq
        token = paging.encode(kind, session_id, after, sid=sid) if more else ""
        return EventsRead(page, token)

    def session_records(
        self, principal: Principal | None, session_id: str
    ) -> tuple[SessionRecords, LeaseRecord | None]:
        """What a session holds besides its events (admin only), and its lease while live."""
        self.ownership.check(session_id)
        access.scope(principal, session_id)
        access.require_admin(principal, "reading a session's request records and lease")
        fold.check_session_id(session_id)
        found = self.store.session_records(session_id)
        if found.lease is not None and not found.lease.live(time.time_ns()):
            return found, None
        return found, found.lease

    async def list_sessions(
        self,
        principal: Principal | None,
        query: SessionQuery,
        forward: Sequence[tuple[str, Any]] = (),
        within: float | None = None,
    ) -> SessionPage:
        """A page of the caller's sessions with their usage; on a sharded server every group's
        (``shard.scatter``, asked with ``forward``, the caller's metadata, within ``within``
        seconds) unless ``forward`` asks for this group's own only. The page fits in one reply
        under --max-message-size (``queries.fitting``): it holds fewer sessions than asked
        for when they are large, and a merged page of several groups is cut the same way."""
        self.ownership.check()  # sharded: a map must be held; the page keeps my group's own
        prefix = access.listing_prefix(principal, query.prefix)
        size = min(query.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        order = listing_order(query.order_by)
        filtered = parse_filter(query.filter_text)
        listing = Listing(prefix, query.filter_text, order)
        after = decode_listing_token(query.page_token, listing) or query.after.encode()
        store, ownership, spread = self.store, self.ownership, self.scatter
        full = query.view == pb.SESSION_VIEW_FULL
        limit = self.max_message_bytes  # a page holds fewer sessions than size rather than more
        if spread is not None and not scattering.local_only(forward) and order == BY_UPDATE:

            def recent(after: bytes, prefix: str, size: int) -> tuple[list[pb.Session], bytes]:
                mine = Listing(prefix, query.filter_text, order)
                return queries.local_page(
                    store, ownership, after, mine, filtered, size, full, limit
                )

            sessions, cursor = await spread.list_recent(
                recent,
                after,
                prefix,
                size,
                forward,
                within,
                filter_text=query.filter_text,
                view=query.view,
            )
            kept = queries.fitting(sessions, limit)
            if kept < len(sessions):
                del sessions[kept:]
                cursor = scattering.recent_key(sessions[-1])
        elif spread is not None and not scattering.local_only(forward):

            def local(after: str, prefix: str, size: int) -> tuple[list[pb.Session], str]:
                return queries.local_sessions(
                    store, ownership, after, prefix, size, filtered, query.filter_text, full, limit
                )

            sessions, last = await spread.list(
                local,
                after.decode(),
                prefix,
                size,
                forward,
                within,
                filter_text=query.filter_text,
                view=query.view,
            )
            kept = queries.fitting(sessions, limit)
            if kept < len(sessions):
                del sessions[kept:]
                last = sessions[-1].session_id
            cursor = last.encode()
        else:
            sessions, cursor = queries.local_page(
                store, ownership, after, listing, filtered, size, full, limit
            )
        token = encode_listing_token(cursor, listing) if cursor else ""
        return SessionPage(sessions, token)

    # -- writes --------------------------------------------------------------------------------

    async def append(self, caller: Caller, request: pb.AppendRequest) -> AppendResult:
        return await self.acknowledged(self.submit_append(caller, request))

    def submit_append(
        self, caller: Caller, request: pb.AppendRequest
    ) -> asyncio.Future[AppendResult]:
        """Append's checks, then its command queued to the writer, before this returns: calls
        made one after another reach the writer in that order (AppendStream relies on it), and
        each one's future holds its result once durable (``acknowledged`` waits for that)."""
        expected = request.expected_seq if request.HasField("expected_seq") else None
        self._copying(caller, request.session_id, expected)
        access.scope(caller.principal, request.session_id)
        self._check_count(len(request.events))
        # Many events: their bytes taken from the request's in one piece (each one's otherwise).
        many = len(request.events) >= BULK_CHECK_FROM
        batch = prepare_append(
            request.session_id,
            request.events,
            limits=self.store.config.limits,
            expected_seq=expected,
            request_id=request.request_id,
            lease_holder=request.lease_holder,
            lease_token=request.lease_token,
            lenient=request.lenient,
            keep_redacted=caller.move_copy,
            serialized=mirrors.event_bodies(request) if many else None,
        )
        batch.moving_in = caller.move_copy
        if request.HasField("title"):
            records.check(SessionRecord(title=request.title))
            batch.title = request.title
        batch.expected_uid = request.expected_uid
        self._check_reply_fits(batch.bodies)
        return self.store.commit_append(batch)

    async def acknowledged(self, submitted: Awaitable[AppendResult]) -> AppendResult:
        """A submitted append's result once it may be acknowledged: durable here, and held by
        enough replicas with --ack replica."""
        result = await submitted
        sync = self.sync
        if sync is not None and sync.required:  # --ack local: no coroutine to wait on at all
            await sync.wait(result.position)
        return result

    async def create_session(
        self, caller: Caller, request: pb.CreateSessionRequest
    ) -> AppendResult:
        parent = request.parent_session_id
        if parent:
            self.ownership.check_fork(parent, request.session_id)
        self._writing(caller, request.session_id, *([parent] if parent else []))
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
        return result

    async def update_session(
        self, caller: Caller, request: pb.UpdateSessionRequest
    ) -> tuple[Updated, SessionView]:
        """The update as committed, and the session as read after it (for its lease)."""
        given = request.session
        session_id = given.session_id
        self._writing(caller, session_id)
        fold.check_session_id(session_id)
        record = SessionRecord(given.title, dict(given.labels), given.owner, given.status)
        paths = list(request.update_mask.paths) if request.HasField("update_mask") else None
        if paths is not None:
            paths = expiration.update_paths(given, record, paths)
        updated = await self.store.commit_update(session_id, record, paths)
        await self._replicated(updated.position)
        return updated, self.store.session(session_id)

    async def seed_session(self, caller: Caller, request: pb.SeedSessionRequest) -> Seeded:
        self._writing(caller, request.session_id)
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
        return Seeded(result, list(dropped))

    async def fork_session(self, caller: Caller, request: pb.ForkSessionRequest) -> ForkResult:
        self.ownership.check(request.parent_session_id)
        # No id asked for: sharded, one made up here, in the parent's group (the store's own
        # would lie anywhere); unsharded, "" (the store makes one up). Either way inside the
        # caller's token prefix, where the caller may use it.
        target = request.session_id or self.ownership.fork_id(access.under(caller.principal))
        self.ownership.check_fork(request.parent_session_id, target)
        self._require_primary(caller.epoch)
        access.scope(caller.principal, request.parent_session_id, target)
        result = await self.store.commit_fork(
            request.parent_session_id,
            request.at_seq if request.HasField("at_seq") else None,
            target,
            lease_holder=request.lease_holder,
            lease_token=request.lease_token,
            request_id=request.request_id,
            generated_id=not request.session_id,
        )
        await self._replicated(result.position)
        return result

    async def delete_session(
        self, caller: Caller, request: pb.DeleteSessionRequest
    ) -> DeleteResult:
        self._writing(caller, request.session_id)
        if request.force:
            access.require_admin(caller.principal, "a forced delete")
        # The feed scan reads every record: off the loop, beside the writer.
        command = await asyncio.to_thread(
            self.store.delete_command,
            request.session_id,
            expected_seq=request.expected_seq if request.HasField("expected_seq") else None,
            lease_holder=request.lease_holder,
            force=request.force,
            actor=access.actor(caller.principal),
            reason=request.reason,
        )
        result = await self.store.commit_delete(command)
        await self._replicated(result.position)
        return result

    async def redact_events(self, caller: Caller, request: pb.RedactEventsRequest) -> RedactResult:
        self._writing(caller, request.session_id)
        command = await asyncio.to_thread(
            self.store.redact_command,
            request.session_id,
            list(request.seqs),
            reason=request.reason,
            lease_holder=request.lease_holder,
            actor=access.actor(caller.principal),
        )
        result: RedactResult = await self.store.writer.submit_on_loop(command)
        await self._replicated(result.position)
        return result

    async def import_session(
        self, caller: Caller, request: pb.ImportSessionRequest
    ) -> AppendResult:
        self._copying(caller, request.session_id, request.first_seq)
        # The parent link too, as CreateSession's: a tenant must not hang a session under
        # another tenant's (it would count in that session's tree usage and children).
        parent = [request.parent_session_id] if request.parent_session_id else []
        access.scope(caller.principal, request.session_id, *parent)
        if importing.has_extras(request):
            access.require_admin(
                caller.principal, "importing request records, a lease or its audit"
            )
        self._check_count(len(request.events))
        batch = importing.prepare_import(
            request, self.store.config.limits, moving_in=caller.move_copy
        )
        result = await self.store.commit_import(batch)
        await self._replicated(result.position)
        return result

    async def lease(
        self,
        caller: Caller,
        action: str,
        session_id: str,
        holder: str,
        ttl_ns: int = DEFAULT_LEASE_TTL_NS,
        force: bool = False,
    ) -> LeaseChange:
        """Acquire, renew or release (``action``) a session's lease; a forced release needs
        admin."""
        self.ownership.check_write(session_id)
        self._require_primary(caller.epoch)
        access.scope(caller.principal, session_id, admin=force)
        if action == "release":
            change = await self.store.commit_lease(action, session_id, holder, force=force)
        else:
            change = await self.store.commit_lease(action, session_id, holder, ttl_ns)
        await self._replicated(change.position)
        return change
