"""A server's part in an etcd-elected group (``--cluster``): the election's roles, mapped onto
the running server.

    election.Member ──roles()──▶ GroupMember ──▶ Host (the composition, ``sessionlog.server``)

    Lead(E)        stop replicating, take epoch E (``Promoter.lead``; nothing when this folder
                   already leads at E), take writes: health SERVING
    Follow(A, E)   a folder that took writes records that it was deposed (a fence at E naming
                   A, durable). Then, once A reports that it leads at E or later: when this
                   folder holds changes that A does not (its epoch history parts from A's before
                   its head), it must rejoin before it can replicate anything (below); otherwise
                   it becomes a replica of A (the same folder, a new source), SERVING once it has
                   caught up
    Fenced(why)    writes refused with NOT_PRIMARY naming no primary; NOT_SERVING. A replicator
                   that runs goes on: the last leader may still ship changes, which only raise
                   this member's position

Writes: the writer's process-level hook is ``may_write`` (the lease deadline, asked before a
write applies and again before it is acknowledged), the servicer's fast refusal ``refusal``.

Rejoin. A deposed member's extra changes are on no one else's history, so the folder is rebuilt
without them (``cluster.rejoin``: the code of `sessionlog replica rejoin`, with its report file,
log line and status note) before it replicates. At start-up ``prepare`` does it, before the
store opens, against the leader etcd names. When the member learns it while running (a leader
deposed by a partition or a pause wakes up holding changes it never shipped), it asks the host
to restart the process in place (``Host.restart``: `sessionlog serve` executes itself again),
and the start-up path rebuilds: re-opening every part of the server from a fresh process is
simpler to get right than swapping the store under a running one. A start-up rejoin that fails
(the histories part earlier than their epochs say) is not retried: the member stays deposed,
NOT_SERVING, and its status says to resync.

Synchronous set: with ``--ack replica`` a leader publishes, for each leadership, the members
that hold every write it acknowledged (``cluster.syncset``, ``sync.SyncTracker.lead``): only
they (or it) may take over from it.

Progress: after each commit (``note_commit``) the progress the member publishes follows the
store's newest position and the epoch of the record there: what the position guard compares.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
import lmdb

from sessionlog import errors
from sessionlog.cluster import election, rejoin
from sessionlog.cluster.election import Fenced, Follow, Lead, Member, Role, Timing
from sessionlog.cluster.etcd import Endpoints, EtcdError, EtcdUnavailable
from sessionlog.cluster.members import Progress
from sessionlog.cluster.promotion import Promoter
from sessionlog.cluster.settings import ClusterSettings
from sessionlog.cluster.sync import SyncTracker
from sessionlog.cluster.syncset import SyncSetPublisher
from sessionlog.storage import changes, folder, leadership, rebuild
from sessionlog.storage.integrity import DamagedStore
from sessionlog.storage.leadership import Leadership
from sessionlog.storage.store import Store
from sessionlog.storage.usage import open_readonly
from sessionlog.v1 import replication_service_pb2 as rpb

log = logging.getLogger(__name__)

STATUS_TIMEOUT_SECONDS = 2.0
"""One GetReplicationStatus call to the leader."""
STATUS_RETRY_SECONDS = 0.2
"""Between two asks of a leader that does not lead yet (it is taking its epoch)."""
PREPARE_SECONDS = 15.0
"""How long the start-up rejoin waits for the leader etcd names to say that it leads."""
REJOIN_TIMEOUT_SECONDS = 30.0
"""Each call of a start-up rejoin to the leader."""
REPORTED_DISCARDS = 50
"""Discarded changes named one log line each at a rejoin (the report file names them all)."""


class Host(Protocol):
    """What a member asks of the server it is part of."""

    async def follow(self, primary: str) -> None:
        """Replicate ``primary`` from now on (any other replication stopped first)."""

    async def stop_following(self) -> None:
        """Stop replicating, and wait until nothing more can be applied."""

    async def refresh(self) -> None:
        """The role changed: health (and the role the status pages show) follow it."""

    def restart(self, reason: str) -> None:
        """Restart the process in place (the start-up path then rejoins the leader)."""


class GroupMember:
    """One server's membership of its group; see the module docstring."""

    def __init__(
        self,
        settings: ClusterSettings,
        data: Path,
        *,
        channel_factory: Callable[[str], grpc.aio.Channel],
        blocking_channel_factory: Callable[[str], grpc.Channel],
        metadata: tuple[tuple[str, str], ...] = (),
        timing: Timing | None = None,
    ) -> None:
        self.settings = settings
        self.data = data
        self.timing = timing or Timing.for_ttl(settings.lease_ttl)
        self._channel_factory = channel_factory
        self._blocking_channel_factory = blocking_channel_factory
        self._metadata = metadata
        self.election: Member | None = None
        self._store: Store | None = None
        self._promoter: Promoter | None = None
        self._host: Host | None = None
        self._task: asyncio.Task[None] | None = None
        self.following = ""
        """The leader whose feed this server replicates now ("" while it replicates none)."""
        self.deposed = ""
        """Why this member cannot replicate the leader, for people ("" when it can)."""
        self.rejoin_failed: dict[tuple[str, int], str] = {}
        """The leaderships (address, epoch) that a start-up rejoin of this process failed
        against, and why: not tried again in this process."""
        self._leading = 0
        """The epoch this folder has taken as the leader (0: none yet): writes wait for it,
        not only for the election (between the two, a write would carry an older epoch)."""
        self._followed_epoch = 0
        """The epoch of the leadership ``following`` was checked against."""
        self._taking = asyncio.Lock()
        """One role change at a time (the role loop's, or a re-check after a divergence)."""
        self._rechecks: set[asyncio.Task[None]] = set()
        self._sync: SyncTracker | None = None
        self._publisher: SyncSetPublisher | None = None
        self._publishing: tuple[int, asyncio.Task[None]] | None = None
        """The epoch whose synchronous set is being published, and the task that does it."""
        self._indexing: asyncio.Task[None] | None = None
        """Indexing what an older server wrote, once this member leads (``_index_old_sessions``)."""

    # -- the interface the server uses -----------------------------------------------------------

    @property
    def role(self) -> Role:
        return self.election.role if self.election is not None else Fenced("starting")

    def may_write(self) -> bool:
        """True while this member leads with a live lease, at the epoch its folder took; any
        thread (the writer's hook)."""
        election = self.election
        if election is None or not election.may_write():
            return False
        role = election.role
        return isinstance(role, Lead) and role.epoch == self._leading

    def refusal(self) -> errors.NotPrimary | None:
        """The NOT_PRIMARY a write gets now (None while this member may write): naming the
        leader when one is known, else no one (try the other members)."""
        if self.may_write():
            return None
        role = self.role
        known = 0 if self._store is None else self._store.writer.lead.epoch
        group = self.settings.group
        if isinstance(role, Follow):
            return errors.NotPrimary(
                f"this server is a replica in group '{group}', whose leader is {role.address} "
                f"(epoch {role.epoch}): send writes there",
                primary=role.address,
                epoch=max(known, role.epoch),
            )
        why = self._why_not_writing(role)
        return errors.NotPrimary(
            f"this server takes no writes: it knows no leader of group '{group}' ({why}); try "
            "the group's other members",
            primary="",
            epoch=known,
        )

    def serving(self, replica_current: bool) -> bool:
        """What health says: leading with a live lease, or replicating the current leader
        (``replica_current``: connected to it once, caught up, not diverged)."""
        role = self.role
        if isinstance(role, Lead):
            return self.may_write()
        if isinstance(role, Follow):
            return self.following == role.address and replica_current and not self.deposed
        return False

    def note_commit(self) -> None:
        """A commit moved the store's feed: publish the new progress (at the next chance)."""
        if self.election is not None and self._store is not None:
            self.election.set_progress(_progress(self._store))

    def status(self) -> rpb.ClusterStatus:
        """The group as this member sees it, for GetReplicationStatus."""
        facts = self.election.status() if self.election is not None else {}
        role = self.role
        out = rpb.ClusterStatus(
            group=self.settings.group,
            member=self.settings.name,
            leader=str(facts.get("leader", "")),
            epoch=int(facts.get("epoch", 0)),
            lease=int(facts.get("lease", 0)),
            etcd_endpoint=str(facts.get("etcd_endpoint", "")),
            blocked_by=list(facts.get("blocked_by", [])),
            deposed=self.deposed,
        )
        if isinstance(role, Lead) and self.may_write():
            out.role = rpb.CLUSTER_ROLE_LEADER
            out.lease_remaining.FromNanoseconds(round(float(facts["deadline_seconds"]) * 1e9))
        elif isinstance(role, Follow):
            out.role = rpb.CLUSTER_ROLE_FOLLOWER
        else:
            out.role = rpb.CLUSTER_ROLE_FENCED
            out.reason = self._why_not_writing(role)
        return out

    def _why_not_writing(self, role: Role) -> str:
        if isinstance(role, Fenced):
            return role.reason
        if isinstance(role, Lead) and self.election is not None and self.election.may_write():
            return f"taking epoch {role.epoch}"
        return election.LEASE_LAPSED

    # -- start-up --------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Before the store opens: when this folder holds changes that the leader etcd names
        does not, rebuild it without them (a rejoin). Anything that stands in the way (etcd or
        the leader unreachable, no leader) only leaves it to the running member."""
        mine = await asyncio.to_thread(_read_folder, self.data)
        leader = await self._read_leader() if mine is not None else None
        if mine is None or leader is None or leader[0] == self.settings.advertise:
            return
        record, head = mine
        address, epoch = leader
        deadline = time.monotonic() + PREPARE_SECONDS
        status = await self._status(address)
        while status is None or not _leads(status, epoch):
            if time.monotonic() > deadline:
                log.warning(
                    "the leader etcd names does not say it leads: starting without checking "
                    "whether this folder must rejoin it",
                    extra={"leader": address, "epoch": epoch},
                )
                return
            await asyncio.sleep(STATUS_RETRY_SECONDS)
            status = await self._status(address)
        cut = _cut(record, head, status)
        if cut > head:
            return
        log.warning(
            "this folder holds changes the group's leader does not: rejoining it before serving",
            extra={"leader": address, "epoch": status.epoch, "first_discarded": cut, "head": head},
        )
        try:
            done = await asyncio.to_thread(self._rejoin, address)
        except (
            rejoin.RejoinRefused,
            rebuild.RebuildRefused,
            grpc.RpcError,
            lmdb.Error,
            OSError,
            errors.SessionLogError,
        ) as exc:
            why = str(exc) if not isinstance(exc, grpc.RpcError) else f"{exc.code().name}"
            self.rejoin_failed[(address, epoch)] = why
            log.error(
                "could not rejoin the group's leader; this member serves reads only, and "
                "replicates nothing until its folder is resynced",
                extra={"leader": address, "why": why},
            )
            return
        _log_discarded(done)

    def _rejoin(self, address: str) -> rejoin.Rejoined:
        channel = self._blocking_channel_factory(address)
        try:
            return rejoin.rejoin(
                self.data, address, channel, REJOIN_TIMEOUT_SECONDS, self._metadata
            )
        finally:
            channel.close()

    async def _read_leader(self) -> tuple[str, int] | None:
        def read() -> tuple[str, int] | None:
            endpoints = Endpoints(self.settings.endpoints, self.timing.call_timeout)
            try:
                return election.read_leader(endpoints, self.settings.group)
            finally:
                endpoints.close()

        try:
            return await asyncio.to_thread(read)
        except (EtcdUnavailable, EtcdError) as exc:
            log.warning("cannot read the group's leader at start-up", extra={"error": str(exc)})
            return None

    # -- running ---------------------------------------------------------------------------------

    def start(
        self, store: Store, promoter: Promoter, host: Host, sync: SyncTracker | None = None
    ) -> None:
        """Join the election and follow its roles (in the running loop). With ``sync``, a
        leader publishes its synchronous set (``cluster.syncset``)."""
        self._store, self._promoter, self._host = store, promoter, host
        if sync is not None:
            self._sync = sync
            if sync.required:
                sync.lead(floor=0)  # grouped from the start: no acknowledgement without a set
            self._publisher = SyncSetPublisher(
                self.settings, sync, self.timing.call_timeout, self.timing.retry_interval
            )
        self.election = Member(self.settings, progress=_progress(store), timing=self.timing)
        self.election.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Leave the group: writes stop at once, and the lease is revoked so that another
        member may lead without waiting for it to run out."""
        publishing = self._publishing[1] if self._publishing is not None else None
        running = (self._task, publishing, self._indexing, *self._rechecks)
        tasks = [t for t in running if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.election is not None:
            await self.election.stop()
        if self._publisher is not None:
            self._publisher.close()

    def replica_diverged(self) -> None:
        """The leader refused this member's position (HISTORY_DIVERGED) although the epoch
        histories agreed when it began to follow: check again, which rejoins when they part
        now (a leader that itself rejoined, say)."""
        if not isinstance(self.role, Follow):
            return
        self.following, self._followed_epoch = "", 0
        task = asyncio.create_task(self._take(self.role, after_divergence=True))
        self._rechecks.add(task)
        task.add_done_callback(self._rechecks.discard)

    async def _run(self) -> None:
        assert self.election is not None
        async for role in self.election.roles():
            await self._take(role)

    async def _take(self, role: Role, after_divergence: bool = False) -> None:
        assert self._host is not None
        async with self._taking:
            try:
                if isinstance(role, Lead):
                    await self._lead(role)
                elif isinstance(role, Follow):
                    await self._stop_publishing()
                    await self._follow(role, after_divergence)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("a cluster role change failed", extra={"role": repr(role)})
            await self._host.refresh()

    async def _lead(self, role: Lead) -> None:
        assert self._promoter is not None
        try:
            await self._promoter.lead(role.epoch)
        except errors.StaleEpoch as exc:
            log.error(
                "cannot take the epoch the election gave: resigning from the group",
                extra={"epoch": role.epoch, "why": exc.message},
            )
            assert self.election is not None
            await self.election.stop()
            return
        await self._start_publishing(role.epoch)  # before a write may be acknowledged
        self._leading = role.epoch
        self.following, self._followed_epoch, self.deposed = "", 0, ""
        self._index_old_sessions()

    def _index_old_sessions(self) -> None:
        """A leader gives the sessions an older server wrote their index entries, as a static
        primary does at start (``server.index_old_sessions``); the followers get those writes
        like any other. In the background, so a large store holds up no role change; a leader
        deposed meanwhile has its writes refused, and the next one starts again."""
        store = self._store
        if store is None or (self._indexing is not None and not self._indexing.done()):
            return
        if store.unindexed():
            self._indexing = asyncio.create_task(_reindex(store))

    async def _start_publishing(self, epoch: int) -> None:
        """A leadership at ``epoch``: its synchronous set starts empty (nothing is acknowledged
        until etcd holds one) and is published from now on; the same epoch again (a lease that
        survived a stall) keeps the set it has."""
        store, sync, publisher = self._store, self._sync, self._publisher
        if sync is None or publisher is None or store is None:
            return
        running = self._publishing
        if running is not None and running[0] == epoch and not running[1].done():
            return
        await self._stop_publishing()
        if sync.required:
            sync.lead(floor=store.head()[0])
        self._publishing = (epoch, asyncio.create_task(publisher.run(epoch)))

    async def _stop_publishing(self) -> None:
        """Another member leads: this one acknowledges nothing more, publishes nothing."""
        running, self._publishing = self._publishing, None
        if running is not None:
            running[1].cancel()
            await asyncio.gather(running[1], return_exceptions=True)
        if self._sync is not None:
            self._sync.stand_down()

    async def _follow(self, role: Follow, after_divergence: bool = False) -> None:
        store, host = self._store, self._host
        assert store is not None
        assert host is not None
        record = store.leadership()
        if record.may_write and record.history:
            before, after = await asyncio.wrap_future(store.submit_fence(role.epoch, role.address))
            if before.may_write and not after.may_write:
                log.warning(
                    "deposed: another member leads the group; this server takes no more writes",
                    extra={
                        "epoch": before.epoch,
                        "newer_epoch": role.epoch,
                        "leader": role.address,
                    },
                )
        if self.following == role.address and self._followed_epoch == role.epoch:
            return
        await host.stop_following()
        self.following, self._followed_epoch = "", 0
        status = await self._leader_status(role)
        if status is None:  # the role changed meanwhile
            return
        record, head = store.leadership(), store.head()[0]
        cut = _cut(record, head, status)
        if cut <= head:
            self._deposed(role, cut, head)
            return
        if after_divergence:
            # The epochs agree, the checksums do not: the stores part earlier than any epoch
            # says (a restored backup, say). No rejoin can fix that, and following again would
            # only be refused again.
            self.deposed = (
                f"the leader {role.address} refused this folder's position although their epoch "
                "histories agree: the stores part earlier. Stop this server, move its folder "
                "aside with `sessionlog replica resync --data DIR --force`, and start it again"
            )
            log.error("diverged from the leader; not following it", extra={"leader": role.address})
            return
        self.deposed = ""
        if record.role != leadership.REPLICA or record.primary != role.address:
            change = store.submit_leadership(
                lambda current, _: leadership.following(current, role.address),
                follows=role.address,
            )
            await asyncio.wrap_future(change)
        await host.follow(role.address)
        self.following, self._followed_epoch = role.address, role.epoch
        log.info(
            "following the group's leader", extra={"leader": role.address, "epoch": role.epoch}
        )

    async def _leader_status(self, role: Follow) -> rpb.GetReplicationStatusResponse | None:
        """The leader's status once it says that it leads at the role's epoch or later (it
        takes its epoch a moment after winning it; a feed reader naming that epoch before then
        would fence it); None once the role is another."""
        assert self.election is not None
        waited_since = time.monotonic()
        said = False
        while self.election.role == role:
            status = await self._status(role.address)
            if status is not None and _leads(status, role.epoch):
                return status
            if not said and time.monotonic() - waited_since > 4 * self.settings.lease_ttl:
                log.warning(
                    "the group's leader does not say it leads yet; waiting",
                    extra={"leader": role.address, "epoch": role.epoch},
                )
                said = True
            await asyncio.sleep(STATUS_RETRY_SECONDS)
        return None

    async def _status(self, address: str) -> rpb.GetReplicationStatusResponse | None:
        channel = self._channel_factory(address)
        try:
            call = channel.unary_unary(
                "/sessionlog.v1.ReplicationService/GetReplicationStatus",
                request_serializer=rpb.GetReplicationStatusRequest.SerializeToString,
                response_deserializer=rpb.GetReplicationStatusResponse.FromString,
            )
            reply: rpb.GetReplicationStatusResponse = await call(
                rpb.GetReplicationStatusRequest(),
                timeout=STATUS_TIMEOUT_SECONDS,
                metadata=self._metadata or None,
            )
            return reply
        except grpc.aio.AioRpcError:
            return None
        finally:
            await channel.close()

    def _deposed(self, role: Follow, cut: int, head: int) -> None:
        leader = role.address
        why = (
            f"this folder holds changes {cut}..{head} that the leader {leader} does not have "
            "(written here in an epoch that a newer one replaced)"
        )
        failed = self.rejoin_failed.get((leader, role.epoch))
        if failed:
            self.deposed = (
                f"{why}, and rejoining it failed at start-up: {failed}. Stop this server, move "
                "its folder aside with `sessionlog replica resync --data DIR --force`, and start "
                "it again"
            )
            log.error("deposed and cannot rejoin", extra={"leader": leader, "why": failed})
            return
        self.deposed = f"{why}: it restarts to rejoin it (`sessionlog serve` does so by itself)"
        log.warning(
            "deposed with changes of its own: restarting in place to rejoin the leader",
            extra={"leader": leader, "first_discarded": cut, "head": head},
        )
        assert self._host is not None
        self._host.restart(self.deposed)


async def _reindex(store: Store) -> None:
    try:
        added = await store.reindex_on_loop()
    except errors.SessionLogError as error:
        log.warning("could not index the sessions of an older server", extra={"error": str(error)})
        return
    log.info("indexed the sessions of an older server", extra={"entries": added})


def _leads(status: rpb.GetReplicationStatusResponse, epoch: int) -> bool:
    return status.state == rpb.REPLICATION_STATE_PRIMARY and status.epoch >= epoch


def _cut(record: Leadership, head: int, status: rpb.GetReplicationStatusResponse) -> int:
    """The first position at which this folder's feed and the leader's may differ (see
    ``leadership.divergence``); past ``head`` when this folder holds nothing the leader lacks."""
    theirs = tuple((e.epoch, e.first_position) for e in status.epoch_history)
    return leadership.divergence(record.history, theirs, min(head, status.position) + 1)


def _progress(store: Store) -> Progress:
    position = store.head()[0]
    return Progress(leadership.epoch_at(store.leadership().history, position), position)


def _read_folder(data: Path) -> tuple[Leadership, int] | None:
    """The folder's leadership record and head, read without opening it for writing; None
    when there is no store yet, or one that the server's own open will report on."""
    if not (data / folder.DATA_FILE).is_file():
        return None
    try:
        env, tables = open_readonly(str(data))
    except (lmdb.Error, DamagedStore, errors.SessionLogError, OSError):
        return None
    try:
        with env.begin() as txn:
            return leadership.read(txn, tables), changes.head(txn, tables)[0]
    finally:
        env.close()


def _log_discarded(done: rejoin.Rejoined) -> None:
    """The rejoin's discarded changes, one line each (as `replica rejoin` prints them)."""
    discarded = done.rebuilt.discarded
    for record in discarded[:REPORTED_DISCARDS]:
        seqs = f"seqs {record.seqs[0]}..{record.seqs[-1]}" if record.seqs else "no events"
        log.warning(
            "rejoin discarded a change the leader never had",
            extra={
                "position": record.position,
                "epoch": record.epoch,
                "kind": record.kind,
                "session_id": record.session_id,
                "seqs": seqs,
                "request_ids": record.request_ids,
            },
        )
    if len(discarded) > REPORTED_DISCARDS:
        log.warning(
            "rejoin discarded more changes; the report names every one",
            extra={"more": len(discarded) - REPORTED_DISCARDS, "report": str(done.report)},
        )
