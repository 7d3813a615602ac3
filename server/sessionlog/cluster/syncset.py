"""The leader's synchronous set in etcd (``members.SyncSet``): which members may take over
from it, kept in step with what its acknowledgements wait for (``sync.SyncTracker``).

    Lead(E) ─▶ SyncSetPublisher.run(E) ─ tracker.wanted() ─▶ publishing(S) ─txn─▶ published(S)

Each put is one transaction: it succeeds only while the group's leader key is the one this
member won at E (created at revision E) and the set's key was last written at the revision the
publisher knows, so that a put that timed out and lands late cannot overwrite a newer one. A
put that fails its compare reads both keys back: another leader (or none) ends the publisher;
a set written since is learned (it is one of this leadership's, or an earlier leader's), and
the put is tried again against it. A put that gets no answer may have landed or not: writes
then go on waiting for every set announced (``publishing``) until one is confirmed.

With ``--ack local`` a leader has no set: it deletes the key once, so that every member may
campaign again as without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from sessionlog.cluster import etcd
from sessionlog.cluster.etcd import Etcd, EtcdError, EtcdUnavailable
from sessionlog.cluster.members import GroupKeys, SyncSet
from sessionlog.cluster.settings import ClusterSettings
from sessionlog.cluster.sync import SyncTracker

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.1
"""How often the wanted set is checked without a report waking the publisher (a member that
holds up a write leaves the set once ``lag_grace`` has passed, which no report announces)."""


class Deposed(Exception):
    """The group's leader key is no longer the one this member won."""


class SyncSetPublisher:
    """Publishes one leadership's synchronous set; see the module docstring."""

    def __init__(
        self, settings: ClusterSettings, tracker: SyncTracker, call_timeout: float, retry: float
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.keys = GroupKeys(settings.group)
        self.retry = retry
        self._etcd = Etcd(settings.endpoints, call_timeout, "sync")
        self._revision = 0
        """The mod revision of the set's key as this publisher last saw it (0: absent)."""

    def close(self) -> None:
        self._etcd.close()

    async def run(self, epoch: int) -> None:
        """Keep the set published while this member leads at ``epoch`` (until cancelled, or
        until the leader key is another's)."""
        try:
            if not self.tracker.required:
                await self._until_done(lambda: self._clear(epoch))
                return
            await self._until_done(self._read)
            await self._publish_loop(epoch)
        except Deposed:
            log.info("no longer the leader: the synchronous set is left as published")
        except Exception:
            # Safe, not quiet: without a publisher nothing more joins or leaves the set, so
            # writes wait (and fail REPLICAS_UNAVAILABLE) rather than outrun what etcd says.
            log.exception("the synchronous set's publisher failed", extra={"epoch": epoch})
        finally:
            self.tracker.on_change = None

    async def _publish_loop(self, epoch: int) -> None:
        tracker = self.tracker
        wake = asyncio.Event()
        tracker.on_change = wake.set
        unsettled: frozenset[str] | None = None
        failing = False
        while True:
            wanted = tracker.wanted()
            target = wanted if wanted is not None else unsettled
            if target is None:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CHECK_SECONDS):
                        await wake.wait()
                continue
            tracker.publishing(target)
            unsettled = target
            try:
                landed = await self._put(epoch, target)
            except (EtcdUnavailable, EtcdError) as exc:
                if not failing:
                    log.warning(
                        "cannot publish the synchronous set; writes wait for every member "
                        "announced until it is",
                        extra={"members": sorted(target), "error": str(exc)},
                    )
                    failing = True
                await asyncio.sleep(self.retry)
                continue
            if landed:
                tracker.published(target)
                unsettled, failing = None, False

    async def _until_done(self, step: Callable[[], Awaitable[None]]) -> None:
        """``step()`` again after each failed call, every ``retry`` seconds (one line)."""
        failed = False
        while True:
            try:
                await step()
                return
            except (EtcdUnavailable, EtcdError) as exc:
                if not failed:
                    log.warning(
                        "etcd call for the synchronous set failed; retrying",
                        extra={"error": str(exc)},
                    )
                    failed = True
                await asyncio.sleep(self.retry)

    async def _read(self) -> None:
        kv, _ = await self._etcd.call(lambda e: e.get(self.keys.sync))
        self._revision = 0 if kv is None else kv.mod_revision

    async def _put(self, epoch: int, members: frozenset[str]) -> bool:
        """Put the set; True once etcd holds it, False when the key had moved (now learned)."""
        record = SyncSet(self.settings.advertise, epoch, members)
        body = {
            "compare": [
                etcd.compare_created(self.keys.leader, epoch),
                etcd.compare_modified(self.keys.sync, self._revision),
            ],
            "success": [etcd.request_put(self.keys.sync, record.encode())],
            "failure": [etcd.request_range(self.keys.leader), etcd.request_range(self.keys.sync)],
        }
        won, revision, reply = await self._etcd.call(lambda e: e.txn(body))
        if won:
            self._revision = revision
            return True
        leader, current = [*etcd.txn_ranges(reply), None, None][:2]
        if leader is None or leader.create_revision != epoch:
            raise Deposed
        self._revision = 0 if current is None else current.mod_revision
        if current is not None:
            with contextlib.suppress(ValueError):
                held = SyncSet.decode(current.value)
                if held.epoch == epoch and held.leader == self.settings.advertise:
                    self.tracker.published(held.members)
        return False

    async def _clear(self, epoch: int) -> None:
        body = {
            "compare": [etcd.compare_created(self.keys.leader, epoch)],
            "success": [etcd.request_delete(self.keys.sync)],
            "failure": [],
        }
        won, _, _ = await self._etcd.call(lambda e: e.txn(body))
        if not won:
            raise Deposed
