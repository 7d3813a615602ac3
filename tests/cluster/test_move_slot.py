"""`sessionlog cluster move-slot`: a slot moves between two real groups (one `--cluster
--shard-map etcd` member each, one real etcd) while a writer keeps appending to it.

Every acknowledged append is in the new group with its seq and content, the old group takes
none after the flip and refuses the slot WRONG_GROUP, and a client holding the old map is
redirected (its append lands in the new group). The pause (the writes to the slot refused
meanwhile, retried by the client) is measured and printed. Bad input fails with a clear message
and its exit status. The servers are module-scoped: one start for the module.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf import json_format

from sessionlog.cluster.etcd import Endpoints
from sessionlog.shard import ShardMap, slot_of
from sessionlog.shard.ownership import MOVE_COPY, MOVE_HEADER
from sessionlog.shard.shardmap import SHARDS_KEY, Group
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import Client, event
from tests.cluster._etcd import EtcdProcess
from tests.e2e._helpers import check, failure, user
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli

WRITE_SECONDS_AFTER = 1.0
"""The writer goes on this long after the move's command returned."""


@dataclass
class Cluster:
    etcd: EtcdProcess
    members: dict[str, list[str]]
    addresses: dict[str, str] = field(default_factory=dict)
    """Each group's primary (its elected leader)."""
    servers: list[ServerProcess] = field(default_factory=list)
    channels: dict[str, grpc.Channel] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        return f"etcd://{self.etcd.endpoint}"

    def channel(self, group: str) -> grpc.Channel:
        address = self.addresses[group]
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return self.channels[address]

    def stub(self, group: str) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(self.channel(group))  # type: ignore[no-untyped-call]

    def events(self, group: str) -> int:
        stub = apb_grpc.AdminServiceStub(self.channel(group))  # type: ignore[no-untyped-call]
        stats: apb.GetStatsResponse = stub.GetStats(apb.GetStatsRequest(), timeout=5)
        return stats.event_count

    def map(self) -> ShardMap:
        etcd = Endpoints((self.etcd.endpoint,), 2.0)
        try:
            found, _ = etcd.get(SHARDS_KEY)
        finally:
            etcd.close()
        assert found is not None
        return ShardMap.from_json(found.value)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("move")
    with EtcdProcess(root / "etcd") as etcd:
        members = {  # g1: a leader and a replica, so the move waits for both
            "g1": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"],
            "g2": [f"127.0.0.1:{free_port()}"],
        }
        first = ShardMap.even_split(members)
        etcd_client = Endpoints((etcd.endpoint,), 2.0)
        etcd_client.put(SHARDS_KEY, first.to_json().encode(), 0)
        etcd_client.close()
        state = Cluster(etcd, members)
        started: list[tuple[ServerProcess, str]] = []
        try:
            for name, addresses in members.items():
                for index, address in enumerate(addresses):
                    args = [
                        "--data", str(root / f"{name}-{index}"), "--listen", address,
                        "--advertise", address, "--cluster", f"etcd://{etcd.endpoint}",
                        "--group", name, "--shard-map", "etcd", "--log-format", "json",
                    ]  # fmt: skip
                    env = clean_env(workers=False)
                    server = ServerProcess(args, root, env=env, name=f"{name}-{index}").start()
                    state.servers.append(server)
                    started.append((server, address))
            for server, address in started:
                server.wait_serving(address, timeout=60)
            state.addresses = {
                name: primary_of(name, addresses) for name, addresses in members.items()
            }
            yield state
        finally:
            for channel in state.channels.values():
                channel.close()
            for server in state.servers:
                server.stop()


def primary_of(group: str, members: list[str], seconds: float = 30.0) -> str:
    """The group's leader, as its first member's GetShardMap names it (once it names one)."""
    channel = grpc.insecure_channel(members[0])
    stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
    try:
        deadline = time.monotonic() + seconds
        while True:
            reply = stub.GetShardMap(pb.GetShardMapRequest(), timeout=5)
            primary = next(g.primary for g in reply.shard_map.groups if g.name == group)
            if primary or time.monotonic() > deadline:
                assert primary, f"group {group} has no leader"
                return str(primary)
            time.sleep(0.2)
    finally:
        channel.close()


