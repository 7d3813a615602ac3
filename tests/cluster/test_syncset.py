"""The leader's synchronous set in a real etcd (``cluster.syncset``), fed by a real tracker over
a real store: each set is put only while the leader key is the one won at the epoch; a set
written under it meanwhile is read back and the put made again; a deposed leader's put fails
and leaves the key as it was; a leader with --ack local deletes the key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from sessionlog.cluster.etcd import Endpoints, compare_created, request_put
from sessionlog.cluster.members import GroupKeys, SyncSet
from sessionlog.cluster.settings import ClusterSettings, cluster_settings
from sessionlog.cluster.sync import SyncTracker
from sessionlog.cluster.syncset import SyncSetPublisher
from tests.cluster._etcd import EtcdProcess
from tests.integration.helpers import opened

GROUP = "syncset"
KEYS = GroupKeys(GROUP)
ME = "127.0.0.1:7301"


def _settings(etcd: EtcdProcess) -> ClusterSettings:
    made = cluster_settings(f"etcd://{etcd.endpoint}", GROUP, ME, 3)
    assert made is not None
    return made


def _lead(client: Endpoints) -> tuple[int, int]:
    """A leader key for ME under a new lease: (the lease, the epoch)."""
    lease, _ = client.grant(5)
    body = {
        "compare": [compare_created(KEYS.leader, 0)],
        "success": [request_put(KEYS.leader, ME.encode(), lease)],
        "failure": [],
    }
    won, epoch, _ = client.txn(body)
    assert won
    return lease, epoch


def _held(client: Endpoints) -> SyncSet | None:
    kv, _ = client.get(KEYS.sync)
    return None if kv is None else SyncSet.decode(kv.value)


async def _eventually(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.02)


def test_the_set_follows_the_tracker_only_under_the_leaders_own_key(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """A replica that holds the floor is published, and only then counts; a set written
    meanwhile by hand is read back and the newer set put over it; once the leader key is gone
    the publisher stops and the key keeps the last set this leader confirmed."""
    client = Endpoints((etcd.endpoint,), timeout=2.0)
    try:
        with opened(tmp_path / "d") as store:
            lease, epoch = _lead(client)
            tracker = SyncTracker(store.checksum_at, required=1, timeout_seconds=5)
            tracker.lead(floor=0)
            publisher = SyncSetPublisher(_settings(etcd), tracker, 1.0, 0.05)

            async def scenario() -> None:
                streams = {name: tracker.open_stream() for name in ("r", "q")}
                task = asyncio.create_task(publisher.run(epoch))
                try:
                    tracker.report(
                        streams["r"], "r", "peer-r", 0, b"", epoch=epoch, current_epoch=epoch
                    )
                    await _eventually(
                        lambda: _held(client) == SyncSet(ME, epoch, frozenset({"r"})),
                        5,
                        "{r} published",
                    )
                    await _eventually(lambda: tracker.members == {"r"}, 2, "{r} confirmed")
                    # Written under the publisher (a late put, another tool): its next put
                    # fails its compare, reads the key back, and is made again over it.
                    stale = SyncSet(ME, epoch, frozenset({"x"}))
                    await asyncio.to_thread(client.put, KEYS.sync, stale.encode(), 0)
                    tracker.report(
                        streams["q"], "q", "peer-q", 0, b"", epoch=epoch, current_epoch=epoch
                    )
                    await _eventually(
                        lambda: _held(client) == SyncSet(ME, epoch, frozenset({"r", "q"})),
                        5,
                        "{r, q} published over the stale set",
                    )
                    await _eventually(lambda: tracker.members == {"r", "q"}, 2, "confirmed")
                    # Deposed: the leader key goes; a change is then never published.
                    await asyncio.to_thread(client.revoke, lease)
                    tracker.close_stream(streams["q"])
                    await asyncio.wait_for(task, 5)
                    assert _held(client) == SyncSet(ME, epoch, frozenset({"r", "q"}))
                    assert tracker.members == {"r", "q"}
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    publisher.close()

            asyncio.run(scenario())
    finally:
        client.close()


def test_a_leader_with_ack_local_deletes_the_set(etcd: EtcdProcess, tmp_path: Path) -> None:
    """--ack local has no synchronous set: the leader deletes a key a former leader left, so
    that any member may campaign again."""
    client = Endpoints((etcd.endpoint,), timeout=2.0)
    try:
        client.put(KEYS.sync, SyncSet("127.0.0.1:7399", 1, frozenset({"b"})).encode(), 0)
        with opened(tmp_path / "d") as store:
            _, epoch = _lead(client)
            tracker = SyncTracker(store.checksum_at, required=0)
            publisher = SyncSetPublisher(_settings(etcd), tracker, 1.0, 0.05)

            async def scenario() -> None:
                try:
                    await asyncio.wait_for(publisher.run(epoch), 5)
                finally:
                    publisher.close()

            asyncio.run(scenario())
        assert _held(client) is None
    finally:
        client.close()
