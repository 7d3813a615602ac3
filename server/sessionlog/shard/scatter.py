"""ListSessions across groups: ask one member of every other group, merge by session id.

On a sharded server (a shard map installed) a listing answers for the whole cluster, so that
``sessionlog sessions``, the console and any client see every session through any server (or
through HAProxy, which sends calls without ``x-session-id`` to a default group)::

    caller ──ListSessions──▶ server of g1 ──┬── its own store          (g1)
                                            ├── ListSessions, scope group ──▶ a member of g2
                                            └── ListSessions, scope group ──▶ a member of g3

Invariants:

- Page tokens are the unsharded server's own (``sessionlog.listing``): the last id of the page,
  bound to the listing's prefix. Every group lists its first ``size`` sessions after that id
  and the merge keeps the first ``size`` of their union in id order, up to the point every
  group has answered for (``merge``). A token is therefore a point in the one id order every
  group shares: it stays valid across writes and across groups, and no session is listed
  twice or skipped (one created behind the cursor meanwhile is not listed, as unsharded).
- Newest first (``order_by: "update_time desc"``, ``list_recent``): the same, in the order of
  the store's ``recent`` keys, (update time desc, id), which every group shares too: each group
  lists after the cursor key, and ``merge_recent`` keeps the first ``size`` up to the earliest
  key every group has answered for. A session updated meanwhile moves, as unsharded.
- Each session is listed by the group that owns its slot in this server's map only: a copy a
  group holds without owning it (a slot on the move) is not listed.
- No recursion: a forwarded call carries ``x-sessionlog-scope: group`` (SCOPE_HEADER), and a
  server that receives it answers from its own store (``local_only``). Any caller may send it
  to list one group.
- All or nothing: a group none of whose members answers within GROUP_DEADLINE_SECONDS fails
  the call UNAVAILABLE / GROUP_UNAVAILABLE (metadata ``group``, ``members``), never a list
  with a group missing. A member's refusal that is no outage (PERMISSION_DENIED, ...) is the
  caller's error, raised as it came.
- Tenant scoping holds in every group: the caller's ``authorization`` metadata goes along and
  every group narrows the prefix to the token's again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import grpc
from google.rpc import error_details_pb2, status_pb2

from sessionlog import errors
from sessionlog.listing import Listing, decode_listing_token, encode_listing_token
from sessionlog.shard.shardmap import Group, ShardMap
from sessionlog.storage import schema
from sessionlog.v1 import session_log_service_pb2 as pb

SCOPE_HEADER = "x-sessionlog-scope"
"""Request metadata: ``group`` asks for this server's own sessions only (no fan-out)."""
SCOPE_GROUP = "group"
FORWARDED_HEADERS = ("authorization",)
"""The caller's metadata a forwarded listing carries: its bearer token, so scoping applies."""
GROUP_DEADLINE_SECONDS = 5.0
"""The longest a listing waits for one group, over all of its members."""
MEMBER_DEADLINE_SECONDS = 2.0
"""The longest one member may take before the next member is asked."""
LIST_METHOD = "/sessionlog.v1.SessionLogService/ListSessions"

Local = Callable[[str, str, int], tuple[list[pb.Session], str]]
"""This server's own listing: (after, prefix, limit) -> (sessions in id order, where its next
page starts after: "" when nothing follows)."""
PrimaryOf = Callable[[Group], str]
Dial = Callable[[str], grpc.aio.Channel]


def local_only(metadata: Iterable[tuple[str, Any]] | None) -> bool:
    """The call asks for this server's own sessions only (``x-sessionlog-scope: group``)."""
    for key, value in metadata or ():
        if key == SCOPE_HEADER:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text == SCOPE_GROUP
    return False


def forwarded(metadata: Iterable[tuple[str, Any]] | None) -> tuple[tuple[str, str], ...]:
    """The metadata a forwarded listing carries: the caller's token and the scope header."""
    kept = [(k, str(v)) for k, v in metadata or () if k in FORWARDED_HEADERS]
    return (*kept, (SCOPE_HEADER, SCOPE_GROUP))


@dataclass(frozen=True)
class Answer:
    """One group's page: its sessions after the cursor, in id order, and the id its next page
    starts after ("" when it has no more)."""

    group: str
    sessions: Sequence[pb.Session]
    last: str


class Merged(NamedTuple):
    sessions: list[pb.Session]
    last: str
    """Where the next page starts after ("" when nothing follows)."""


