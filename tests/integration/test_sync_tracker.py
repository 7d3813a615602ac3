"""The --ack replica tracker over a real store's checksums (LMDB in a temporary folder): the
sync position is the K-th highest counting replica's, writes wait for it, a replica off this
history never counts, and a wait that runs out says the write stays committed; a cluster
leader's synchronous set."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.cluster import sync
from sessionlog.cluster.sync import SyncTracker
from sessionlog.storage.store import Store
from tests.integration.helpers import opened, user

SETTLES = 30.0
"""How long a wait that must end is given to end: the checks are that it ends (and how), and a
busy machine can hold this test's event loop for more than a second."""


def _filled(store: Store, count: int) -> list[bytes]:
    for n in range(count):
        store.append("s", [user(f"m{n}")])
    return [checksum for p in range(1, count + 1) if (checksum := store.checksum_at(p))]


def test_the_sync_position_is_the_kth_highest_counting_replica(tmp_path: Path) -> None:
    """K=2 of replicas at 5, 3 and 9: position 5; a waiting write at 7 is acknowledged once a
    second replica reports 7, and the replica that reported a wrong checksum never counts."""
    with opened(tmp_path / "d") as store:
        sums = _filled(store, 9)

        async def scenario() -> None:
            tracker = SyncTracker(store.checksum_at, required=2, timeout_seconds=5)
            a, b, c, bad = (tracker.open_stream() for _ in range(4))
            tracker.report(a, "a", "peer-a", 5, sums[4])
            tracker.report(b, "b", "peer-b", 3, sums[2])
            tracker.report(c, "c", "peer-c", 9, sums[8])
            tracker.report(bad, "bad", "peer-bad", 9, b"\x00" * 16)
            assert tracker.sync_position == 5
            await tracker.wait(5)  # covered already: returns at once
            waiting = asyncio.ensure_future(tracker.wait(7))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            tracker.report(b, "b", "peer-b", 7, sums[6])
            await asyncio.wait_for(waiting, SETTLES)
            assert tracker.sync_position == 7
            counts = {r.name: r.counts for r in tracker.replicas()}
            assert counts == {"a": True, "b": True, "bad": False, "c": True}
            tracker.report(bad, "bad", "peer-bad", 9, sums[8])  # too late: this stream is out
            assert not next(r for r in tracker.replicas() if r.name == "bad").counts

        asyncio.run(scenario())


def test_a_wait_runs_out_with_the_position_and_the_counts(tmp_path: Path) -> None:
    """K=1 with its only replica gone: REPLICAS_UNAVAILABLE after the timeout, naming what was
    needed, counted and the position; a closing tracker fails waiters at once."""
    with opened(tmp_path / "d") as store:
        sums = _filled(store, 2)

        async def scenario() -> None:
            tracker = SyncTracker(store.checksum_at, required=1, timeout_seconds=0.2)
            stream = tracker.open_stream()
            tracker.report(stream, "r", "peer", 1, sums[0])
            tracker.close_stream(stream)
            with pytest.raises(errors.ReplicasUnavailable) as failed:
                await tracker.wait(2)
            assert failed.value.metadata == {"needed": "1", "counted": "0", "position": "2"}
            assert "committed on this primary" in failed.value.message
            assert tracker.stats.timeouts == 1
            waiting = asyncio.ensure_future(tracker.wait(2))
            await asyncio.sleep(0)
            tracker.close()
            with pytest.raises(errors.ReplicasUnavailable, match="shutting down"):
                await asyncio.wait_for(waiting, SETTLES)

        asyncio.run(scenario())


def test_ack_local_never_waits_but_keeps_the_reports(tmp_path: Path) -> None:
    """K=0 (--ack local): a wait returns at once whatever the replicas hold; reports are kept."""
    with opened(tmp_path / "d") as store:
        _filled(store, 1)

        async def scenario() -> None:
            tracker = SyncTracker(store.checksum_at, required=0)
            await asyncio.wait_for(tracker.wait(1), SETTLES)
            tracker.report(tracker.open_stream(), "r", "peer", 0, b"")
            assert [(r.name, r.counts, r.position) for r in tracker.replicas()] == [("r", True, 0)]

        asyncio.run(scenario())


def test_the_replicas_remembered_are_bounded_and_the_connected_ones_kept(tmp_path: Path) -> None:
    """Past MAX_REPLICAS_KEPT names, the disconnected replica heard from longest ago goes; a
    replica reporting now is never the one forgotten."""
    with opened(tmp_path / "d") as store:
        _filled(store, 1)

        async def scenario() -> None:
            tracker = SyncTracker(store.checksum_at, required=1)
            for n in range(sync.MAX_REPLICAS_KEPT):
                stream = tracker.open_stream()
                tracker.report(stream, f"old-{n:02}", "peer", 0, b"")
                tracker.close_stream(stream)
            tracker.report(tracker.open_stream(), "new", "peer", 0, b"")
            names = [r.name for r in tracker.replicas()]
            assert len(names) == sync.MAX_REPLICAS_KEPT
            assert "new" in names
            assert "old-00" not in names

        asyncio.run(scenario())


