"""A dead link is noticed: replicas and clients stop trusting a stream that has gone silent.

A link can die without TCP saying so (a black-holing proxy, a partition, a SIGSTOPped peer).
Follow streams then rely on heartbeats at an interval the follower asks for: no frame within a
few intervals means the stream is dead, so the follower drops it and resumes from its cursor.
Faults come from ``_relay.Relay`` between the parties, or from SIGSTOP on the primary's PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog.testing import RunningServer
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client, Retry
from tests.e2e._helpers import user
from tests.e2e._proc import running_server
from tests.e2e._relay import Relay
from tests.e2e._replication_cluster import (
    FEED,
    SERVICE,
    Cluster,
    Node,
    wait_for,
    wait_position,
)
from tests.e2e.test_client_python import Follower
from tests.e2e.test_client_typescript import (
    PACKAGE,
    node,
    node_modules,  # noqa: F401  (a fixture, used by name)
)

# One test process runs every module that runs Node out of client/typescript (tests/conftest.py).
# A dead link is noticed by heartbeat deadlines of a second or two, each test within 15-20 s:
# these run alone on the machine (serial).
pytestmark = [pytest.mark.xdist_group("node-client"), pytest.mark.serial]

REPLICA_TIMEOUT = 1.5
"""The replicas' --replica-timeout here: heartbeats every 0.5 s, dead after 1.5 s of silence."""
NOTICE_WITHIN = REPLICA_TIMEOUT + 2.0
"""The timeout, plus slack for a loaded CI machine."""


def append(node: Node, session_id: str, count: int) -> int:
    """``count`` appends of one event each (one change each); the primary's head after them."""
    stub = node.stub()
    for i in range(count):
        stub.Append(pb.AppendRequest(session_id=session_id, events=[user(f"m{i}")]), timeout=10)
    return node.status().position


def replica_args() -> list[str]:
    return ["--replica-timeout", str(REPLICA_TIMEOUT)]


def wait_disconnected(replica: Node) -> tuple[float, rpb.GetReplicationStatusResponse]:
    """Seconds until the replica's status says disconnected, and that status. Until then it
    may still claim connected (it cannot know sooner), but every status it gives is one it
    could have heard: lag never counted against a head it did not hear of."""
    seen: list[rpb.GetReplicationStatusResponse] = []

    def disconnected() -> bool:
        seen.append(replica.status())
        return not seen[-1].connected

    spent = wait_for(f"{replica.name} disconnected", disconnected, NOTICE_WITHIN, step=0.05)
    return spent, seen[-1]


def assert_disconnected(status: rpb.GetReplicationStatusResponse, head: int) -> None:
    """Disconnected, with the last head the primary reported and lag counted against it."""
    assert not status.connected
    assert status.state == rpb.REPLICATION_STATE_DISCONNECTED
    assert status.primary_position == head, "primary_position is not the last one reported"
    assert status.lag_positions == status.primary_position - status.position
    assert status.detail, "a disconnected replica says why"


def assert_streaming(status: rpb.GetReplicationStatusResponse, head: int) -> None:
    assert status.connected
    assert status.state == rpb.REPLICATION_STATE_STREAMING
    assert (status.position, status.primary_position, status.lag_positions) == (head, head, 0)
    assert status.detail == ""


def test_replica_notices_a_black_holed_link_and_catches_up(tmp_path: Path) -> None:
    """Behind a relay that swallows every byte, a replica shows connected false within its
    --replica-timeout (never lag 0 and connected for long), then, once the link is back,
    reconnects and applies all 50 changes written meanwhile."""
    with Cluster(tmp_path) as cluster, Relay(cluster.primary().port).start() as relay:
        primary = cluster.nodes[0]  # the primary started just above
        replica = cluster.replica(relay.address, "replica", args=replica_args())
        head = append(primary, "s", 5)
        wait_position(replica, head)
        assert_streaming(replica.status(), head)

        relay.blackhole(True)
        started = time.monotonic()
        later = append(primary, "s", 50)
        assert later == head + 50
        noticed, status = wait_disconnected(replica)
        print(f"\nblack hole: replica noticed after {noticed:.2f} s (timeout {REPLICA_TIMEOUT} s)")
        assert_disconnected(status, head)
        assert "no frame from the primary" in status.detail
        # It stays disconnected while the link is dead (its reconnects go into the hole too).
        for _ in range(10):
            assert_disconnected(replica.status(), head)
            time.sleep(0.1)

        relay.blackhole(False)
        back = wait_position(replica, later, timeout=15)
        print(f"black hole: replica caught up {back:.2f} s after the link came back")
        wait_for("replica streaming", lambda: replica.status().connected, 5)
        assert_streaming(replica.status(), later)
        warned = [e for e in replica.log_entries() if "heard nothing" in e.get("message", "")]
        assert warned, f"no warning about the silent primary:\n{replica.log()}"
        assert time.monotonic() - started < 20