def merge(answers: Sequence[Answer], size: int, owner: Callable[[str], str]) -> Merged:
    """The first ``size`` sessions of all groups' answers, each listed by its owner only.

    A group that has more answered for the ids up to its ``last`` only; past the smallest such
    id nothing is known yet, so the page ends there at the latest, and the next one starts
    after it (even when that id itself is not listed: a copy its group does not own)."""
    bound: str | None = None
    for answer in answers:
        if answer.last and (bound is None or answer.last < bound):
            bound = answer.last
    candidates = sorted(
        (
            s
            for answer in answers
            for s in answer.sessions
            if owner(s.session_id) == answer.group and (bound is None or s.session_id <= bound)
        ),
        key=lambda s: s.session_id,
    )
    kept = candidates[:size]
    if len(candidates) > size:
        return Merged(kept, kept[-1].session_id)
    return Merged(kept, bound or "")


RecentPage = tuple[list[pb.Session], bytes]
"""Sessions newest first, and the cursor the next page starts after (b"": none)."""
Recent = Callable[[bytes, str, int], RecentPage]
"""This server's own listing newest first: (after cursor, prefix, limit) -> (sessions in
(update_time desc, id) order, the cursor its next page starts after: b"" when nothing follows).
A cursor is the session's key in the store's ``recent`` index (``schema.recent_key``)."""


@dataclass(frozen=True)
class RecentAnswer:
    """One group's page newest first, and the cursor its next page starts after (b"": none)."""

    group: str
    sessions: Sequence[pb.Session]
    last: bytes


def recent_key(session: pb.Session) -> bytes:
    """Where a listed session stands in the newest-first order every group shares."""
    return schema.recent_key(session.update_time.ToNanoseconds(), session.session_id)


def merge_recent(
    answers: Sequence[RecentAnswer], size: int, owner: Callable[[str], str]
) -> RecentPage:
    """``merge`` for the newest-first order: by (update_time desc, id), up to the earliest
    point every group has answered for."""
    bound: bytes | None = None
    for answer in answers:
        if answer.last and (bound is None or answer.last < bound):
            bound = answer.last
    keyed = sorted(
        (
            (recent_key(s), s)
            for answer in answers
            for s in answer.sessions
            if owner(s.session_id) == answer.group
        ),
        key=lambda pair: pair[0],
    )
    candidates = [(k, s) for k, s in keyed if bound is None or k <= bound]
    kept = candidates[:size]
    if len(candidates) > size:
        return [s for _, s in kept], kept[-1][0]
    return [s for _, s in kept], bound or b""


class Held(Protocol):
    """What a listing reads of the server's ownership (``shard.ownership.Ownership``)."""

    @property
    def sharded(self) -> bool: ...

    @property
    def map(self) -> ShardMap | None: ...

    @property
    def group(self) -> str: ...

    def primary_of(self, group: Group) -> str: ...

    def unavailable(self) -> errors.SessionLogError: ...


def for_ownership(ownership: Held, dial: Dial) -> Scatter | None:
    """The cluster-wide listing of a server with --shard-map; None without one (unsharded: a
    listing is the store's)."""
    if not ownership.sharded:
        return None

    def current() -> tuple[ShardMap, str]:
        shard_map = ownership.map
        if shard_map is None or not shard_map.has_group(ownership.group):
            raise ownership.unavailable()
        return shard_map, ownership.group

    return Scatter(current, ownership.primary_of, dial)