def ids_of_slot(slot: int, count: int, prefix: str) -> list[str]:
    found = (f"{prefix}{n}" for n in range(1_000_000) if slot_of(f"{prefix}{n}") == slot)
    return [next(found) for _ in range(count)]


def said(reply_event: object) -> str:
    data = json_format.MessageToDict(reply_event.data)  # type: ignore[attr-defined]
    return str(data.get("content"))


class Writer(threading.Thread):
    """Appends to ``sessions`` round robin through a client routed by the map (``shard_map=
    "server"``), recording every acknowledged append: (session, seq, content, seconds)."""

    def __init__(self, address: str, sessions: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = Client(address, shard_map="server", timeout=10)
        self.sessions = sessions
        self.acked: list[tuple[str, int, str, float]] = []
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for n in range(20_000):  # bounded; stopped long before
            if self.stop.is_set():
                return
            session = self.sessions[n % len(self.sessions)]
            content = f"{session}#{n}"
            started = time.monotonic()
            try:
                reply = self.client.append(session, [event("user_message", {"content": content})])
            except Exception as exc:  # an unacknowledged append: allowed, never counted
                self.failed.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
                continue
            took = time.monotonic() - started
            self.acked.append((session, reply.events[0].seq, content, took))


def test_a_slot_moves_under_load(cluster: Cluster) -> None:
    before = cluster.map()
    slot = before.group("g1").ranges[0][0] + 17
    moving = ids_of_slot(slot, 3, "mv-")
    staying = ids_of_slot(slot + 1, 2, "st-")  # another slot of g1: no pause
    old = Client(cluster.addresses["g1"], shard_map="server", timeout=10)
    for session in moving + staying:
        old.append(session, [event("user_message", {"content": f"{session}#first"})])
    table = old.shard_map
    assert table is not None
    assert table.owner(moving[0]).name == "g1"

    writer = Writer(cluster.addresses["g1"], moving + staying)
    writer.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        done = run_cli(
            ["cluster", "move-slot", str(slot), "--to", "g2", "--cluster", cluster.cluster],
            cluster.etcd.directory,
            timeout=90,
        )
        took = time.monotonic() - started
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(WRITE_SECONDS_AFTER)
    finally:
        writer.stop.set()
        writer.join(30)
    assert not writer.is_alive()
    pause = float(re.search(r"writes paused ([0-9.]+) s", done.stdout).group(1))  # type: ignore[union-attr]
    slowest = max(t for s, _, _, t in writer.acked if s in moving)
    print(
        f"\nmove-slot took {took:.2f} s; writes to the slot paused {pause:.3f} s; slowest "
        f"acknowledged append {slowest:.3f} s; {len(writer.acked)} appends acknowledged, "
        f"{len(writer.failed)} not"
    )
    assert not writer.failed, writer.failed[:3]

    after = cluster.map()
    assert (after.epoch, after.owner_of_slot(slot).name, after.frozen) == (
        before.epoch + 2,
        "g2",
        frozenset(),
    )
    # Every acknowledged append is where its owner is now, at its seq, with its content.
    for group, sessions in (("g2", moving), ("g1", staying)):
        stub = cluster.stub(group)
        for session in sessions:
            stored = [
                e
                for reply in stub.Since(pb.SinceRequest(session_id=session), timeout=10)
                for e in reply.events
            ]
            contents = [said(e) for e in stored]
            assert [e.seq for e in stored] == list(range(len(stored)))
            assert len(set(contents)) == len(contents)  # nothing written twice
            assert contents[0] == f"{session}#first"
            acked = [(seq, text) for s, seq, text, _ in writer.acked if s == session]
            assert acked, session
            for seq, text in acked:
                assert contents[seq] == text, (session, seq)
    moved_after = [a for a in writer.acked if a[0] in moving]
    assert len(moved_after) > 3

    # The old group takes none of the slot's writes after the flip, and says who owns it.
    for session in moving:
        error = failure(
            cluster.stub("g1").Append,
            pb.AppendRequest(session_id=session, events=[user("refused")]),
            timeout=5,
        )
        check(error, grpc.StatusCode.FAILED_PRECONDITION, "WRONG_GROUP", group="g2")
    # A client holding the old map is redirected, not misrouted.
    assert old.shard_map is not None
    assert old.shard_map.epoch == before.epoch
    reply = old.append(moving[0], [event("user_message", {"content": "late"})])
    assert old.shard_map.epoch == after.epoch
    tail = list(cluster.stub("g2").Since(pb.SinceRequest(session_id=moving[0]), timeout=10))
    last = tail[-1].events[-1]
    assert (said(last), last.seq) == ("late", reply.events[0].seq)
    # The old group holds exactly what was copied of the slot, nothing written after the flip:
    # its events are its other sessions' and the copies the move reported.
    copied = re.search(r"([0-9]+) event\(s\) copied live, ([0-9]+) while paused", done.stdout)
    assert copied is not None, done.stdout
    staying_events = sum(
        len(reply.events)
        for session in staying
        for reply in cluster.stub("g1").Since(pb.SinceRequest(session_id=session), timeout=10)
    )
    assert cluster.events("g1") == staying_events + int(copied[1]) + int(copied[2])
    old.close()
    writer.client.close()


def test_bad_input_is_refused_with_a_clear_message(cluster: Cluster) -> None:
    etcd = ["--cluster", cluster.cluster]
    owner_of_5 = cluster.map().owner_of_slot(5).name
    cases = [
        (["5", "--to", "nowhere", *etcd], 1, "has no group 'nowhere'"),
        (["5000", "--to", "g1", *etcd], 2, "slot 5000 is outside 0-1023"),
        (["5", "--to", owner_of_5, *etcd], 1, f"already owned by group '{owner_of_5}'"),
        (["5", "--to", "g2"], 2, "needs --cluster etcd://"),
        (["5", "--to", "g2", "--cluster", f"etcd://127.0.0.1:{free_port()}"], 1, "etcd:"),
    ]
    for args, status, message in cases:
        done = run_cli(["cluster", "move-slot", *args], cluster.etcd.directory, timeout=30)
        assert done.returncode == status, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    assert cluster.map().frozen == frozenset()

    # A move's copy only fills a group that does not own the slot, at a given seq.
    current = cluster.map()
    (owned,) = ids_of_slot(current.group("g2").ranges[0][0], 1, "copy-")
    (foreign,) = ids_of_slot(current.group("g1").ranges[0][0], 1, "copy-")
    copy = ((MOVE_HEADER, MOVE_COPY),)
    stub = cluster.stub("g2")
    request = pb.AppendRequest(session_id=owned, events=[user("x")], expected_seq=0)
    error = failure(stub.Append, request, metadata=copy, timeout=5)
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "SLOT_OWNED", session_id=owned)
    request = pb.AppendRequest(session_id=foreign, events=[user("x")])
    error = failure(stub.Append, request, metadata=copy, timeout=5)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")


