"""`sessionlog cluster move-slot S --to G`: move one slot's sessions to another group, live.

    0. clear     the target group's primary erases its copies of the slot's sessions
                 (EraseSessions with slot_copies; refused where the slot is owned), so no copy
                 an earlier move left there (of a session deleted or recreated since, or
                 planted) outlives this one: the target ends with exactly the source's;
    1. copy      every session of the slot, read from the source group's primary (Since and
                 GetSessionRecords), is imported (ImportSession: seqs and times kept, the
                 record's create and last-append times and fork parent, its request records,
                 its writer lease and lease audit; empty sessions too) into the target group's
                 primary, while the slot keeps taking writes on the source;
    2. freeze    a map one epoch up lists the slot under ``frozen``: the source serves its reads
                 but refuses its writes (UNAVAILABLE, SLOT_MOVING, which clients retry); the
                 mover waits until every member of the source group reports that epoch as
                 settled (GetStats map_epoch: every write checked against the older map has
                 committed, and the writer refuses the slot's writes in their transaction), and
                 of the target group (which then answers the slot's writes SLOT_MOVING too, so
                 that a client sent there early waits for the flip instead of bouncing back);
    3. tail      what was appended since the copy (and sessions created meanwhile) is copied,
                 with the request records and lease changes made since (the last chunk of
                 each session carries them as the source holds them now); the mover waits
                 until every member of the target holds what its primary then holds
                 (GetReplicationStatus: same history id, position at least the primary's), so
                 a failover of the target after the flip loses nothing of the copy;
    4. flip      a map one more epoch up gives the slot to the target, unfrozen; the mover waits
                 until every member of both groups holds it. A write retried against the source
                 is now told WRONG_GROUP, naming the target's primary.

Writes to the slot pause from the freeze to the flip (the report prints how long). The copy
goes to a session of a slot the target does not own yet (an ImportSession with
``x-sessionlog-move: copy`` and an admin token, see ``Ownership.check_copy``), so no session is
writable in two groups at once: before the flip only the source takes the slot's writes, after
it only the target. A move that fails before the flip puts the map back unfrozen; running it
again clears the target and copies afresh. Within one run, a chunk the target already took (a
lost reply) is continued from its next seq (the target's IMPORT_SEQ_MISMATCH names it).

Failovers. Every call to the groups is retried on UNAVAILABLE, DEADLINE_EXCEEDED and
NOT_PRIMARY for up to ``RETRY_SECONDS`` (the clients' ``Retry`` backoff), each time after
asking the groups for their primaries again. With the same primaries the copy resumes where
the target is (its next seq, from the chunk's reply or its IMPORT_SEQ_MISMATCH). When either
group has a new primary, the copy starts over on it: the target's copies are cleared again and
copied afresh. A new primary of the target may lack the last chunks the old one took, and one
of the source the last writes it acknowledged (``--ack local``); only a fresh clear makes what
the target holds a prefix of what the new source holds. A move that fails for good (the retry
budget spent, anything else refused) still rolls back as above.

``SESSIONLOG_MOVE_PACE`` (seconds; test-only, unset in production) makes the mover sleep that
long after the clear and after each session it copies, so that a test can land a failover or
a kill of the mover in the middle of a step.

Request records: those the source still replays (younger than its request-id TTL), at most the
newest 10,000 per session (``storage.imports.MAX_REQUEST_RECORDS``).

Maps live in etcd (``--shard-map etcd`` servers): a static map file cannot be frozen and flipped
under running servers, so the command needs ``--cluster etcd://...``.
Exit status: 0 moved, 1 refused or failed (the message says why), 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from sessionlog.shard import stored
from sessionlog.shard.ownership import MOVE_COPY, MOVE_HEADER
from sessionlog.shard.scatter import SCOPE_GROUP, SCOPE_HEADER
from sessionlog.shard.shardmap import SHARDS_KEY, Group, ShardMap, ShardMapError
from sessionlog.shard.slots import SESSION_HEADER, SLOTS, slot_of

if TYPE_CHECKING:
    from sessionlog.cluster import etcd

CALL_TIMEOUT_SECONDS = 10.0
SETTLE_TIMEOUT_SECONDS = 30.0
"""How long the mover waits for every member to report a map it put."""
COPY_BATCH = 200
"""Events per copying Append, at most."""
COPY_BATCH_BYTES = 1 << 20
"""Bytes of events per copying Append, at most (one larger event goes alone)."""
PAGE_SIZE = 1000
RETRY_SECONDS = 60.0
"""How long the mover keeps retrying a group that has no primary it can reach (an election
takes about a --lease-ttl); past it the move fails and rolls back."""
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
PACE_ENV = "SESSIONLOG_MOVE_PACE"


class MoveError(Exception):
    """The move was refused or failed; the message says why (and what state the map is in)."""


@dataclass
class MoveReport:
    slot: int
    source: str
    target: str
    sessions: int = 0
    copied_live: int = 0
    """Events copied while the slot still took writes."""
    copied_paused: int = 0
    """Events copied while its writes were paused."""
    pause_seconds: float = 0.0
    """From the freeze's put to the flip's put: how long the slot's writes were refused."""
    epochs: list[int] = field(default_factory=list)


