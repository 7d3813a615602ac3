"""Where a client's calls go: one server, or the primary of a group it knows several members of.

A client keeps one channel per address it knows and a *current* member, the primary as far as
it knows; every call, read or write, goes to the current member (so a client reads its own
writes), and these answers move it:

    NOT_PRIMARY naming a primary      that address becomes current (added if new) and the call
                                      is sent again at once: a refused write wrote nothing, so
                                      this holds for every write RPC, retried or not
    NOT_PRIMARY with no primary       "no primary known": the next address becomes current
                                      (etcd is read first, when given) and the call waits its
                                      backoff before it tries again
    UNAVAILABLE from a member that    the same move; only calls that retry UNAVAILABLE (see
    answered before                   ``Retry``) try again, the others raise as they always did
    UNAVAILABLE from an address that  the next address at once (nothing reached it); when no
    never answered                    address has ever answered and each was tried, the call
                                      fails at once with ``Unavailable`` naming them all
    DEADLINE_EXCEEDED with no answer  a retried unary call moves on as after UNAVAILABLE: a
                                      frozen primary (SIGSTOP, a partition) holds a call until
                                      its deadline, and the group may have a new primary by then

A read stream (since, follow, follow_sessions) also takes every other end the transport gives
it for UNAVAILABLE (``_status.transport_end``: UNKNOWN "Stream removed", INTERNAL or CANCELLED
with no ErrorInfo, when a proxy lost the member behind the stream or a reloaded proxy's old
process stopped); it resumes from its next seq or position, which is safe for a read.

A proxy's HTTP 502/503/504 (``_status.proxy_status``: HAProxy with no primary to send a write
to) is an answer, not an unreachable address: the call waits its backoff and tries again like
any UNAVAILABLE, and raises ``Unavailable`` saying so once its budget is spent.

A follow stream that goes silent moves on as UNAVAILABLE does. Immediate re-sends within one
call are bounded (``hop_limit``); past it each move waits its backoff, and the whole call gives
up after ``Retry.give_up_after`` like any retry.

Epochs. Every write's reply, success or error, carries the server's leadership epoch (trailing
metadata ``sessionlog-epoch``; NOT_PRIMARY also names it in its ``epoch`` metadata). The router
keeps the highest one seen and sends it with every write (request metadata
``sessionlog-epoch``): a server at a lower epoch, a deposed primary that does not know it was
deposed (restarted unfenced after a promotion elsewhere), refuses the write with NOT_PRIMARY and
writes nothing. A member that answers with an epoch below the highest seen is never taken for
the primary:

    NOT_PRIMARY at a lower epoch      its hint is ignored (it names whom that member followed,
                                      which may be deposed too); the next address, at once
    a write acknowledged at a         not an acknowledgement: the member was deposed and what it
    lower epoch (a server too old     stored is on a history the group discards; the call is
    to refuse it)                     sent again elsewhere if it retries, else raises
                                      ``LeadershipLost`` (``committed`` true)

A slot move's refusals (sharded servers) move nothing either: SLOT_MOVING is waited out on
the same member by every call, and WRONG_GROUP too (for ``Retry.wrong_group_for``), unless the
client routes by a shard map (``retry_wrong_group`` False), whose shard routing reroutes it.

REPLICAS_UNAVAILABLE (``--ack replica``) is no reason to move: the write is committed on this
member, the primary. A call that retries sends it again there, with its request id, at most
``Retry.replicas_retries`` times.

With a single address given as a string and no etcd, nothing ever moves: NOT_PRIMARY is raised
and UNAVAILABLE is retried on the same address, as before several addresses existed.
"""

from __future__ import annotations

import asyncio
import enum
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from sessionlog_client import _etcd
from sessionlog_client._common import DEFAULT_TARGET, Retry
from sessionlog_client._shards import WRONG_GROUP, slot_of
from sessionlog_client._status import error_info, proxy_status, transport_end
from sessionlog_client.errors import (
    LeadershipLost,
    NotPrimary,
    ReplicasUnavailable,
    SessionLogError,
    Unavailable,
)