def test_a_report_counts_only_while_it_names_the_primarys_epoch(tmp_path: Path) -> None:
    """A replica whose report names another epoch than the primary's does not count (the status
    says why) and acknowledges nothing; its next report naming the primary's epoch, on the same
    stream, counts and acknowledges the write waiting for it."""
    with opened(tmp_path / "d") as store:
        sums = _filled(store, 3)

        async def scenario() -> None:
            tracker = SyncTracker(store.checksum_at, required=1, timeout_seconds=5)
            stream = tracker.open_stream()
            tracker.report(stream, "r", "peer", 3, sums[2], epoch=1, current_epoch=2)
            [replica] = tracker.replicas()
            assert (replica.counts, replica.epoch) == (False, 1)
            assert "epoch 1, not this primary's epoch 2" in replica.detail
            waiting = asyncio.ensure_future(tracker.wait(3))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            tracker.report(stream, "r", "peer", 3, sums[2], epoch=2, current_epoch=2)
            await asyncio.wait_for(waiting, SETTLES)
            [replica] = tracker.replicas()
            assert (replica.counts, replica.epoch, replica.detail) == (True, 2, "")

        asyncio.run(scenario())


def test_a_cluster_leader_acknowledges_only_what_every_published_member_holds(
    tmp_path: Path,
) -> None:
    """The synchronous set (a cluster leader): nothing is acknowledged before etcd confirms a
    set; a replica joins only once it holds the leadership's floor; a write waits for every
    member, also for one only announced; a member that holds a write up past the lag grace
    leaves the set (announced before the write goes through), and rejoins once caught up."""
    with opened(tmp_path / "d") as store:
        sums = _filled(store, 6)

        async def scenario() -> None:
            tracker = SyncTracker(store.checksum_at, required=1, timeout_seconds=5)
            tracker.lag_grace = 0.1
            tracker.lead(floor=2)
            a, b = tracker.open_stream(), tracker.open_stream()
            tracker.report(a, "a", "peer-a", 1, sums[0])
            assert tracker.wanted() is None  # "a" lacks the floor: nothing to publish yet
            tracker.report(a, "a", "peer-a", 2, sums[1])
            tracker.report(b, "b", "peer-b", 3, sums[2])
            assert tracker.wanted() == frozenset({"a", "b"})
            assert "not in this leader's synchronous set" in tracker.detail(tracker.replicas()[1])
            waiting = asyncio.ensure_future(tracker.wait(2))
            await asyncio.sleep(0.02)
            assert not waiting.done()  # every replica holds it, but no set is published
            tracker.publishing(frozenset({"a", "b"}))
            await asyncio.sleep(0.02)
            assert not waiting.done()  # announced is not confirmed
            tracker.published(frozenset({"a", "b"}))
            await asyncio.wait_for(waiting, SETTLES)
            assert [tracker.detail(r) for r in tracker.replicas()] == ["", ""]
            assert tracker.wanted() is None
            # "a" stops reporting (frozen): a write at 3 waits for it, then it leaves.
            asked = time.monotonic()  # the wait starts at or after this
            third = asyncio.ensure_future(tracker.wait(3))
            await asyncio.sleep(0.02)
            assert not third.done()
            # Within the grace, read at a moment inside it: the loop's clock may have run past
            # it already (a busy machine can hold a 20 ms sleep for 100 ms and more).
            assert tracker.wanted(now=asked + tracker.lag_grace / 2) is None
            await asyncio.sleep(0.12)
            assert tracker.wanted() == frozenset({"b"})
            tracker.publishing(frozenset({"b"}))
            await asyncio.sleep(0.02)
            assert not third.done()  # until etcd no longer names "a"
            tracker.published(frozenset({"b"}))
            await asyncio.wait_for(third, SETTLES)
            # Never below K: "b" disconnects, and stays the only member.
            tracker.close_stream(b)
            assert tracker.wanted() is None
            # "a" comes back: it joins once it holds every acknowledged write (3).
            tracker.report(a, "a", "peer-a", 2, sums[1])
            assert tracker.wanted() is None
            tracker.report(a, "a", "peer-a", 4, sums[3])
            assert tracker.wanted() == frozenset({"a"})  # and "b", which no longer counts, leaves
            tracker.publishing(frozenset({"a"}))
            tracker.published(frozenset({"a"}))
            assert tracker.wanted() is None
            await asyncio.wait_for(tracker.wait(4), SETTLES)
            tracker.stand_down()
            assert (tracker.members, tracker.sync_position) == (frozenset(), 0)

        asyncio.run(scenario())