class Scatter:
    """The cluster-wide listing of a sharded server; see the module docstring."""

    def __init__(
        self, current: Callable[[], tuple[ShardMap, str]], primary_of: PrimaryOf, dial: Dial
    ) -> None:
        self._current = current
        """The held map and my group's name in it (raises when no map is held)."""
        self._primary_of = primary_of
        self._dial = dial
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def list(
        self,
        local: Local,
        after: str,
        prefix: str,
        size: int,
        metadata: Iterable[tuple[str, Any]] | None,
        within: float | None = None,
        filter_text: str = "",
        view: int = 0,
    ) -> Merged:
        """Up to ``size`` sessions of every group after ``after`` whose id starts with
        ``prefix`` (already narrowed to the caller's token), merged in id order; within
        ``within`` seconds (the caller's deadline) when that is sooner than
        GROUP_DEADLINE_SECONDS. ``filter_text`` (a ListSessions filter) goes to every group,
        which applies it to its own sessions; ``local`` applies it already. ``view`` (a
        ``pb.SessionView``) goes to every group too: each folds its own sessions' state."""
        shard_map, mine = self._current()
        sent = forwarded(metadata)
        others = [g for g in shard_map.groups if g.name != mine]
        wait = GROUP_DEADLINE_SECONDS if within is None else min(within, GROUP_DEADLINE_SECONDS)
        ends = time.monotonic() + wait
        pages = await asyncio.gather(
            *(
                self._ask(group, after, prefix, size, sent, ends, filter_text, view)
                for group in others
            )
        )
        answers = [Answer(mine, *local(after, prefix, size)), *pages]
        return merge(answers, size, lambda session_id: shard_map.owner(session_id).name)

    async def list_recent(
        self,
        local: Recent,
        after: bytes,
        prefix: str,
        size: int,
        metadata: Iterable[tuple[str, Any]] | None,
        within: float | None = None,
        filter_text: str = "",
        view: int = 0,
    ) -> RecentPage:
        """``list`` in the newest-first order (ListSessions' "update_time desc"), merged by
        (update_time desc, id); ``after`` and the cursor returned are ``recent`` keys."""
        shard_map, mine = self._current()
        sent = forwarded(metadata)
        others = [g for g in shard_map.groups if g.name != mine]
        wait = GROUP_DEADLINE_SECONDS if within is None else min(within, GROUP_DEADLINE_SECONDS)
        ends = time.monotonic() + wait

        async def ask(group: Group) -> RecentAnswer:
            listing = Listing(prefix, filter_text, "update_time desc")
            token = encode_listing_token(after, listing) if after else ""
            request = pb.ListSessionsRequest(
                prefix=prefix,
                page_size=size,
                page_token=token,
                filter=filter_text,
                order_by=listing.order,
                view=view,  # type: ignore[arg-type]
            )
            reply = await self._call(group, request.SerializeToString(), sent, ends)
            last = decode_listing_token(reply.next_page_token, listing)
            return RecentAnswer(group.name, list(reply.sessions), last)

        pages = await asyncio.gather(*(ask(group) for group in others))
        answers = [RecentAnswer(mine, *local(after, prefix, size)), *pages]
        return merge_recent(answers, size, lambda session_id: shard_map.owner(session_id).name)

    async def _ask(
        self,
        group: Group,
        after: str,
        prefix: str,
        size: int,
        metadata: tuple[tuple[str, str], ...],
        ends: float,
        filter_text: str = "",
        view: int = 0,
    ) -> Answer:
        """One group's page from its primary, else from its other members in turn, by
        ``ends`` (``time.monotonic``)."""
        listing = Listing(prefix, filter_text, "session_id")
        request = pb.ListSessionsRequest(
            prefix=prefix,
            page_size=size,
            page_token=encode_listing_token(after.encode(), listing) if after else "",
            filter=filter_text,
            view=view,  # type: ignore[arg-type]
        ).SerializeToString()
        reply = await self._call(group, request, metadata, ends)
        last = decode_listing_token(reply.next_page_token, listing).decode()
        return Answer(group.name, list(reply.sessions), last)

    async def _call(
        self,
        group: Group,
        request: bytes,
        metadata: tuple[tuple[str, str], ...],
        ends: float,
    ) -> pb.ListSessionsResponse:
        """One group's ListSessions reply from its primary, else from its other members in
        turn, by ``ends`` (``time.monotonic``)."""
        primary = self._primary_of(group)
        order = list(dict.fromkeys([primary, *group.members] if primary else group.members))
        failures: list[str] = []
        for address in order:
            left = ends - time.monotonic()
            if left <= 0:
                break
            channel = self._channel(address)
            try:
                raw = await channel.unary_unary(LIST_METHOD)(
                    request, timeout=min(left, MEMBER_DEADLINE_SECONDS), metadata=metadata
                )
            except grpc.aio.AioRpcError as error:
                refusal = _refusal(error)
                if refusal is not None:
                    raise refusal from None
                failures.append(f"{address}: {error.code().name}")
                await self._forget(address, channel)
                continue
            return pb.ListSessionsResponse.FromString(raw)
        tried = "; ".join(failures) or "no time left"
        raise errors.GroupUnavailable(
            f"no member of group '{group.name}' answered the session listing ({tried}): the "
            "listing would miss that group's sessions; retry once the group is back",
            group=group.name,
            members=",".join(group.members),
        )

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._dial(address)
        return channel

    async def _forget(self, address: str, channel: grpc.aio.Channel) -> None:
        """Drop a failed member's channel: the next listing dials it afresh, at once, instead
        of failing fast until gRPC's reconnect backoff (up to minutes) lets it try again. A
        newer channel another listing dialled meanwhile stays."""
        if address not in self._channels or self._channels[address] is not channel:
            return
        del self._channels[address]
        await channel.close()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


_OUTAGES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""A member failing so is passed over for the next one: it is down, busy or not ready."""


def _refusal(error: grpc.aio.AioRpcError) -> errors.SessionLogError | None:
    """The member's error as the caller's (its reason kept), unless it is an outage."""
    if error.code() in _OUTAGES:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return errors.from_reason(
                        info.reason, error.details() or "", dict(info.metadata)
                    )
    return None