SLOT_MOVING = "SLOT_MOVING"
"""The refusal of a write to a slot whose move is copying its last events (UNAVAILABLE)."""

LOG = "log"
REPLICATION = "replication"
ADMIN = "admin"
"""The keys of ``Member.stubs``: SessionLogService, ReplicationService and AdminService."""
PRIMARY_HINT = "primary"
"""The ErrorInfo metadata key of NOT_PRIMARY that names the primary (empty: none known)."""
EPOCH_GROUP_KEY = "sessionlog-epoch-group"
"""A sharded server's write replies name its group beside its epoch: each group elects its own
leaders, so the router keeps the highest epoch per group, learns which group a session's slot
answered from, and sends a write the epoch of that group, with the group's name (a server of
another group ignores it). Through a proxy that serves several groups one client so never sends
one group's epoch to another; against one group (no group named) it is one epoch, as before."""
EPOCH_KEY = "sessionlog-epoch"
"""The metadata of a server's epoch on every write reply (trailing), and of the highest epoch
a client has seen on every write it sends (request); also NOT_PRIMARY's ErrorInfo key ``epoch``."""
WRITES = frozenset(
    {
        "Append",
        "CreateSession",
        "SeedSession",
        "ForkSession",
        "AcquireLease",
        "RenewLease",
        "ReleaseLease",
        "ImportSession",
        "DeleteSession",
        "RedactEvents",
    }
)
"""The write RPCs: they carry the epoch both ways."""


class Step(enum.Enum):
    """What a call does after a failure."""

    AGAIN = "send it again now, to the member now current"
    LATER = "wait the backoff, then send it again"
    RAISE = "give up: raise the error"


@dataclass(eq=False)
class Member:
    """One address: its channel, the stubs on it, and whether it has ever answered."""

    address: str
    channel: Any
    stubs: dict[str, Any]
    reached: bool = False
    failed: bool = False
    """Tried and unreachable before it ever answered."""
    epoch: int = 0
    """The epoch it named in its latest write reply (0: none yet)."""