def add_command(actions: Any) -> None:
    """Register `sessionlog cluster move-slot`."""
    move = actions.add_parser(
        "move-slot",
        help="move one slot's sessions to another group, with a brief pause of its writes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    move.add_argument("slot", metavar="S", type=_slot, help=f"the slot (0-{SLOTS - 1})")
    move.add_argument("--to", required=True, metavar="GROUP", help="the group to move it to")
    move.add_argument(
        "--cluster",
        metavar="etcd://HOST:PORT[,HOST:PORT]",
        help="the etcd endpoints of the cluster (required: the map lives in etcd)",
    )
    move.add_argument(
        "--wait",
        type=_seconds,
        default=SETTLE_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="how long to wait for every member to take a new map (default %(default)s)",
    )
    move.add_argument(
        "--token",
        default=os.environ.get("SESSIONLOG_TOKEN", ""),
        help="an admin token, for servers with --auth-tokens [env SESSIONLOG_TOKEN]",
    )
    move.set_defaults(run=_run)


def _slot(text: str) -> int:
    """A slot number, 0 to SLOTS - 1 (argparse: anything else is a usage error, exit 2)."""
    try:
        slot = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a slot number") from None
    if not 0 <= slot < SLOTS:
        raise argparse.ArgumentTypeError(f"slot {slot} is outside 0-{SLOTS - 1}")
    return slot


def _seconds(text: str) -> float:
    """A wait above zero, in seconds (a zero or negative one would freeze the slot and give up)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"--wait must be above 0 seconds, not {text}")
    return seconds


def _run(args: argparse.Namespace) -> int:
    if not args.cluster:
        print(
            "sessionlog cluster move-slot: needs --cluster etcd://...: a slot moves by maps "
            "put in etcd, which the servers (--shard-map etcd) follow; a static --shard-map "
            "file cannot be changed under running servers",
            file=sys.stderr,
        )
        return 2
    from sessionlog.cluster import etcd
    from sessionlog.cluster.settings import parse_cluster

    try:
        endpoints = etcd.Endpoints(parse_cluster(args.cluster), 3.0)
    except ValueError as exc:
        print(f"sessionlog cluster move-slot: --cluster: {exc}", file=sys.stderr)
        return 2
    try:
        report = move_slot(
            endpoints, args.slot, args.to, token=args.token, say=print, settle_timeout=args.wait
        )
    except MoveError as exc:
        print(f"sessionlog cluster move-slot: {exc}", file=sys.stderr)
        return 1
    finally:
        endpoints.close()
    print(
        f"moved slot {report.slot} from {report.source} to {report.target}: "
        f"{report.sessions} session(s), {report.copied_live} event(s) copied live, "
        f"{report.copied_paused} while paused; writes paused {report.pause_seconds:.3f} s; "
        f"map epochs {', '.join(map(str, report.epochs))}"
    )
    return 0


def move_slot(
    endpoints: etcd.Endpoints,
    slot: int,
    to: str,
    *,
    token: str = "",
    say: Callable[[str], None] = lambda _: None,
    settle_timeout: float = SETTLE_TIMEOUT_SECONDS,
) -> MoveReport:
    """Move ``slot`` to group ``to`` (the module docstring's phases); MoveError says why not."""
    if not 0 <= slot < SLOTS:
        raise MoveError(f"slot {slot} is outside 0-{SLOTS - 1}")
    current, _ = _read_map(endpoints)
    if not current.has_group(to):
        known = ", ".join(g.name for g in current.groups)
        raise MoveError(f"the shard map (epoch {current.epoch}) has no group {to!r} ({known})")
    source = current.owner_of_slot(slot)
    if source.name == to:
        raise MoveError(f"slot {slot} is already owned by group {to!r}: nothing to move")
    target = current.group(to)
    report = MoveReport(slot, source.name, target.name)
    with _Groups(current, token) as groups:
        copier = _Copier(groups, source, target, slot, say)
        say(f"clearing {target.name}'s old copies of slot {slot}")
        erased = copier.clear_target()
        if erased:
            say(f"erased {erased} stale copies of slot {slot}'s sessions on {target.name}")
        if not current.is_frozen(slot):
            src, dst = copier.primaries
            say(f"copying slot {slot} from {source.name} ({src}) to {target.name} ({dst})")
            report.copied_live = copier.copy_all()
            frozen = current.with_frozen([slot])
            _put(endpoints, current, frozen)
        else:  # an earlier attempt froze it and stopped: carry on from there
            frozen = current
        paused_at = time.monotonic()
        report.epochs.append(frozen.epoch)
        try:
            say(f"slot {slot} frozen at epoch {frozen.epoch}; waiting for {source.name}")
            groups.wait_settled(source, frozen.epoch, settle_timeout)
            groups.wait_settled(target, frozen.epoch, settle_timeout)  # waits, not redirects
            # The primaries again: after a failover since the first copy the tail is not read
            # from a member that lags, and the copy starts over (the module docstring).
            copier.resolve()
            report.copied_paused = copier.copy_all()
            if groups.wait_replicated(target, copier.primaries[1], settle_timeout):
                say(f"every member of {target.name} holds the copy")
            flipped = frozen.with_slots([slot], target.name)
            _put(endpoints, frozen, flipped)
        except BaseException as exc:
            _thaw(endpoints, slot, say)
            if isinstance(exc, MoveError):
                raise MoveError(f"{exc}; the slot stays with {source.name}") from None
            raise
        report.pause_seconds = time.monotonic() - paused_at
        report.epochs.append(flipped.epoch)
        report.sessions = len(copier.copied)
        say(f"slot {slot} owned by {target.name} at epoch {flipped.epoch}")
        try:
            groups.wait_settled(source, flipped.epoch, settle_timeout)
            groups.wait_settled(target, flipped.epoch, settle_timeout)
        except MoveError as exc:
            raise MoveError(
                f"slot {slot} moved to {target.name} (map epoch {flipped.epoch}), but {exc}: "
                "that member takes the map when it reads etcd again"
            ) from None
    return report


# --- etcd ----------------------------------------------------------------------------------


def _read_map(endpoints: etcd.Endpoints) -> tuple[ShardMap, int]:
    from sessionlog.cluster import etcd

    try:
        shard_map, revision = stored.read(endpoints)
    except (etcd.EtcdUnavailable, etcd.EtcdError) as exc:
        raise MoveError(f"etcd: {exc}") from exc
    except ShardMapError as exc:
        raise MoveError(str(exc)) from exc
    if shard_map is None:
        raise MoveError(f"etcd holds no shard map at {SHARDS_KEY} (`sessionlog cluster map put`)")
    return shard_map, revision


def _put(endpoints: etcd.Endpoints, expected: ShardMap, new: ShardMap) -> None:
    """Replace ``expected`` by ``new`` in etcd, unless someone else changed the map meanwhile."""
    from sessionlog.cluster import etcd

    try:
        current, revision = stored.read(endpoints)
        if current != expected:
            raise MoveError(f"{SHARDS_KEY} was changed by someone else during the move")
        done = stored.put(endpoints, new, revision)
    except (etcd.EtcdUnavailable, etcd.EtcdError) as exc:
        raise MoveError(f"etcd: {exc}") from exc
    except ShardMapError as exc:
        raise MoveError(str(exc)) from exc
    if not done:
        raise MoveError(f"{SHARDS_KEY} was changed by someone else during the move")


def _thaw(endpoints: etcd.Endpoints, slot: int, say: Callable[[str], None]) -> None:
    """After a failure before the flip: the map again without the slot frozen (best effort)."""
    try:
        held, _ = _read_map(endpoints)
        if held.is_frozen(slot):
            thawed = ShardMap(held.epoch + 1, held.groups, held.frozen - {slot})
            _put(endpoints, held, thawed)
            say(f"slot {slot} unfrozen at epoch {thawed.epoch}")
    except MoveError as exc:
        say(f"could not unfreeze slot {slot} ({exc}): run the move again, or put a map")


# --- the groups' servers -------------------------------------------------------------------


class _Groups:
    """Channels to the members of the map's groups, and their answers."""

    def __init__(self, shard_map: ShardMap, token: str) -> None:
        self.shard_map = shard_map
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._channels: dict[str, grpc.Channel] = {}

    def __enter__(self) -> _Groups:
        return self

    def __exit__(self, *_: object) -> None:
        for channel in self._channels.values():
            channel.close()

    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return self._channels[address]

    def primary(self, group: Group) -> str:
        """The group's current primary, as its members' GetShardMap names it."""
        from sessionlog_client.v1 import session_log_service_pb2 as pb
        from sessionlog_client.v1 import session_log_service_pb2_grpc as rpc

        problems = []
        for member in group.members:
            stub = rpc.SessionLogServiceStub(self.channel(member))  # type: ignore[no-untyped-call]
            try:
                reply = stub.GetShardMap(
                    pb.GetShardMapRequest(), timeout=CALL_TIMEOUT_SECONDS, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                problems.append(f"{member}: {exc.code().name} {exc.details()}")
                continue
            for known in reply.shard_map.groups:
                if known.name == group.name and known.primary:
                    return str(known.primary)
            problems.append(f"{member}: knows no primary of {group.name} yet")
        raise MoveError(f"no primary of group {group.name} found ({'; '.join(problems)})")

    def wait_replicated(self, group: Group, primary: str, timeout: float) -> bool:
        """Until every other member of ``group`` holds what its ``primary`` holds now (the same
        history at its position or later): with ``--ack local`` a failover of the target right
        after the flip would otherwise lose the copy's last chunks, acknowledged writes of the
        source. False for a group of one."""
        from sessionlog_client.v1 import replication_service_pb2 as rpb
        from sessionlog_client.v1 import replication_service_pb2_grpc as rrpc

        def status(member: str) -> Any:
            stub = rrpc.ReplicationServiceStub(self.channel(member))  # type: ignore[no-untyped-call]
            request = rpb.GetReplicationStatusRequest()
            return stub.GetReplicationStatus(
                request, timeout=CALL_TIMEOUT_SECONDS, metadata=self.metadata
            )

        waiting = [m for m in group.members if m != primary]
        if not waiting:
            return False
        try:
            held = status(primary)
        except grpc.RpcError as exc:
            raise MoveError(
                f"group {group.name}: its primary {primary} did not say what it holds: "
                f"{exc.code().name} {exc.details()}"
            ) from None
        deadline = time.monotonic() + timeout
        last = ""
        while waiting:
            for member in list(waiting):
                try:
                    reply = status(member)
                except grpc.RpcError as exc:
                    last = f"{member}: {exc.code().name} {exc.details()}"
                    continue
                if reply.history_id == held.history_id and reply.position >= held.position:
                    waiting.remove(member)
                else:
                    last = f"{member} holds position {reply.position} of {held.position}"
            if waiting and time.monotonic() > deadline:
                raise MoveError(
                    f"group {group.name}: not every member holds the copy within "
                    f"{timeout:.0f} s ({last})"
                )
            if waiting:
                time.sleep(0.05)
        return True

    def wait_settled(self, group: Group, epoch: int, timeout: float) -> None:
        """Until every member of ``group`` reports ``epoch`` (or higher) as settled."""
        from sessionlog_client.v1 import admin_service_pb2 as apb
        from sessionlog_client.v1 import admin_service_pb2_grpc as arpc

        deadline = time.monotonic() + timeout
        waiting = list(group.members)
        last = ""
        while waiting:
            for member in list(waiting):
                stub = arpc.AdminServiceStub(self.channel(member))  # type: ignore[no-untyped-call]
                try:
                    stats = stub.GetStats(
                        apb.GetStatsRequest(), timeout=CALL_TIMEOUT_SECONDS, metadata=self.metadata
                    )
                except grpc.RpcError as exc:
                    last = f"{member}: {exc.code().name} {exc.details()}"
                    continue
                if stats.map_epoch >= epoch:
                    waiting.remove(member)
                else:
                    last = f"{member} holds epoch {stats.map_epoch}"
            if waiting and time.monotonic() > deadline:
                raise MoveError(
                    f"group {group.name}: not every member took the map at epoch {epoch} "
                    f"within {timeout:.0f} s ({last})"
                )
            if waiting:
                time.sleep(0.05)


class _Copier:
    """Copies the slot's sessions from the source's primary to the target's, through
    failovers of either (the module docstring)."""

    def __init__(
        self,
        groups: _Groups,
        source: Group,
        target: Group,
        slot: int,
        say: Callable[[str], None],
    ) -> None:
        from sessionlog_client import Retry

        self._groups = groups
        self._groups_moved = (source, target)
        self._slot = slot
        self._say = say
        self._metadata = groups.metadata
        self._retry = Retry(give_up_after=RETRY_SECONDS, initial_backoff=0.1, max_backoff=2.0)
        self._pace = float(os.environ.get(PACE_ENV) or 0)
        self.copied: dict[str, int] = {}
        """Session id -> the next seq the target holds."""
        self.primaries = ("", "")
        """The (source, target) primaries the copy reads from and writes to."""
        self._restart = False
        """A primary changed: clear the target and copy afresh before going on."""
        self._connect(*self._look_up())

    def _look_up(self) -> tuple[str, str]:
        """Both groups' primaries, waiting (within the retry budget) while one has none, as
        during an election."""
        source, target = self._groups_moved
        backoff = self._retry.backoff()
        while True:
            try:
                return self._groups.primary(source), self._groups.primary(target)
            except MoveError as exc:
                delay = backoff.next()
                if delay is None:
                    raise MoveError(f"{exc} (after {RETRY_SECONDS:.0f} s)") from None
                time.sleep(delay)

    def _connect(self, source: str, target: str) -> None:
        from sessionlog_client.v1 import admin_service_pb2_grpc as arpc
        from sessionlog_client.v1 import session_log_service_pb2_grpc as rpc

        if self.primaries != ("", "") and self.primaries != (source, target):
            self._say(
                f"primaries now {source} (source) and {target} (target), were "
                f"{self.primaries[0]} and {self.primaries[1]}: copying slot {self._slot} afresh"
            )
            self._restart = True
        self.primaries = (source, target)
        self._source = rpc.SessionLogServiceStub(self._groups.channel(source))  # type: ignore[no-untyped-call]
        self._target = rpc.SessionLogServiceStub(self._groups.channel(target))  # type: ignore[no-untyped-call]
        self._target_admin: Any = arpc.AdminServiceStub(self._groups.channel(target))  # type: ignore[no-untyped-call]

    def resolve(self) -> None:
        """Ask the groups for their primaries again (a restart is due when one changed)."""
        self._connect(*self._look_up())

    def _recover(self, exc: grpc.RpcError, backoff: Any, what: str) -> None:
        """After a transient failure of ``what``: wait, then find the primaries again (until
        both groups name one); MoveError for a lasting failure or a spent retry budget."""
        problem = f"{what} failed: {exc.code().name} {exc.details()}"
        if not _transient(exc):
            raise MoveError(problem) from None
        delay = backoff.next()
        if delay is None:
            raise MoveError(f"{problem} (still, after retrying for {RETRY_SECONDS:.0f} s)")
        time.sleep(delay)
        self._connect(*self._look_up())  # waits for an election's result itself

    def clear_target(self) -> int:
        """Erase the target's copies of the slot (EraseSessions with slot_copies) before the
        first copy, so what the target holds at the flip is exactly the source's: a copy an
        earlier move left there may be of a session deleted or recreated since. The copies
        erased."""
        from sessionlog_client.v1 import admin_service_pb2 as apb

        backoff = self._retry.backoff()
        while True:
            try:
                reply = self._target_admin.EraseSessions(
                    apb.EraseSessionsRequest(slot_copies=self._slot, reason="before a slot move"),
                    timeout=CALL_TIMEOUT_SECONDS * 6,
                    metadata=self._metadata,
                )
            except grpc.RpcError as exc:
                what = f"erasing the target's old copies of slot {self._slot}"
                self._recover(exc, backoff, what)
                continue
            self.copied.clear()
            self._restart = False
            self._sleep()
            return int(reply.session_count)

    def copy_all(self) -> int:
        """Copy what the target lacks of every session of the slot; the events copied."""
        total = 0
        backoff = self._retry.backoff()
        while True:
            if self._restart:
                self.clear_target()
            try:
                for session_id in self._sessions():
                    total += self._copy(session_id)
                    self._sleep()
            except grpc.RpcError as exc:
                self._recover(exc, backoff, f"copying slot {self._slot}")
                continue
            if not self._restart:
                return total

    def _sleep(self) -> None:
        if self._pace > 0:
            time.sleep(self._pace)

    def _sessions(self) -> list[str]:
        from sessionlog_client.v1 import session_log_service_pb2 as pb

        found: list[str] = []
        token = ""
        for _ in range(1_000_000):
            reply = self._source.ListSessions(
                pb.ListSessionsRequest(page_size=PAGE_SIZE, page_token=token),
                timeout=CALL_TIMEOUT_SECONDS,
                metadata=(*self._metadata, (SCOPE_HEADER, SCOPE_GROUP)),
            )
            found += [s.session_id for s in reply.sessions if slot_of(s.session_id) == self._slot]
            token = reply.next_page_token
            if not token:
                break
        return found

    def _copy(self, session_id: str) -> int:
        """Bring the target's copy of ``session_id`` up to the source's: the events it lacks,
        then (on the last chunk) the record's times, the request records and the lease with
        its audit as the source holds them now. The events copied; an RpcError for a
        failure the caller retries."""
        from sessionlog_client.v1 import session_log_service_pb2 as pb

        routed = (*self._metadata, (SESSION_HEADER, session_id))
        records = self._source.GetSessionRecords(
            pb.GetSessionRecordsRequest(session_id=session_id),
            timeout=CALL_TIMEOUT_SECONDS,
            metadata=routed,
        )
        if not records.session.exists:  # gone since the listing (it cannot be): nothing to copy
            return 0
        start = self.copied.get(session_id, 0)
        events = []
        stream = self._source.Since(
            pb.SinceRequest(session_id=session_id, seq=start),
            timeout=CALL_TIMEOUT_SECONDS * 6,
            metadata=routed,
        )
        for reply in stream:
            events.extend(reply.events)
        copied = 0
        seq = start
        while True:
            take, size = 0, 0
            while take < min(len(events), COPY_BATCH):
                size += events[take].ByteSize()
                if take and size > COPY_BATCH_BYTES:
                    break
                take += 1
            batch = events[:take]
            last = take == len(events)
            request = _chunk(session_id, seq, batch, records, last)
            try:
                reply = self._target.ImportSession(
                    request,
                    timeout=CALL_TIMEOUT_SECONDS,
                    metadata=(*routed, (MOVE_HEADER, MOVE_COPY)),
                )
            except grpc.RpcError as exc:
                if _transient(exc):
                    raise
                held = _conflict_next_seq(exc)
                if held is not None and held < seq:  # the target lost a reply's chunk: reread
                    self.copied[session_id] = held
                    return copied + self._copy(session_id)
                if held is None or held > seq + len(events):
                    raise MoveError(
                        f"copying session '{session_id}' to the target failed: "
                        f"{exc.code().name} {exc.details()}"
                    ) from None
                # An earlier attempt copied up to ``held`` already: carry on from there.
                events = events[held - seq :]
                seq = held
                self.copied[session_id] = seq
                continue
            copied += len(batch)
            events = events[take:]
            seq = reply.session.event_count
            self.copied[session_id] = seq
            if last:
                return copied


def _chunk(session_id: str, seq: int, events: Sequence[Any], records: Any, last: bool) -> Any:
    """One ImportSession of a move: ``events`` from ``seq``, the session's record, and on the
    ``last`` chunk the request records, lease and audit (``records``, a
    GetSessionRecordsResponse)."""
    from sessionlog_client.v1 import session_log_service_pb2 as pb

    session = records.session
    request = pb.ImportSessionRequest(
        session_id=session_id,
        first_seq=seq,
        events=events,
        create_time=session.create_time,
        last_append_time=session.last_append_time,
        parent_session_id=session.parent_session_id,
        parent_event_count=session.parent_event_count,
    )
    if seq == 0 or last:  # the record when the copy starts, and as it is at the pause
        request.record.CopyFrom(session)
    if last:
        request.request_records.extend(records.request_records)
        request.lease_audit.extend(records.lease_audit)
        if records.HasField("lease"):
            request.lease.CopyFrom(records.lease)
    return request


def _transient(exc: grpc.RpcError) -> bool:
    """A failure a retry may get past: no answer, or a member that is no longer the primary."""
    return exc.code() in TRANSIENT or _reason(exc) == "NOT_PRIMARY"


def _reason(exc: grpc.RpcError) -> str:
    from google.rpc import error_details_pb2, status_pb2

    for key, value in exc.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        for detail in status_pb2.Status.FromString(value).details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return str(info.reason)
    return ""


def _conflict_next_seq(exc: grpc.RpcError) -> int | None:
    """The target's next seq when an import chunk was refused for starting elsewhere
    (FAILED_PRECONDITION / IMPORT_SEQ_MISMATCH), else None."""
    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    from google.rpc import error_details_pb2, status_pb2

    for key, value in exc.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.reason == "IMPORT_SEQ_MISMATCH":
                return int(info.metadata["next_seq"])
    return None