@contextmanager
def stopped(node: Node) -> Iterator[None]:
    """SIGSTOP the node's processes (its workers too) by PID; SIGCONT them on the way out,
    whatever happened."""
    pids = node.pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_replica_notices_a_stopped_primary_and_catches_up(tmp_path: Path) -> None:
    """With its primary SIGSTOPped (sockets open, nothing answers), a replica shows connected
    false within its --replica-timeout; after SIGCONT it reconnects and catches up."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica", args=replica_args())
        head = append(primary, "s", 5)
        wait_position(replica, head)
        with stopped(primary):
            noticed, status = wait_disconnected(replica)
            print(f"\nSIGSTOP: replica noticed after {noticed:.2f} s (timeout {REPLICA_TIMEOUT} s)")
            assert_disconnected(status, head)
        later = append(primary, "s", 50)
        back = wait_position(replica, later, timeout=15)
        print(f"SIGSTOP: replica caught up {back:.2f} s after SIGCONT")
        wait_for("replica streaming", lambda: replica.status().connected, 5)
        assert_streaming(replica.status(), later)


# -- the heartbeat a follower asks for ------------------------------------------------------------


def heartbeat(seconds: float) -> Duration:
    interval = Duration()
    interval.FromNanoseconds(round(seconds * 1e9))
    return interval


def beat_gaps(stream: Any, count: int) -> list[float]:
    """The seconds between ``count`` + 1 consecutive responses of an idle stream."""
    next(stream)
    gaps = []
    for _ in range(count):
        started = time.monotonic()
        next(stream)
        gaps.append(time.monotonic() - started)
    return gaps


@pytest.mark.parametrize(
    ("asked", "low", "high"),
    [
        (0.3, 0.2, 0.6),  # honoured
        (0.001, 0.05, 0.3),  # raised to the 0.1 s floor
        (60.0, 0.5, 1.5),  # lowered to the server's --heartbeat (1 s here)
        (0.0, 0.5, 1.5),  # zero: the server's --heartbeat
    ],
)
def test_follow_streams_beat_at_the_interval_asked(
    tmp_path: Path, asked: float, low: float, high: float
) -> None:
    """Since and Changes follow streams send heartbeats at the requested interval, clamped to
    [0.1 s, the server's --heartbeat]."""
    with running_server(tmp_path / "data", heartbeat_seconds=1.0) as server:
        channel = server.channel()
        channel.unary_unary(f"{SERVICE}/Append")(
            pb.AppendRequest(session_id="s", events=[user("a")]).SerializeToString(), timeout=10
        )
        interval = heartbeat(asked)
        requests = {
            f"{SERVICE}/Since": pb.SinceRequest(
                session_id="s", seq=1, follow=True, heartbeat_interval=interval
            ),
            f"{FEED}/Changes": rpb.ChangesRequest(
                start_position=2, follow=True, heartbeat_interval=interval
            ),
        }
        for method, request in requests.items():
            stream = channel.unary_stream(method)(request.SerializeToString(), timeout=20)
            try:
                gaps = beat_gaps(stream, 3)
            finally:
                stream.cancel()
            assert all(low < gap < high for gap in gaps), f"{method} beats {gaps} for {asked}"


def test_servers_accept_frequent_client_pings(tmp_path: Path) -> None:
    """A client pinging every second on an idle follow stream (no data either way for 4 s) is
    not sent GOAWAY for too many pings: its stream still delivers the next event."""
    options = [
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_timeout_ms", 1000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    with (
        running_server(tmp_path / "data", heartbeat_seconds=10.0) as server,
        grpc.insecure_channel(server.address, options=options) as channel,
    ):
        stream = channel.unary_stream(f"{SERVICE}/Since")(
            pb.SinceRequest(session_id="s", follow=True).SerializeToString(), timeout=20
        )
        first = pb.SinceResponse.FromString(next(stream))
        assert first.caught_up
        time.sleep(4.5)
        server.stub().Append(pb.AppendRequest(session_id="s", events=[user("late")]), timeout=10)
        late = pb.SinceResponse.FromString(next(stream))
        stream.cancel()
        assert [e.seq for e in late.events] == [0]


# -- clients ----------------------------------------------------------------------------------

CLIENT_HEARTBEAT = 0.3
"""The clients' follow heartbeat here: a stream silent for 0.9 s is dead."""
FAST_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
]
"""The clients' keepalive here: a dead transport is closed within ~3 s instead of ~15 s, so
the resumed call gets a new connection soon after the link is back."""
FAST_RETRY = Retry(give_up_after=20.0, initial_backoff=0.05, max_backoff=0.5)


