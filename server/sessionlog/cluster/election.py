"""Leader election for one group of members, through etcd: who leads, at which epoch, and
until when the leader may write.

    member = Member(settings, progress=Progress(epoch, position))
    member.start()
    async for role in member.roles():     # Lead(epoch) | Follow(address, epoch) | Fenced(reason)
        ...
    member.may_write()                    # any thread; False unless leading with a live deadline
    member.set_progress(Progress(epoch, position))   # after every durable commit
    await member.stop()                   # resign: revoke the lease, the leader key goes with it

How it works (the keys are in ``members``):
- One lease per member, TTL ``--lease-ttl``, renewed every TTL/3 by a task of its own on an
  ``Etcd`` of its own; a failed renewal is retried at once on the next endpoint, then every
  ``retry_interval``. A renewal that answers "no such lease" ends the lease: a new one is taken,
  and any leadership held under the old one is over.
- The member's record (address, progress) is put under ``members/ID`` with that lease whenever
  it changed, at most every ``publish_interval``, at once when the leader key is vacant.
- The control task reads the leader key every ``poll_interval``. Ours (attached to our lease):
  Lead(its create_revision). Someone else's: Follow(its value). Absent: Fenced("no leader"),
  and, once the vacancy is ``settle`` old (every member has had time to publish its final
  progress), campaign: read ``members/`` and ``sync``, stand down while a synchronous set is
  published that names neither this member nor it as the set's leader (``sync_blockers``: the
  group stays without a leader until one of them returns) or while any live member is ahead
  (``members_ahead``), else one transaction that creates the leader key if absent *and* if
  neither a member record nor the set was written since those reads, so a member that caught
  up meanwhile wins instead.
- ``may_write()`` is true only while leading and before ``LeaseDeadline``: TTL/2 after the last
  renewal that succeeded, counted from before that renewal was sent. A watchdog task turns the
  role to Fenced at that moment; ``may_write()`` itself needs no task to be right.

The leader key is polled rather than watched: a range on one key is cheap, every poll is
bounded, and it costs at most ``poll_interval`` of failover time (which is dominated by the
TTL); etcd3gw's watch opens its stream without a timeout and does not report its end.
Lead(E) may follow Fenced with the same E: the lease survived a stall, and the key with it; no
one else can have led in between.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sessionlog.cluster import etcd
from sessionlog.cluster.etcd import Endpoints, Etcd, EtcdError, EtcdUnavailable, KeyValue
from sessionlog.cluster.fence import LeaseDeadline
from sessionlog.cluster.members import (
    GroupKeys,
    MemberRecord,
    Progress,
    SyncSet,
    members_ahead,
    sync_blockers,
)
from sessionlog.cluster.settings import ClusterSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lead:
    """This member leads: it may take writes (while ``may_write()``) stamped with ``epoch``."""

    epoch: int


@dataclass(frozen=True)
class Follow:
    """``address`` leads at ``epoch``: replicate from it, refuse writes with its address."""

    address: str
    epoch: int


@dataclass(frozen=True)
class Fenced:
    """No leader this member can name, or this member lost its lease: refuse writes, name no
    primary. ``reason`` says which, for logs and status."""

    reason: str


Role = Lead | Follow | Fenced

NO_LEADER = "no leader known"
LEASE_LAPSED = "lease not renewed within TTL/2"
NO_ETCD = "etcd unreachable"
WAITING_FOR_SYNC = "no leader known; waiting for a synchronous member"
"""With a synchronous set published (``members.SyncSet``), a member outside it does not
campaign: the reason names the members it waits for."""
STOPPED = "stopped"


@dataclass(frozen=True)
class Timing:
    """The member's intervals, derived from the TTL unless a test wants them otherwise."""

    keepalive_interval: float
    call_timeout: float
    poll_interval: float
    publish_interval: float
    retry_interval: float
    settle: float

    @classmethod
    def for_ttl(cls, ttl: float) -> Timing:
        # A renewal that times out (TTL/8) right after its interval (TTL/3) still leaves a
        # retry on the next endpoint before the deadline (TTL/2): 1/3 + 1/8 < 1/2.
        poll = min(0.5, ttl / 8)
        return cls(
            keepalive_interval=ttl / 3,
            call_timeout=ttl / 8,
            poll_interval=poll,
            publish_interval=1.0,
            retry_interval=min(0.2, ttl / 20),
            settle=2 * poll,
        )


