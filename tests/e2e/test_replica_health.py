"""A read replica's health says whether it is current: a balancer in front of read replicas
(HAProxy's gRPC health check, Kubernetes' readiness probe) must stop sending reads to a replica
whose link to its primary has been down longer than --replica-timeout, and send them again once
the replica has caught up. Faults: a relay that black-holes the link, and one that resets it.
"""

from __future__ import annotations

import time
from pathlib import Path

from grpc_health.v1 import health_pb2

from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import user
from tests.e2e._relay import Relay
from tests.e2e._replication_cluster import Cluster, Node, wait_for, wait_position

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
REPLICA_TIMEOUT = 1.5
NOTICE_WITHIN = 2 * REPLICA_TIMEOUT + 6.0
"""Silence for the timeout (the stream is dead), the timeout again at most, a check interval,
and slack for a loaded machine."""


def append(node: Node, session_id: str, count: int) -> int:
    stub = node.stub()
    for i in range(count):
        stub.Append(pb.AppendRequest(session_id=session_id, events=[user(f"m{i}")]), timeout=10)
    return node.status().position


def test_a_replica_cut_off_longer_than_its_timeout_is_not_serving_until_it_catches_up(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path) as cluster, Relay(cluster.primary().port).start() as relay:
        primary = cluster.nodes[0]
        replica = cluster.replica(
            relay.address, "replica", args=["--replica-timeout", str(REPLICA_TIMEOUT)]
        )
        head = append(primary, "s", 3)
        wait_position(replica, head)
        wait_for("replica SERVING", lambda: replica.health() == SERVING, 10)

        relay.blackhole(True)
        later = append(primary, "s", 5)
        spent = wait_for(
            "replica NOT_SERVING", lambda: replica.health() == NOT_SERVING, NOTICE_WITHIN
        )
        print(f"\nblack hole: NOT_SERVING after {spent:.2f} s (timeout {REPLICA_TIMEOUT} s)")
        status = replica.status()
        assert not status.connected
        assert not status.caught_up
        for _ in range(10):  # it stays out while the link is dead
            assert replica.health() == NOT_SERVING
            time.sleep(0.1)
        lines = [e for e in replica.log_entries() if "NOT_SERVING" in e.get("message", "")]
        assert lines, f"no line says why the replica left:\n{replica.log()}"

        relay.blackhole(False)
        wait_position(replica, later, timeout=20)
        wait_for("replica SERVING again", lambda: replica.health() == SERVING, 10)
        assert replica.status().caught_up


def test_a_link_reset_and_reopened_at_once_keeps_the_replica_serving(tmp_path: Path) -> None:
    """A reset the replica reconnects from within its timeout is not an outage: it stays
    SERVING throughout (a balancer does not drop it for a blip)."""
    timeout = 5.0
    with Cluster(tmp_path) as cluster, Relay(cluster.primary().port).start() as relay:
        primary = cluster.nodes[0]
        replica = cluster.replica(relay.address, "replica", args=["--replica-timeout", "5"])
        head = append(primary, "s", 3)
        wait_position(replica, head)
        wait_for("replica SERVING", lambda: replica.health() == SERVING, 10)
        relay.cut()
        later = append(primary, "s", 2)
        wait_position(replica, later, timeout=timeout)
        seen = set()
        deadline = time.monotonic() + timeout + 2
        while time.monotonic() < deadline:
            seen.add(replica.health())
            time.sleep(0.1)
        assert seen == {SERVING}, f"a reset flipped the replica's health: {seen}"
