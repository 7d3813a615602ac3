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
from sessionlog.config import DEFAULT_SYNC_TIMEOUT_SECONDS
from sessionlog.stats import SECONDS_BUCKETS, Histogram

log = logging.getLogger(__name__)

ACK_LOCAL, ACK_REPLICA = "local", "replica"
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
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        """A heap of (position, arrival, future): the writes waiting, lowest position first."""
        self._arrivals = itertools.count()
        self._streams = itertools.count(1)
        self._closed = False
        self._failing = 0
        """Writes failed since the last acknowledged one (0: acknowledging); logged per episode."""

    @property
    def ack(self) -> str:
        return ACK_REPLICA if self.required else ACK_LOCAL

    def replicas(self) -> list[ReplicaProgress]:
        """Every replica remembered, by name."""
        return [self._replicas[name] for name in sorted(self._replicas)]

    def counting(self) -> int:
        return sum(replica.counts for replica in self._replicas.values())

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
            gone = [r for r in self._replicas.values() if not r.connected]
            if not gone:
                return
            oldest = min(gone, key=lambda replica: replica.report_ns)
            del self._replicas[oldest.name]

    def _advance(self) -> None:
        """Recompute the sync position and acknowledge every write it now covers."""
        if not self.required:
            return
        positions = sorted((r.position for r in self._replicas.values() if r.counts), reverse=True)
        self.sync_position = positions[self.required - 1] if len(positions) >= self.required else 0
        waiting = self._waiting
        while waiting and waiting[0][0] <= self.sync_position:
            future = heapq.heappop(waiting)[2]
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
        heapq.heappush(self._waiting, (position, next(self._arrivals), future))
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
        for position, _, future in waiting:
            if not future.done():
                future.set_exception(self._unavailable(position, "this server is shutting down"))

    def _purge(self) -> None:
        """Drop the futures of writes that gave up, once they are most of the heap."""
        done = sum(entry[2].done() for entry in self._waiting)
        if done * 2 > len(self._waiting):
            self._waiting = [entry for entry in self._waiting if not entry[2].done()]
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