class Member:
    """One member of a group; see the module docstring."""

    def __init__(
        self,
        settings: ClusterSettings,
        *,
        progress: Progress | None = None,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.keys = GroupKeys(settings.group)
        self.timing = timing or Timing.for_ttl(settings.lease_ttl)
        self.clock = clock
        self.fence = LeaseDeadline(settings.lease_ttl, clock)
        self._progress = progress or Progress()
        self._etcd = Etcd(settings.endpoints, self.timing.call_timeout, "control")
        self._keepalive_etcd = Etcd(settings.endpoints, self.timing.call_timeout, "keepalive")
        self._lease: int | None = None
        self._role: Role = Fenced(NO_LEADER)
        self._changed = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._published: tuple[int, Progress] | None = None
        self._published_at = -math.inf
        self._vacant_since: float | None = None
        self._blocked_by: tuple[str, ...] = ()
        self._waiting = ""
        """The reason of a vacancy this member may not end (WAITING_FOR_SYNC...), "" if none."""
        self._etcd_down = False
        self._keepalive_failing = False
        self.campaign_sent_at: float | None = None
        """The clock before the transaction that made this member leader was sent: the epoch
        it won did not exist before this moment."""

    # -- the interface ------------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._role

    @property
    def lease(self) -> int | None:
        return self._lease

    def may_write(self) -> bool:
        """True while this member leads and its lease deadline is ahead; any thread."""
        return not self._stopping and isinstance(self._role, Lead) and self.fence.alive()

    def leading_epoch(self) -> int | None:
        """The epoch to stamp writes with, or None when ``may_write()`` is False."""
        role = self._role
        return role.epoch if isinstance(role, Lead) and self.may_write() else None

    def set_progress(self, progress: Progress) -> None:
        """This member's durable progress now (published at the next chance)."""
        self._progress = progress

    async def roles(self) -> AsyncIterator[Role]:
        """The role now, then each change until ``stop()`` (ending with Fenced("stopped")). A
        slow reader may miss a role that was already replaced; it always gets the latest."""
        seen: Role | None = None
        while True:
            role, changed = self._role, self._changed
            if role != seen:
                seen = role
                yield role
                continue
            if self._stopping:
                return
            await changed.wait()

    def start(self) -> None:
        """Start the tasks (in the running loop); etcd need not be reachable yet."""
        assert not self._tasks, "started twice"
        for name, work in (
            ("keepalive", self._keepalive_loop()),
            ("control", self._control_loop()),
            ("watchdog", self._watchdog_loop()),
        ):
            self._tasks.append(asyncio.create_task(self._guarded(name, work)))

    async def stop(self) -> None:
        """Resign: writes stop at once, then the lease is revoked (its keys go with it, so
        another member may win without waiting for the TTL); bounded by the call budget."""
        if self._stopping:
            return
        self._stopping = True
        self.fence.reset()
        self._set_role(Fenced(STOPPED))
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Each loop also ends on _stopping, should a cancellation be lost on the way.
            _, pending = await asyncio.wait(self._tasks, timeout=self._etcd.budget)
            if pending:
                log.warning(
                    "cluster member tasks still running after stop", extra={"tasks": len(pending)}
                )
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                await self._etcd.call(lambda e: e.revoke(lease))
            except (EtcdUnavailable, EtcdError) as exc:
                log.warning(
                    "could not revoke the lease; it expires after its TTL",
                    extra={"error": str(exc)},
                )
        self._etcd.close()
        self._keepalive_etcd.close()

    def status(self) -> dict[str, Any]:
        """What status pages show: role, epoch, lease, time left, the etcd endpoint in use."""
        role = self._role
        return {
            "member": self.settings.name,
            "role": type(role).__name__.lower(),
            "epoch": getattr(role, "epoch", 0),
            "leader": role.address
            if isinstance(role, Follow)
            else (self.settings.advertise if isinstance(role, Lead) else ""),
            "reason": role.reason if isinstance(role, Fenced) else "",
            "lease": self._lease or 0,
            "deadline_seconds": max(0.0, self.fence.remaining()),
            "etcd_endpoint": self._etcd.current,
            "blocked_by": list(self._blocked_by),
        }

    # -- the tasks ------------------------------------------------------------------------------

    async def _guarded(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        """A task that must never die quietly: log and fence, then keep the member fenced."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("cluster member task failed; fencing", extra={"task": name})
            self.fence.reset()
            self._set_role(Fenced(f"{name} task failed"))

    async def _keepalive_loop(self) -> None:
        timing = self.timing
        while not self._stopping:
            lease = self._lease
            if lease is None:
                await asyncio.sleep(timing.retry_interval)
                continue
            sent_at = self.clock()
            try:
                ttl = await self._keepalive_etcd.call(
                    functools.partial(Endpoints.keepalive, lease=lease)
                )
            except (EtcdUnavailable, EtcdError) as exc:
                if not self._keepalive_failing:
                    log.warning("lease keepalive failed", extra={"lease": lease, "error": str(exc)})
                    self._keepalive_failing = True
                await asyncio.sleep(timing.retry_interval)
                continue
            if self._keepalive_failing:
                log.info("lease keepalive answered again", extra={"lease": lease, "ttl": ttl})
                self._keepalive_failing = False
            if lease != self._lease:
                continue
            if ttl <= 0:
                log.warning("lease expired in etcd", extra={"lease": lease})
                self._lease_lost(lease)
                continue
            self.fence.renewed(sent_at, ttl)
            await asyncio.sleep(max(0.0, sent_at + timing.keepalive_interval - self.clock()))

    async def _watchdog_loop(self) -> None:
        """Fenced at the deadline, even when no call returns to notice it."""
        while not self._stopping:
            remaining = self.fence.remaining()
            if isinstance(self._role, Lead) and remaining <= 0:
                log.warning("fenced: lease not renewed in time", extra={"epoch": self._role.epoch})
                self._set_role(Fenced(LEASE_LAPSED))
            wait = remaining if 0 < remaining < self.timing.poll_interval else None
            await asyncio.sleep(wait if wait is not None else self.timing.poll_interval / 2)

    async def _control_loop(self) -> None:
        while not self._stopping:
            try:
                await self._control_step()
            except EtcdUnavailable as exc:
                self._etcd_unreachable(str(exc))
            except EtcdError as exc:
                log.warning("etcd refused a call", extra={"error": str(exc)})
            else:
                if self._etcd_down:
                    log.info("etcd reachable again", extra={"endpoint": self._etcd.current})
                    self._etcd_down = False
            await asyncio.sleep(self.timing.poll_interval)

    async def _control_step(self) -> None:
        if self._lease is None:
            await self._grant()
        leader, _ = await self._etcd.call(lambda e: e.get(self.keys.leader))
        if leader is None:
            await self._vacant()
            return
        self._vacant_since, self._waiting = None, ""
        await self._publish()
        address = leader.value.decode(errors="replace")
        if self._lease is not None and leader.lease == self._lease:
            if self.fence.alive():
                self._set_role(Lead(leader.create_revision))
        elif address == self.settings.advertise:
            # A leader key with our address under another lease: this member's previous run,
            # whose lease has not expired. Following ourselves would be nonsense; wait it out.
            self._set_role(Fenced(f"{NO_LEADER}: a previous run's lease {leader.lease} lives on"))
        else:
            self._set_role(Follow(address, leader.create_revision))

    async def _vacant(self) -> None:
        now = self.clock()
        if self._vacant_since is None:
            self._vacant_since = now
            log.info("no leader in etcd", extra={"group": self.settings.group})
        self._set_role(Fenced(self._waiting or NO_LEADER))
        await self._publish(force=self._published is None or self._published[1] != self._progress)
        if now - self._vacant_since >= self.timing.settle and self.fence.alive():
            await self._campaign()

    async def _grant(self) -> None:
        sent_at = self.clock()
        lease, ttl = await self._etcd.call(lambda e: e.grant(self.settings.lease_ttl))
        if ttl != self.settings.lease_ttl:
            log.warning(
                "etcd granted another TTL than asked; failover waits for etcd's",
                extra={"asked": self.settings.lease_ttl, "granted": ttl},
            )
        self.fence.reset()
        self.fence.renewed(sent_at, ttl)
        self._lease = lease
        self._published = None
        log.info("lease granted", extra={"lease": lease, "ttl": ttl})

    async def _publish(self, force: bool = False) -> None:
        """Put this member's record when it changed: at once if ``force`` or under a new lease,
        else at most every ``publish_interval``."""
        lease, progress = self._lease, self._progress
        if lease is None or self._published == (lease, progress):
            return
        fresh_lease = self._published is None or self._published[0] != lease
        due = self.clock() - self._published_at >= self.timing.publish_interval
        if not (force or fresh_lease or due):
            return
        record = MemberRecord(self.settings.name, self.settings.advertise, progress)
        key = self.keys.member(self.settings.name)
        await self._etcd.call(lambda e: e.put(key, record.encode(), lease))
        self._published, self._published_at = (lease, progress), self.clock()

    async def _campaign(self) -> None:
        lease = self._lease
        if lease is None or self._published != (lease, self._progress):
            return
        kvs, revision = await self._etcd.call(
            lambda e: e.get_range(self.keys.members, self.keys.members_end)
        )
        mine = self._progress
        others, own = [], False
        for kv in kvs:
            member_id = kv.key[len(self.keys.members) :]
            if member_id == self.settings.name:
                own = kv.lease == lease
                continue
            try:
                others.append(MemberRecord.decode(member_id, kv.value))
            except ValueError as exc:
                # Unreadable: it may be ahead. Standing down is the safe side of not knowing.
                self._stand_down((member_id,), str(exc))
                return
        if not own:
            return
        readable, synced, sync_revision = await self._read_sync()
        if not readable:
            return
        waiting_for = sync_blockers(self.settings.advertise, synced)
        if waiting_for:
            self._stand_down(waiting_for, "not a synchronous member")
            self._waiting = f"{WAITING_FOR_SYNC}: {', '.join(waiting_for)}"
            self._set_role(Fenced(self._waiting))
            return
        self._waiting = ""
        ahead = members_ahead(mine, others)
        if ahead:
            self._stand_down(tuple(r.member_id for r in ahead), "a live member is ahead")
            return
        self._blocked_by = ()
        body = {
            "compare": [
                etcd.compare_created(self.keys.leader, 0),
                etcd.compare_unchanged_since(self.keys.members, self.keys.members_end, revision),
                etcd.compare_modified(self.keys.sync, sync_revision),
            ],
            "success": [
                etcd.request_put(self.keys.leader, self.settings.advertise.encode(), lease)
            ],
            "failure": [etcd.request_range(self.keys.leader)],
        }
        sent_at = self.clock()
        won, txn_revision, _ = await self._etcd.call(lambda e: e.txn(body))
        if not won:
            return
        self.campaign_sent_at = sent_at
        self._vacant_since = None
        log.info("won the election", extra={"epoch": txn_revision, "position": mine.position})
        if self.fence.alive() and lease == self._lease:
            self._set_role(Lead(txn_revision))

    async def _read_sync(self) -> tuple[bool, SyncSet | None, int]:
        """(readable, the synchronous set etcd holds or None, the key's mod revision, 0 when
        absent). Not readable as a set: this member does not campaign, as it cannot tell who
        may."""
        kv, _ = await self._etcd.call(lambda e: e.get(self.keys.sync))
        if kv is None:
            return True, None, 0
        try:
            return True, SyncSet.decode(kv.value), kv.mod_revision
        except ValueError as exc:
            self._stand_down(("sync",), str(exc))
            return False, None, kv.mod_revision

    # -- state changes ----------------------------------------------------------------------------

    def _stand_down(self, blockers: tuple[str, ...], why: str) -> None:
        if blockers != self._blocked_by:
            log.info("not campaigning", extra={"reason": why, "members": list(blockers)})
        self._blocked_by = blockers

    def _lease_lost(self, lease: int) -> None:
        if self._lease == lease:
            self._lease = None
            self.fence.reset()
            self._published = None
            if isinstance(self._role, Lead):
                self._set_role(Fenced(LEASE_LAPSED))

    def _etcd_unreachable(self, error: str) -> None:
        """Keep following the last known leader (its replication stream does not need etcd);
        a leader is fenced by its deadline, not by this."""
        if isinstance(self._role, Fenced):
            self._set_role(Fenced(NO_ETCD))
        if not self._etcd_down:
            log.warning("etcd unreachable", extra={"error": error})
            self._etcd_down = True

    def _set_role(self, role: Role) -> None:
        if role == self._role or (self._stopping and role != Fenced(STOPPED)):
            return
        previous, self._role = self._role, role
        log.info("cluster role changed", extra={"role": repr(role), "previous": repr(previous)})
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


def leader_of(kv: KeyValue | None) -> tuple[str, int] | None:
    """(address, epoch) of a leader key read from etcd, None when vacant."""
    return None if kv is None else (kv.value.decode(errors="replace"), kv.create_revision)


def read_leader(endpoints: Endpoints, group: str) -> tuple[str, int] | None:
    """Who leads ``group`` now (blocking): for clients and tools that only look."""
    kv, _ = endpoints.get(GroupKeys(group).leader)
    return leader_of(kv)