@dataclass
class Router:
    """The members a client knows and which one is current; safe to share between threads."""

    addresses: Sequence[str]
    open_member: Callable[[str], tuple[Any, dict[str, Any]]]
    """Opens the channel and stubs of an address (sync or asyncio channels alike)."""
    several: bool
    """False: one address, today's behaviour. True: hints and moves as the docstring says."""
    etcd: tuple[str, ...] = ()
    group: str = ""
    etcd_timeout: float = 3.0
    reached: bool = False
    """Count every member as answered from the start (wait-for-ready: never fail fast)."""
    members: list[Member] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)
    """The highest leadership epoch any member named, per group ("": a server that names no
    group, i.e. not sharded; see the module docstring and EPOCH_GROUP_KEY)."""
    slot_groups: dict[int, str] = field(default_factory=dict)
    """The group each slot's writes last answered from (sharded servers only)."""
    retry_wrong_group: bool = True
    """Wait and try WRONG_GROUP again (a proxy catching up with a move); False in the clients
    of a ``shard_map=`` client, which reroutes it itself."""
    _current: int = 0
    _stale: bool = True
    _etcd_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self) -> None:
        """Open a channel to every given address (once the client can make channels)."""
        for address in self.addresses:
            self._member(address)
        self._stale = bool(self.etcd)

    @property
    def hop_limit(self) -> int:
        return 2 * len(self.members) + 2

    @property
    def target(self) -> str:
        """What error messages name: every address, or the etcd group."""
        names = ", ".join(m.address for m in self.members) or ", ".join(self.addresses)
        if self.etcd:
            group = f"group {self.group!r} in etcd at {','.join(self.etcd)}"
            return f"{group} ({names})" if names else group
        return names

    # -- picking ----------------------------------------------------------------------------------

    def current(self) -> Member | None:
        """The member calls go to now, or None when no address is known (etcd named none)."""
        with self._lock:
            return self.members[self._current] if self.members else None

    def pick(self) -> Member | None:
        """The current member, reading etcd first when it is due (blocking)."""
        if self._due():
            self._discover()
        return self.current()

    async def pick_async(self) -> Member | None:
        """``pick`` for asyncio: the etcd read runs in a thread."""
        if self._due():
            await asyncio.to_thread(self._discover)
        return self.current()

    def _due(self) -> bool:
        """Read etcd now: after a loss, and before every try while no member is known."""
        return self._stale or bool(self.etcd and not self.members)

    def _discover(self) -> None:
        try:
            leader = _etcd.read_leader(self.etcd, self.group, self.etcd_timeout)
        except Unavailable as error:
            self._etcd_error = error.message
            leader = None
        else:
            self._etcd_error = "" if leader else f"group {self.group!r} has no leader in etcd"
        with self._lock:
            self._stale = False
            if leader:
                self._current = self.members.index(self._member(leader))

    def nobody(self) -> Unavailable:
        """What a call raises when no member was ever known (etcd had no leader to name)."""
        why = self._etcd_error or "no address is known"
        return Unavailable(f"no sessionlog primary found for {self.target}: {why}")

    # -- epochs ---------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The highest leadership epoch any member named (of any group)."""
        return max(self.epochs.values(), default=0)

    def _group_of(self, session_id: str) -> str:
        if not self.slot_groups or not session_id:
            return ""
        return self.slot_groups.get(slot_of(session_id), "")

    def write_metadata(
        self, metadata: tuple[tuple[str, str], ...], session_id: str = ""
    ) -> tuple[tuple[str, str], ...]:
        """A write's request metadata: ``metadata`` and the highest epoch seen of the group
        that answers for ``session_id``, once there is one (a server below it refuses the
        write), with that group's name when it is a sharded group."""
        return self._with_epoch(metadata, self._group_of(session_id))

    def stream_metadata(
        self, metadata: tuple[tuple[str, str], ...], session_id: str
    ) -> tuple[tuple[str, str], ...]:
        """An AppendStream's request metadata: the epoch of the group that answers for its
        first append's session ``session_id``, else of the one group known when this client has
        seen only one (a stream names no session of its own: it carries one group's epoch)."""
        group = self._group_of(session_id)
        with self._lock:
            if not group and "" not in self.epochs and len(self.epochs) == 1:
                [group] = self.epochs
        return self._with_epoch(metadata, group)

    def _with_epoch(
        self, metadata: tuple[tuple[str, str], ...], group: str
    ) -> tuple[tuple[str, str], ...]:
        epoch = self.epochs.get(group, 0)
        if not epoch:
            return metadata
        named = ((EPOCH_GROUP_KEY, group),) if group else ()
        return (*metadata, (EPOCH_KEY, str(epoch)), *named)

    def learn(self, member: Member, epoch: int, group: str = "", session_id: str = "") -> bool:
        """``member`` of ``group`` named ``epoch`` (0: it named none) in a reply for
        ``session_id``; False when that is below the group's highest epoch seen before: the
        member was deposed."""
        with self._lock:
            if group and session_id:
                self.slot_groups[slot_of(session_id)] = group
            if not epoch:
                return True
            member.epoch = epoch
            seen = self.epochs.get(group, 0)
            self.epochs[group] = max(seen, epoch)
        return epoch >= seen

    def opened(self, member: Member, headers: Iterable[tuple[str, Any]] | None) -> None:
        """An AppendStream's initial metadata from ``member``: the epoch (and group) its server
        named as the stream opened, learnt as a write reply's trailers are."""
        self.learn(member, trailing_epoch(headers), trailing_group(headers))

    def accepted(
        self, member: Member, trailers: Iterable[tuple[str, Any]] | None, session_id: str = ""
    ) -> None:
        """A write ``member`` acknowledged: LeadershipLost (committed) when its epoch is below
        the highest seen of its group: a deposed primary took it, so it is not the group's."""
        trailers = list(trailers or ())
        epoch, group = trailing_epoch(trailers), trailing_group(trailers)
        if self.learn(member, epoch, group, session_id):
            return
        self.moved(member)
        raise LeadershipLost(
            f"{member.address} took the write at epoch {epoch}, but this client has seen epoch "
            f"{self.epochs.get(group, 0)}: that server was deposed, and what it stored is on a "
            "history the "
            "group discards when it rejoins. The write is not acknowledged; send it again (with "
            "the same request id) to the current primary",
            committed=True,
        )

    # -- after a failure --------------------------------------------------------------------------

    def after(
        self,
        member: Member,
        error: grpc.RpcError,
        *,
        retry: bool,
        hops: int,
        deadline_moves: bool = False,
        session_id: str = "",
        stream: bool = False,
    ) -> Step:
        """Record what ``error`` says about ``member`` and decide what the failed call does next
        (``deadline_moves``: a unary call that retries, for which a deadline is no answer and
        which is sent again after any end of the transport, as a server stopping with the call in
        flight (CANCELLED) or a proxy losing the member behind it: a read, or a write whose
        request id makes a second try harmless; ``stream``: a read stream, which resumes after
        any end of the transport)."""
        trailers = error.trailing_metadata()
        info = error_info(trailers)
        if info is not None:
            member.reached = True
        group = trailing_group(trailers)
        current = self.learn(member, trailing_epoch(trailers), group, session_id)
        code = error.code()
        proxied = proxy_status(error) is not None
        unavailable = (
            code == grpc.StatusCode.UNAVAILABLE
            or proxied
            or ((stream or deadline_moves) and transport_end(error))
        )
        answered = member.reached or self.reached or proxied  # a proxy answered, if no server
        if info is not None and info.reason == ReplicasUnavailable.reason:
            return Step.LATER if retry else Step.RAISE  # committed here: never move for it
        if info is not None and info.reason == SLOT_MOVING:
            return Step.LATER  # written nowhere, by no member: wait for the flip, here
        if info is not None and info.reason == WRONG_GROUP:
            return Step.LATER if self.retry_wrong_group else Step.RAISE
        if not self.several:
            if unavailable and info is None and not answered:
                raise self._unreachable(error, [member])
            return Step.LATER if retry and unavailable else Step.RAISE
        if info is not None and info.reason == NotPrimary.reason:
            step = self.not_primary(member, info.metadata, group, current)
            return step if step is not Step.AGAIN or hops < self.hop_limit else Step.LATER
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline_moves and info is None:
            self.moved(member)
            return Step.LATER
        if not unavailable:
            return Step.RAISE
        if info is None and not answered:
            member.failed = True
            self.moved(member)
            with self._lock:
                tried = [m for m in self.members if not m.reached]
                hopeless = len(tried) == len(self.members) and all(m.failed for m in tried)
            if hopeless:
                raise self._unreachable(error, tried)
            return Step.AGAIN if hops < self.hop_limit else Step.LATER
        self.moved(member)
        return Step.LATER if retry else Step.RAISE

    def not_primary(
        self, member: Member, metadata: Mapping[str, str], group: str = "", current: bool = True
    ) -> Step:
        """``member`` refused a write NOT_PRIMARY (ErrorInfo ``metadata``) in a reply that named
        ``group``'s epoch (``current``: not below the highest seen): the primary it names becomes
        current (AGAIN), unless that member or its reply is deposed, whose hint is not followed:
        then the next address (AGAIN, at once), else the next after a backoff (LATER)."""
        current = self.learn(member, _whole(metadata.get("epoch", "")), group) and current
        hint = metadata.get(PRIMARY_HINT, "")
        if current and hint and hint != member.address:
            with self._lock:
                self._current = self.members.index(self._member(hint))
            return Step.AGAIN
        self.moved(member)
        return Step.LATER if current else Step.AGAIN

    def moved(self, member: Member) -> None:
        """``member`` failed as the current one: make the next address current (unless another
        call already moved on), and read etcd before the next call when it is configured."""
        with self._lock:
            if self.members and self.members[self._current] is member:
                self._current = (self._current + 1) % len(self.members)
            self._stale = bool(self.etcd)

    def _unreachable(self, error: grpc.RpcError, members: Sequence[Member]) -> Unavailable:
        details = " ".join((error.details() or "").split())
        where = ", ".join(m.address for m in members)
        return Unavailable(f"cannot reach a sessionlog server at {where}: {details}")

    def _member(self, address: str) -> Member:
        """The member of ``address``, opened and added when new (call with the lock held or
        before the router is shared)."""
        for member in self.members:
            if member.address == address:
                return member
        channel, stubs = self.open_member(address)
        member = Member(address, channel, stubs, reached=self.reached)
        self.members.append(member)
        return member

    def channels(self) -> list[Any]:
        with self._lock:
            return [m.channel for m in self.members]