def test_a_move_that_cannot_finish_leaves_the_slot_where_it_was(cluster: Cluster) -> None:
    """A source member that never reports the freeze (listed, not running): the move gives up
    after --wait, puts the map back unfrozen one epoch up and exits 1; the slot's writes go on
    in its group."""
    current = cluster.map()
    g2 = current.group("g2")
    ghost = f"127.0.0.1:{free_port()}"
    groups = tuple(
        Group(g.name, (*g.members, ghost), g.ranges) if g.name == "g2" else g
        for g in current.groups
    )
    with_ghost = ShardMap(current.epoch + 1, groups)
    etcd = Endpoints((cluster.etcd.endpoint,), 2.0)
    try:
        found, _ = etcd.get(SHARDS_KEY)
        assert found is not None
        etcd.put(SHARDS_KEY, with_ghost.to_json().encode(), 0)
    finally:
        etcd.close()
    slot = g2.ranges[-1][1]
    (session,) = ids_of_slot(slot, 1, "back-")
    with Client(cluster.addresses["g2"], timeout=10) as client:
        client.append(session, [event("user_message", {"content": "one"})])
        move = ["move-slot", str(slot), "--to", "g1", "--wait", "2"]
        done = run_cli(
            ["cluster", *move, "--cluster", cluster.cluster],
            cluster.etcd.directory,
            timeout=60,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "not every member took the map" in done.stderr
        assert "the slot stays with g2" in done.stderr
        after = cluster.map()
        assert (after.epoch, after.frozen, after.owner_of_slot(slot).name) == (
            with_ghost.epoch + 2,
            frozenset(),
            "g2",
        )
        reply = client.append(session, [event("user_message", {"content": "two"})])
        assert reply.next_seq >= 2
