"""Synchronous replication: with ``--ack replica`` a primary acknowledges a write only once
``--sync-replicas`` K replicas report holding it durably.

    client ─Append─▶ primary: writer commits at position P ─▶ SyncTracker.wait(P) ─▶ reply
                                                                  ▲ resolved when K replicas
    replica: applies a batch, commits, syncs ─ReportProgress(position, checksum)─┘ report >= P

Invariants:

- a replica *counts* only while its report stream is open, every position that stream
  reported carried the primary's own checksum there, and its newest report named the primary's
  own epoch: a replica on another history (or ahead of this primary's head) never counts, and
  the mismatch is logged once per stream; one that has not yet seen this primary's epoch counts
  from its next report that names it (a replica naming a *higher* epoch deposes this primary:
  the servicer fences it before the report reaches the tracker);
- the *sync position* is the K-th highest position among the counting replicas. Positions are
  dense and a replica applies them in order, so a replica at Q holds every change up to Q: a
  write at P is acknowledged once the sync position is >= P;
- a write that wrote nothing (a replayed request id, an empty append) waits for the feed's head
  when it ran, which covers the write it replays: a retry after REPLICAS_UNAVAILABLE returns the
  original result only once enough replicas hold it;
- a wait that runs out raises ``ReplicasUnavailable``. The write stays committed on the primary
  (LMDB has synced it; nothing is rolled back) and the error says so. There is no silent
  downgrade to a local acknowledgement;
- the tracker belongs to the event loop's thread: reports and waits are never concurrent.

A cluster leader (``--cluster`` with ``--ack replica``) works with a *synchronous set* instead
of the K fastest replicas (``lead``): the replicas that hold every write it acknowledged, which
it publishes in etcd (``members.SyncSet``, put by ``cluster.syncset``) so that only they may
take over from it. Then:

- a write is acknowledged once every member of the set holds it, and only while the set that
  etcd confirmed has at least K members: a replica counts only once a put naming it landed;
- the set changes only through etcd, in this order: the publisher announces a set it is about
  to put (``publishing``), and from then until a put lands, writes wait for the members of
  every set announced as well as the confirmed one; a replica joins (``wanted``) only when it
  holds every write acknowledged so far (at least this leadership's ``floor``, the store's
  head when it took its epoch); a member leaves when it no longer counts or holds less than
  was acknowledged, or when it has held up a waiting write for ``lag_grace`` while the others
  have it, and never below K members.
  So every set etcd may hold names only members that hold every acknowledged write.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sessionlog import errors
from sessionlog.defaults import DEFAULT_SYNC_TIMEOUT_SECONDS
from sessionlog.stats import SECONDS_BUCKETS, Histogram

log = logging.getLogger(__name__)

ACK_LOCAL, ACK_REPLICA = "local", "replica"
DEFAULT_LAG_GRACE_SECONDS = 1.0
"""How long a member of the synchronous set may hold up a write that the others hold before it
leaves the set (a frozen replica whose stream stays open); a cap, see ``SyncTracker``."""
MAX_REPLICAS_KEPT = 64
"""Replicas the status remembers; past it, the one that reported least recently and is no
longer connected is forgotten (names come from the replicas, so they are bounded here)."""


@dataclass
class ReplicaProgress:
    """One replica as its reports describe it."""

    name: str
    peer: str = ""
    position: int = 0
    """The newest position it reported holding durably."""
    connected: bool = False
    matches: bool = True
    """Every position its current stream reported had this primary's checksum there."""
    epoch: int = 0
    """The epoch its newest report named."""
    same_epoch: bool = True
    """Its newest report named this primary's epoch (reports of another epoch do not count)."""
    report_ns: int = 0
    detail: str = ""
    """Why it does not count, for people."""
    stream: int = 0
    """The stream that reports for it now (a newer stream with its name replaces an older)."""

    @property
    def counts(self) -> bool:
        return self.connected and self.matches and self.same_epoch


@dataclass
class SyncStats:
    """Counters for the metrics. Event loop only."""

    waits: Histogram = field(default_factory=lambda: Histogram(SECONDS_BUCKETS))
    """How long acknowledged writes waited for their replicas."""
    timeouts: int = 0
    """Writes that failed REPLICAS_UNAVAILABLE."""
    mismatches: int = 0
    """Report streams found on another history."""