def test_python_follow_resumes_after_a_black_hole(tmp_path: Path) -> None:
    """Client.follow() through a black-holed link deems the stream dead within three
    heartbeats, and once the link is back resumes from its last seq: every event once, in order."""
    with (
        running_server(tmp_path / "data") as server,
        Relay(server.port).start() as relay,
        Client(relay.address, retry=FAST_RETRY, options=FAST_KEEPALIVE) as client,
    ):
        direct = server.stub()
        write(direct, "s", 10)
        follower = Follower(client.follow("s", heartbeat=CLIENT_HEARTBEAT))
        follower.wait_for(10)
        relay.blackhole(True)
        started = time.monotonic()
        write(direct, "s", 20)
        noticed = wait_for("a dead stream", lambda: follower.stream.dead_streams > 0, 3)
        print(f"\nPython follow: dead stream noticed after {noticed:.2f} s")
        assert follower.seqs() == list(range(10)), "events came through a black hole"
        relay.blackhole(False)
        healed = time.monotonic()
        follower.wait_for(30)
        print(f"Python follow: resumed {time.monotonic() - healed:.2f} s after the link came back")
        assert follower.seqs() == list(range(30))
        follower.stop()
        assert time.monotonic() - started < 15


def test_async_python_follow_resumes_after_a_black_hole(tmp_path: Path) -> None:
    """AsyncClient.follow() does the same: dead within three heartbeats, then resumed from its
    last seq with no gap and no duplicate."""

    async def scenario(relay: Relay, server: RunningServer) -> tuple[list[int], int]:
        direct = server.stub()
        write(direct, "s", 10)
        seen: list[int] = []
        async with (
            AsyncClient(relay.address, retry=FAST_RETRY, options=FAST_KEEPALIVE) as client,
            client.follow("s", heartbeat=CLIENT_HEARTBEAT) as stream,
        ):
            async for ev in stream:
                seen.append(ev.seq)
                if ev.seq == 9:
                    relay.blackhole(True)
                    await asyncio.to_thread(write, direct, "s", 20)
                    await asyncio.sleep(CLIENT_HEARTBEAT * 5)
                    relay.blackhole(False)
                if ev.seq == 29:
                    break
        return seen, stream.dead_streams + stream.reconnects

    with running_server(tmp_path / "data") as server, Relay(server.port).start() as relay:
        seen, resumed = asyncio.run(asyncio.wait_for(scenario(relay, server), 20))
    assert seen == list(range(30))
    # The heartbeat deadline usually notices first; on a loaded machine keepalive may close the
    # dead connection first (UNAVAILABLE). Either way the stream resumed from its last seq.
    assert resumed >= 1


def write(stub: Any, session_id: str, count: int) -> None:
    """``count`` user messages, one Append each."""
    for i in range(count):
        stub.Append(pb.AppendRequest(session_id=session_id, events=[user(f"m{i}")]), timeout=10)


class NodeFollower:
    """test/follow-worker.mjs: the TypeScript client's follow(), reported line by line."""

    def __init__(self, address: str, session_id: str, count: int, heartbeat_ms: int) -> None:
        options = {
            "grpc.keepalive_time_ms": 2000,
            "grpc.keepalive_timeout_ms": 1000,
            "grpc.initial_reconnect_backoff_ms": 50,
            "grpc.max_reconnect_backoff_ms": 250,
        }
        args = [address, session_id, str(count), str(heartbeat_ms), json.dumps(options)]
        self.process = subprocess.Popen(
            [node(), "test/follow-worker.mjs", *args],
            cwd=PACKAGE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("")

    def hear(self, prefix: str, timeout: float) -> list[str]:
        """The lines up to and including the first starting with ``prefix``."""
        heard: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} from the Node follower: {heard}") from None
            assert line, f"the Node follower ended: {heard}\n{self.stop()}"
            heard.append(line)
            if line.startswith(prefix):
                return heard

    def stop(self) -> str:
        """Wait for the worker to exit (kill it after 10 s); its stderr."""
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(10)
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        err = self.process.stderr.read()
        self.process.stdout.close()
        self.process.stderr.close()
        return err


def seqs_in(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("event ")]


@pytest.mark.usefixtures("node_modules")
def test_typescript_follow_resumes_after_a_black_hole(tmp_path: Path) -> None:
    """The TypeScript client's follow() through a black-holed link deems the stream dead within
    three heartbeats, and once the link is back resumes from its last seq: no gap, no duplicate."""
    with running_server(tmp_path / "data") as server, Relay(server.port).start() as relay:
        direct = server.stub()
        write(direct, "s", 10)
        worker = NodeFollower(relay.address, "s", 30, heartbeat_ms=300)
        try:
            worker.hear("ready", 15)
            heard = worker.hear("event 9", 10)
            relay.blackhole(True)
            started = time.monotonic()
            write(direct, "s", 20)
            heard += worker.hear("dead", 3)
            print(
                f"\nTypeScript follow: dead stream noticed after {time.monotonic() - started:.2f} s"
            )
            relay.blackhole(False)
            healed = time.monotonic()
            heard += worker.hear("done", 15)
            print(f"TypeScript follow: resumed {time.monotonic() - healed:.2f} s after the link")
        finally:
            err = worker.stop()
        assert seqs_in(heard) == list(range(30)), err
        assert worker.process.returncode == 0, err