@dataclass
class StreamEpochs:
    """What one AppendStream call on ``member`` makes of epochs, as unary writes do (module
    docstring): the stream carries the epoch seen (``Router.stream_metadata``), its server names
    its own in the headers (learnt before any reply), and each reply is judged by the headers'
    epoch against the highest seen *when it arrives*:

        an acknowledgement            LeadershipLost (committed) when the headers' epoch is below
                                      the highest seen: a deposed primary took it
        NOT_PRIMARY                   the router follows its hint (the next stream or call goes
                                      to the named primary) unless the headers' epoch, or the
                                      refusal's own, is below the highest seen: then the next
                                      address. The append fails NotPrimary either way: it wrote
                                      nothing, and a stream stays on its server
        the call's end                the router moves as after a unary call's UNAVAILABLE

    The trailers of a call that ends OK name the epoch again (a fresh store's first write makes
    it 1) and are learnt too.
    """

    router: Router
    member: Member
    headers: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def epoch(self) -> int:
        """The epoch the stream's server named as it opened (0: none)."""
        return trailing_epoch(self.headers)

    def opened(self, headers: Iterable[tuple[str, Any]] | None) -> None:
        self.headers = list(headers or ())
        self.router.opened(self.member, self.headers)

    def judge(self, session_id: str, error: SessionLogError | None) -> None:
        """One reply for ``session_id`` (``error``: its refusal, None: acknowledged); raises
        LeadershipLost for an acknowledgement that is none."""
        self.member.reached = True
        if error is None:
            self.router.accepted(self.member, self.headers, session_id)
        elif error.reason == NotPrimary.reason and self.router.several:
            group = trailing_group(self.headers)
            epoch = self.epoch
            current = not epoch or epoch >= self.router.epochs.get(group, 0)
            self.router.not_primary(self.member, error.metadata, group, current)

    def ended(self, error: grpc.RpcError) -> SessionLogError | None:
        """The call failed: the router moves as for a unary write; the error to report instead
        of the call's own (Unavailable naming every address when none was ever reached)."""
        try:
            self.router.after(self.member, error, retry=False, hops=0, stream=True)
        except Unavailable as unreachable:
            return unreachable
        return None

    def finished(self, trailers: Iterable[tuple[str, Any]] | None) -> None:
        self.router.opened(self.member, trailers)


