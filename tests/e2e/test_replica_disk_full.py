"""A replica whose own disk fills up: it says so, backs off instead of reconnecting in a tight
loop, and catches up by itself once space is freed. Real processes, a real small tmpfs."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests._tmpfs import fill, small_tmpfs
from tests.e2e._replication_cluster import Cluster, Node, wait_for, wait_position


def _bulk(node: Node, batches: int) -> None:
    stub = node.stub()
    for n in range(batches):
        events = []
        for i in range(50):
            event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
            event.data.update({"content": f"{n}-{i} " + "x" * 3000})
            events.append(event)
        stub.Append(pb.AppendRequest(session_id=f"bulk-{n % 4}", events=events), timeout=30)


def test_a_replica_with_a_full_disk_backs_off_and_recovers(tmp_path: Path) -> None:
    """While the replica's disk is full its status says it cannot store the changes, it
    reconnects a few times at most (backing off), logs no traceback; freed space lets it catch up
    with every change."""
    with small_tmpfs(tmp_path / "disk", 8 << 20) as disk, Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        filler = disk / "filler"
        with contextlib.suppress(OSError):
            fill(filler, 5 << 20)
        replica = Node(
            tmp_path, "replica", replica_of=primary.address, args=["--map-size", "64MiB"]
        )
        replica.data = disk / "replica"  # its data on the small disk, its log off it
        cluster.nodes.append(replica)
        replica.start()
        _bulk(primary, 30)  # about 4.5 MB: more than the disk has left
        wait_for(
            "the replica to report its full disk",
            lambda: "could not store" in replica.status().detail,
            30,
        )
        time.sleep(6)
        log = replica.log()
        assert "Traceback" not in log
        assert 1 <= log.count("could not apply") <= 8, log.count("could not apply")
        filler.unlink()
        wait_position(replica, primary.status().position, timeout=60)
        replica.stop()
