"""Routing through a real HAProxy: two groups of real servers, each session in its own group.

One module-scoped set-up: two groups, each a primary and a read replica (`sessionlog serve`,
no --shard-map: a group is just its servers here), every server with --http-listen (the health
checks) and a short --heartbeat; an HAProxy process running the configuration that `sessionlog
cluster haproxy` writes for their shard map, with 2 s timeouts. The last two tests change the
set-up: one kills a primary, the next reloads HAProxy with a new map.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.shard import haproxy
from sessionlog.shard.shardmap import Group, ShardMap
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.cluster import _group
from tests.e2e._helpers import user
from tests.e2e._proc import free_port
from tests.e2e._replication_cluster import Cluster, Node

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
TIMEOUT_SECONDS = 2.0
"""HAProxy's client/server timeout in this test: four of the servers' heartbeat."""
HEARTBEAT_SECONDS = 0.5
CHECK_SECONDS = 0.3
SESSIONS = 200
CALL = 10.0


@dataclass
class Routed:
    map: ShardMap
    nodes: dict[str, tuple[Node, Node]]
    """Group name: (primary, replica)."""
    address: str
    process: subprocess.Popen[bytes]
    log: Path
    out: Path
    """Where haproxy.cfg and slots.map are."""

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)


def _http(node: Node) -> str:
    return next(a for f, a in zip(node.args, node.args[1:], strict=False) if f == "--http-listen")


def _status(address: str, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _session(stub: pb_grpc.SessionLogServiceStub, session_id: str) -> list[Any]:
    request = pb.SinceRequest(session_id=session_id)
    meta = (("x-session-id", session_id),)
    return [e for r in stub.Since(request, metadata=meta, timeout=CALL) for e in r.events]


def _append(
    stub: pb_grpc.SessionLogServiceStub, session_id: str, content: str, request_id: str = ""
) -> Any:
    request = pb.AppendRequest(session_id=session_id, events=[user(content)], request_id=request_id)
    return stub.Append(request, metadata=(("x-session-id", session_id),), timeout=CALL)


def _in(node: Node | str, session_id: str) -> int:
    """How many events ``node`` (or the server at that address) holds for the session, asked
    directly."""
    request = pb.SinceRequest(session_id=session_id)
    if isinstance(node, Node):
        return sum(len(r.events) for r in node.stub().Since(request, timeout=CALL))
    with grpc.insecure_channel(node) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        return sum(len(r.events) for r in stub.Since(request, timeout=CALL))


def _eventually(check: Any, seconds: float = 10.0) -> Any:
    """``check()``'s first truthy value within ``seconds`` (tried every 0.1 s), else fail."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except grpc.RpcError as error:
            last = error
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds}s: {last}")


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    root = tmp_path_factory.mktemp("haproxy")
    with Cluster(root) as cluster:
        nodes: dict[str, tuple[Node, Node]] = {}
        for name in ("ga", "gb"):

            def args() -> list[str]:
                return ["--http-listen", f"127.0.0.1:{free_port()}", "--heartbeat", "0.5"]

            primary = cluster.primary(f"{name}-primary", args=args())
            replica = cluster.replica(primary, f"{name}-replica", args=args())
            nodes[name] = (primary, replica)
        shard_map = ShardMap(
            1,
            tuple(
                Group(
                    name,
                    (p.address, r.address),
                    ((0, 511),) if name == "ga" else ((512, 1023),),
                    (_http(p), _http(r)),
                )
                for name, (p, r) in nodes.items()
            ),
        )
        address = f"127.0.0.1:{free_port()}"
        config, _ = haproxy.write(
            shard_map, root / "proxy", address, TIMEOUT_SECONDS, CHECK_SECONDS
        )
        log = root / "haproxy.log"
        process = _haproxy(config, log)
        try:
            setup = Routed(shard_map, nodes, address, process, log, root / "proxy")
            with setup.channel() as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                for name in nodes:  # both write backends up: one write each gets through
                    probe = next(
                        f"probe-{i}"
                        for i in range(100)
                        if shard_map.owner(f"probe-{i}").name == name
                    )
                    _eventually(lambda probe=probe: _append(stub, probe, "probe"))
            yield setup
        finally:
            for running in {process, setup.process}:  # the reload test replaces the process
                _stop(running)


def _haproxy(config: Path, log: Path, *more: str) -> subprocess.Popen[bytes]:
    """HAProxy in the foreground (-db) on ``config``, its output appended to ``log``."""
    if not Path(HAPROXY).exists():
        pytest.fail("haproxy is not installed: run `make haproxy-tools` (apt-get install haproxy)")
    with log.open("ab") as out:
        return subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config), *more],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID and wait; SIGKILL if it does not exit."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def test_health_endpoints_say_who_takes_writes(routed: Routed) -> None:
    for primary, replica in routed.nodes.values():
        for path in ("/primary", "/healthz"):
            code, body = _status(_http(primary), path)
            assert (code, body["role"], body["takes_writes"]) == (200, "primary", True)
        code, body = _status(_http(replica), "/primary")
        assert (code, body["role"], body["takes_writes"]) == (503, "replica", False)
        code, body = _status(_http(replica), "/healthz")
        assert (code, body["role"], body["serving"]) == (200, "replica", True)