def trailing_group(trailers: Iterable[tuple[str, Any]] | None) -> str:
    """The group a sharded server's reply names beside its epoch ("": none, not sharded)."""
    for key, value in trailers or ():
        if key == EPOCH_GROUP_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def trailing_epoch(trailers: Iterable[tuple[str, Any]] | None) -> int:
    """The epoch a write's reply names in its trailing metadata (0: none)."""
    for key, value in trailers or ():
        if key == EPOCH_KEY:
            return _whole(value.decode() if isinstance(value, bytes) else str(value))
    return 0


def move_budget(error: grpc.RpcError, retry: Retry) -> float | None:
    """How long ``error`` may be retried when that is less than the whole budget: a
    WRONG_GROUP refusal's ``Retry.wrong_group_for``."""
    info = error_info(error.trailing_metadata())
    return retry.wrong_group_for if info is not None and info.reason == WRONG_GROUP else None


def replicas_unavailable(error: grpc.RpcError) -> bool:
    """A write committed on the primary but held by too few replicas (``--ack replica``)."""
    info = error_info(error.trailing_metadata())
    return info is not None and info.reason == ReplicasUnavailable.reason


def _whole(text: str) -> int:
    return int(text) if text.isascii() and text.isdigit() else 0


_HOST_PORT = re.compile(r"(\[[^\]]+\]|[^:\[\]/]+):(\d{1,5})")
_SCHEMES = ("unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


def check_address(address: str) -> str:
    """``address`` when it is ``HOST:PORT`` (``[v6]:PORT``) or a gRPC target with a scheme
    (``dns:///HOST:PORT``, ``unix:...``); a ValueError for a bare host (also after ``dns:``), to
    which gRPC would silently dial port 443, where no sessionlog server listens, and for a URL
    (``http://...``), which is no gRPC target."""
    if address.startswith(("http://", "https://", "grpc://")):
        raise ValueError(
            f"a target is HOST:PORT, e.g. 127.0.0.1:50051 (got {address!r}): a URL is not a gRPC "
            "target; drop the scheme (TLS is the client's tls= option)"
        )
    if address.startswith("dns:"):
        name = address[len("dns:") :]
        if name.startswith("//"):  # dns://AUTHORITY/HOST:PORT
            name = name[2:].partition("/")[2]
        _host_port(name, address)
    elif not (":/" in address or address.startswith(_SCHEMES)):
        _host_port(address, address)
    return address


def _host_port(name: str, address: str) -> None:
    match = _HOST_PORT.fullmatch(name)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(
            f"a target is HOST:PORT, e.g. 127.0.0.1:50051 (got {address!r}); a bare host would "
            "dial port 443"
        )


def make_router(
    target: str | Sequence[str] | None,
    cluster: str | None,
    group: str | None,
    *,
    connect_timeout: float,
    wait_for_ready: bool,
    open_member: Callable[[str], tuple[Any, dict[str, Any]]],
) -> Router:
    """The router of a client's ``target``, ``cluster`` and ``group`` arguments.

    A string ``target`` is one gRPC target, as it always was (commas inside it are gRPC's own
    syntax); a sequence is a list of members (even of one) and turns routing on, as does
    ``cluster`` (``etcd://HOST:PORT[,HOST:PORT...]``, read with ``group``). No target and no
    cluster: ``DEFAULT_TARGET``.
    """
    if (cluster is None) != (group is None):
        raise ValueError("give cluster and group together (etcd://HOST:PORT and the group name)")
    etcd = _etcd.parse_cluster(cluster) if cluster is not None else ()
    if group is not None:
        _etcd.leader_key(group)  # refuse a bad name now, not at the first call
    if target is None:
        addresses: tuple[str, ...] = () if etcd else (DEFAULT_TARGET,)
        several = bool(etcd)
    elif isinstance(target, str):
        addresses, several = (check_address(target),), bool(etcd)
    else:
        addresses, several = tuple(dict.fromkeys(a.strip() for a in target if a.strip())), True
        if not addresses and not etcd:
            raise ValueError("target lists no address")
        for address in addresses:
            check_address(address)
    return Router(
        addresses,
        open_member,
        several,
        etcd=etcd,
        group=group or "",
        etcd_timeout=connect_timeout,
        reached=wait_for_ready,
    )