class SyncTracker:
    """Each replica's reported position, and the writes waiting for enough of them.

    ``checksum_at`` reads this primary's checksum of its change at a position (None when it has
    none there). ``required`` is K (0 with ``--ack local``: nothing waits, reports are still
    kept for the status)."""

    def __init__(
        self,
        checksum_at: Callable[[int], bytes | None],
        required: int = 0,
        timeout_seconds: float = DEFAULT_SYNC_TIMEOUT_SECONDS,
    ) -> None:
        self.required = required
        self.timeout_seconds = timeout_seconds
        self.stats = SyncStats()
        self.sync_position = 0
        """The K-th highest position among counting replicas (0 while fewer than K count)."""
        self._checksum_at = checksum_at
        self._replicas: dict[str, ReplicaProgress] = {}
        self._waiting: list[tuple[int, int, float, asyncio.Future[None]]] = []
        """A heap of (position, arrival, monotonic start, future): the writes waiting, lowest
        position first."""
        self._arrivals = itertools.count()
        self._streams = itertools.count(1)
        self._closed = False
        self._failing = 0
        """Writes failed since the last acknowledged one (0: acknowledging); logged per episode."""
        self.grouped = False
        """Acknowledgements follow the synchronous set (a cluster leader; module docstring)."""
        self.members: frozenset[str] = frozenset()
        """The synchronous set etcd confirmed for this leadership (grouped only)."""
        self._announced: frozenset[str] = frozenset()
        """Every member of a set announced since ``members`` was confirmed: etcd may hold it."""
        self._target: frozenset[str] | None = None
        """The set last announced (None: none yet in this leadership)."""
        self._acked = 0
        """Every write at or below this position may have been acknowledged (grouped only)."""
        self.lag_grace = min(DEFAULT_LAG_GRACE_SECONDS, timeout_seconds / 4)
        self.on_change: Callable[[], None] | None = None
        """Called when the set ``wanted`` may have changed (a report, a stream's end)."""

    @property
    def ack(self) -> str:
        return ACK_REPLICA if self.required else ACK_LOCAL

    def replicas(self) -> list[ReplicaProgress]:
        """Every replica remembered, by name."""
        return [self._replicas[name] for name in sorted(self._replicas)]

    def counting(self) -> int:
        return sum(replica.counts for replica in self._replicas.values())

    # -- the synchronous set (a cluster leader) -------------------------------------------------

    def lead(self, floor: int) -> None:
        """A leadership begins with an empty set: nothing is acknowledged until etcd confirms
        one with K members, each holding ``floor`` (every write of earlier leaderships that
        this leader holds) and every write acknowledged since."""
        self.grouped = True
        self.members, self._announced, self._target = frozenset(), frozenset(), None
        self._acked = floor
        self._advance()

    def stand_down(self) -> None:
        """The leadership ended: no set, nothing more is acknowledged."""
        if self.grouped:
            self.lead(0)

    def wanted(self, now: float | None = None) -> frozenset[str] | None:
        """The set to publish now, None while the one last announced stands (see the module
        docstring for who joins and who leaves)."""
        if not self.grouped or not self.required:
            return None
        now = time.monotonic() if now is None else now
        base = self.members if self._target is None else self._target
        # A member that reports less than was acknowledged (a new stream from a folder that
        # lost data) no longer holds what it must: it leaves like one that does not count.
        keep = {name for name in base if self._counts(name) and self._holds(name) >= self._acked}
        if self._waiting:
            position, _, started, _ = self._waiting[0]
            if now - started >= self.lag_grace:
                held_up = {name for name in keep if self._holds(name) < position}
                if len(keep) - len(held_up) >= self.required:
                    keep -= held_up
        joining = {
            replica.name
            for replica in self._replicas.values()
            if replica.counts and replica.name not in base and replica.position >= self._acked
        }
        wanted = frozenset(keep | joining)
        if len(wanted) < self.required:
            wanted = frozenset(base | joining)  # leaving would not let a write through
        if self._target is None:
            # Nothing announced yet in this leadership: the set a previous leader published
            # stands until this one has a member to name (it acknowledged nothing without one).
            return wanted or None
        return None if wanted == base else wanted

    def publishing(self, members: frozenset[str]) -> None:
        """The publisher is about to put ``members``: from now on writes wait for them too."""
        self._target = members
        self._announced |= members
        self._advance()

    def published(self, members: frozenset[str]) -> None:
        """etcd holds ``members`` (a put of it landed, after every earlier one)."""
        if members != self.members:
            log.info(
                "synchronous set published",
                extra={"members": sorted(members), "previous": sorted(self.members)},
            )
        self.members, self._announced = members, frozenset()
        self._advance()

    def detail(self, replica: ReplicaProgress) -> str:
        """What the status says of ``replica``: why it does not count, or, on a cluster leader,
        that it counts but is not (yet) one of the members that may take over."""
        if replica.detail or not self.grouped or not replica.counts:
            return replica.detail
        if replica.name in self.members:
            return ""
        return (
            "not in this leader's synchronous set (yet): it joins once it holds every "
            "acknowledged write, and only its members may take over from this leader"
        )

    def _counts(self, name: str) -> bool:
        replica = self._replicas.get(name)
        return replica is not None and replica.counts

    def _holds(self, name: str) -> int:
        """The position ``name`` holds of this history (0: none known, or another history)."""
        replica = self._replicas.get(name)
        if replica is None or not replica.matches or not replica.same_epoch:
            return 0
        return replica.position

    # -- reports --------------------------------------------------------------------------------

    def open_stream(self) -> int:
        """A token for one ReportProgress stream, given back to ``report`` and ``close_stream``."""
        return next(self._streams)

    def report(
        self,
        stream: int,
        name: str,
        peer: str,
        position: int,
        checksum: bytes,
        *,
        epoch: int = 0,
        current_epoch: int = 0,
    ) -> None:
        """A replica that knows ``epoch`` holds every change up to ``position``, whose checksum
        is ``checksum``; ``current_epoch`` is this primary's own epoch now."""
        replica = self._replicas.get(name)
        if replica is None:
            replica = self._replicas[name] = ReplicaProgress(name)
            self._changed()
        if replica.stream != stream:
            replica.stream, replica.peer = stream, peer
            replica.connected, replica.matches, replica.same_epoch = True, True, True
            replica.detail = ""
            log.info("replica reports its progress", extra={"replica": name, "peer": peer})
        replica.position = position
        replica.report_ns = time.time_ns()
        self._forget_old()  # after this one is connected: it is never the one forgotten
        if replica.matches:
            why = self._mismatch(position, checksum)
            if why:
                replica.matches, replica.detail = False, why
                self.stats.mismatches += 1
                log.warning(
                    "a replica reports another history; it does not count for --ack replica",
                    extra={"replica": name, "peer": peer, "position": position, "why": why},
                )
        self._note_epoch(replica, epoch, current_epoch)
        self._advance()
        self._changed()

    def _changed(self) -> None:
        if self.grouped and self.on_change is not None:
            self.on_change()

    @staticmethod
    def _note_epoch(replica: ReplicaProgress, epoch: int, current_epoch: int) -> None:
        """A report counts only when it names this primary's epoch; unlike a checksum that is
        not the primary's, another epoch is not for good: the next report may name it."""
        replica.epoch = epoch
        same = epoch == current_epoch
        if same == replica.same_epoch:
            return
        replica.same_epoch = same
        if not replica.matches:
            return  # the checksum's detail stands: it never counts on this stream anyway
        replica.detail = (
            ""
            if same
            else (
                f"it reports epoch {epoch}, not this primary's epoch {current_epoch}: it counts "
                "again once it reports this primary's epoch"
            )
        )

    def close_stream(self, stream: int) -> None:
        """The stream ended: its replica no longer counts (its position stays, for the status)."""
        for replica in self._replicas.values():
            if replica.stream == stream and replica.connected:
                replica.connected = False
                replica.detail = replica.detail or "its progress stream is closed (disconnected)"
                log.info(
                    "replica stopped reporting",
                    extra={"replica": replica.name, "position": replica.position},
                )
        self._advance()
        self._changed()

    def _mismatch(self, position: int, checksum: bytes) -> str:
        """Why a replica at ``position`` with ``checksum`` is not on this history ("" if it is)."""
        if position == 0:
            return ""
        mine = self._checksum_at(position)
        if mine is None:
            return (
                f"it reports position {position}, which this primary does not hold: its data is "
                "not on this primary's history; resync it (sessionlog replica resync)"
            )
        if mine != checksum:
            return (
                f"its checksum at position {position} is not this primary's: its data is not on "
                "this primary's history; resync it (sessionlog replica resync)"
            )
        return ""

    def _forget_old(self) -> None:
        while len(self._replicas) > MAX_REPLICAS_KEPT:
            listed = self.members | self._announced
            gone = [r for r in self._replicas.values() if not r.connected and r.name not in listed]
            if not gone:
                return
            oldest = min(gone, key=lambda replica: replica.report_ns)
            del self._replicas[oldest.name]

    def _advance(self) -> None:
        """Recompute the sync position and acknowledge every write it now covers."""
        if not self.required:
            return
        if self.grouped:
            waited = self.members | self._announced
            enough = len(self.members) >= self.required
            self.sync_position = min(map(self._holds, waited)) if enough else 0
            self._acked = max(self._acked, self.sync_position)
        else:
            positions = sorted(
                (r.position for r in self._replicas.values() if r.counts), reverse=True
            )
            enough = len(positions) >= self.required
            self.sync_position = positions[self.required - 1] if enough else 0
        waiting = self._waiting
        while waiting and waiting[0][0] <= self.sync_position:
            future = heapq.heappop(waiting)[3]
            if not future.done():
                future.set_result(None)

    # -- waits ----------------------------------------------------------------------------------

    async def wait(self, position: int) -> None:
        """Return once ``required`` replicas hold ``position``; ReplicasUnavailable after
        ``timeout_seconds`` (the write stays committed here)."""
        if not self.required:
            return
        if position <= self.sync_position:
            self.stats.waits.observe(0.0)
            self._recovered(position)
            return
        if self._closed:
            raise self._unavailable(position, "this server is shutting down")
        started = time.perf_counter()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (position, next(self._arrivals), time.monotonic(), future))
        self._changed()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await future
        except TimeoutError:
            self.stats.timeouts += 1
            self._purge()
            error = self._unavailable(position)
            if not self._failing:
                log.warning(
                    "writes fail REPLICAS_UNAVAILABLE: too few replicas hold them within "
                    "--sync-timeout (they stay committed here)",
                    extra={**error.metadata, "counting": self.counting()},
                )
            self._failing += 1
            raise error from None
        self.stats.waits.observe(time.perf_counter() - started)
        self._recovered(position)

    def _recovered(self, position: int) -> None:
        """A write was acknowledged: end a failure episode, if any, with one line."""
        if self._failing:
            log.warning(
                "writes are acknowledged by enough replicas again",
                extra={"failed": self._failing, "position": position},
            )
            self._failing = 0

    def close(self) -> None:
        """Shutting down: every waiting write fails now rather than at its timeout."""
        self._closed = True
        waiting, self._waiting = self._waiting, []
        for position, _, _, future in waiting:
            if not future.done():
                future.set_exception(self._unavailable(position, "this server is shutting down"))

    def _purge(self) -> None:
        """Drop the futures of writes that gave up, once they are most of the heap."""
        done = sum(entry[3].done() for entry in self._waiting)
        if done * 2 > len(self._waiting):
            self._waiting = [entry for entry in self._waiting if not entry[3].done()]
            heapq.heapify(self._waiting)

    def _unavailable(self, position: int, why: str = "") -> errors.ReplicasUnavailable:
        counted = sum(
            replica.counts and replica.position >= position for replica in self._replicas.values()
        )
        why = why or (
            f"{self.counting()} replicas count now (connected and on this history) of "
            f"{len(self._replicas)} known; see GetReplicationStatus"
        )
        return errors.ReplicasUnavailable(
            f"the write is committed on this primary (change position {position}) but only "
            f"{counted} of the {self.required} replicas it must reach (--sync-replicas) reported "
            f"holding it within {self.timeout_seconds:g} s (--sync-timeout): {why}. Retrying "
            "with the same request id is safe: it returns the original result once enough "
            "replicas hold it",
            needed=self.required,
            counted=counted,
            position=position,
        )