def test_each_session_lands_in_its_group_only(routed: Routed) -> None:
    ids = [f"route-{n}" for n in range(SESSIONS)]
    with routed.channel() as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for session_id in ids:
            _append(stub, session_id, f"{session_id} one")
            _append(stub, session_id, f"{session_id} two")
        owners = {session_id: routed.map.owner(session_id).name for session_id in ids}
        assert min(list(owners.values()).count(name) for name in routed.nodes) > SESSIONS // 4
        for name, (primary, replica) in routed.nodes.items():
            for session_id in ids:
                want = 2 if owners[session_id] == name else 0
                assert _in(primary, session_id) == want, (session_id, name)
                if want:  # the replica has it once it has applied it
                    _eventually(lambda s=session_id, r=replica: _in(r, s) == 2)
                else:
                    assert _in(replica, session_id) == 0
        for session_id in ids:  # read back through HAProxy (primary or replica)
            contents = [e.data["content"] for e in _session(stub, session_id)]
            assert contents == [f"{session_id} one", f"{session_id} two"]


def test_a_follow_stream_outlives_the_proxy_timeout(routed: Routed) -> None:
    session_id = "follow-through-proxy"
    received: queue.Queue[Any] = queue.Queue()
    with routed.channel() as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        _append(stub, session_id, "e0")
        request = pb.SinceRequest(session_id=session_id, follow=True)
        call = stub.Since(request, metadata=(("x-session-id", session_id),), timeout=30)

        def read() -> None:
            try:
                for reply in call:
                    for event in reply.events:
                        received.put((event.seq, event.data["content"]))
            except grpc.RpcError as error:
                received.put(error)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert received.get(timeout=CALL) == (0, "e0")
        time.sleep(TIMEOUT_SECONDS * 1.5)  # idle past HAProxy's timeouts: heartbeats only
        for seq in (1, 2):
            _append(stub, session_id, f"e{seq}")
        assert [received.get(timeout=CALL) for _ in range(2)] == [(1, "e1"), (2, "e2")]
        assert received.empty()
        call.cancel()
        reader.join(CALL)


def test_a_dead_primary_stops_only_its_groups_writes(routed: Routed) -> None:
    """Kills group ga's primary (the set-up keeps it dead)."""
    ids = [f"after-{n}" for n in range(40)]
    lost = [s for s in ids if routed.map.owner(s).name == "ga"]
    kept = [s for s in ids if routed.map.owner(s).name == "gb"]
    with routed.channel() as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for session_id in lost:
            _append(stub, session_id, "before")
        primary, replica = routed.nodes["ga"]
        _eventually(lambda: all(_in(replica, s) == 1 for s in lost))
        primary.kill()
        for session_id in kept:
            _append(stub, session_id, "while ga is down")
        with pytest.raises(grpc.RpcError) as refused:
            _append(stub, lost[0], "no primary")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # Reads of ga's sessions go to its replica once HAProxy's checks mark the primary down.
        _eventually(lambda: len(_session(stub, lost[0])) == 1)
        for session_id in lost:
            assert [e.data["content"] for e in _session(stub, session_id)] == ["before"]
        for session_id in kept:
            assert [e.data["content"] for e in _session(stub, session_id)] == ["while ga is down"]
    assert routed.process.poll() is None, routed.log.read_text()


def test_a_map_change_applies_on_reload(routed: Routed) -> None:
    """Runs last: ga's slots move to gb; the files written again and HAProxy reloaded (-sf),
    calls for ga's sessions reach gb, and the old process exits."""
    moved = routed.map.with_slots(range(512), "gb")
    session_id = next(
        f"moved-{n}" for n in range(100) if routed.map.owner(f"moved-{n}").name == "ga"
    )
    config, _ = haproxy.write(moved, routed.out, routed.address, TIMEOUT_SECONDS, CHECK_SECONDS)
    old = routed.process
    routed.process = _haproxy(config, routed.log, "-sf", str(old.pid))
    old.wait(10)  # no connection open: it stops at once
    with routed.channel() as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        _eventually(lambda: _append(stub, session_id, "after the move"))
        assert [e.data["content"] for e in _session(stub, session_id)] == ["after the move"]
    assert _in(routed.nodes["gb"][0], session_id) == 1
    assert routed.process.poll() is None, routed.log.read_text()


def test_writes_follow_a_cluster_failover(tmp_path: Path) -> None:
    """A group elected through etcd behind HAProxy: /primary answers 200 on the leader only;
    the leader SIGKILLed, writes through HAProxy reach the new leader once it passes its check.
    """
    args = ["--lease-ttl", "2", "--replica-timeout", "1", "--heartbeat", "0.5"]
    with _group.Group(tmp_path, members=2, args=args, http=True) as group:
        leader, epoch = group.wait_healthy()
        [other] = [m for m in group.members if m is not leader]
        code, body = _status(leader.http, "/primary")
        assert (code, body["role"], body["epoch"]) == (200, "primary", epoch)
        code, body = _status(other.http, "/primary")
        assert (code, body["role"], body["takes_writes"]) == (503, "replica", False)
        assert _status(other.http, "/healthz")[0] == 200
        members = group.members
        shard_map = ShardMap(
            1,
            (
                Group(
                    "g",
                    tuple(m.address for m in members),
                    ((0, 1023),),
                    tuple(m.http for m in members),
                ),
            ),
        )
        address = f"127.0.0.1:{free_port()}"
        config, _ = haproxy.write(shard_map, tmp_path / "proxy", address, 2.0, CHECK_SECONDS)
        process = _haproxy(config, tmp_path / "haproxy.log")
        try:
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                _eventually(lambda: _append(stub, "ha", "before", "r-before"))
                _eventually(lambda: _in(other.direct, "ha") == 1)  # --ack local: replicated
                leader.kill()
                group.wait_new_leader(epoch)
                _eventually(lambda: _append(stub, "ha", "after", "r-after"), 20)
                contents = _eventually(lambda: [e.data["content"] for e in _session(stub, "ha")])
                assert contents == ["before", "after"]
                assert _status(other.http, "/primary")[0] == 200
        finally:
            _stop(process)
