"""`sessionlog cluster move-slot` through failures: the target group's primary SIGKILLed in the
middle of the copy, and the mover itself SIGKILLed in the middle of its clear, its live copy
and its paused copy.

A failover of the target makes the mover look the primaries up again and copy afresh to the
new one; the move completes, and every append a writer had acknowledged through it is in the
target at its seq. A mover killed before its freeze leaves the slot with the source, unfrozen
and writable; one killed while the slot is frozen leaves it frozen (its writes answered
SLOT_MOVING), and running the move again (what an operator does) carries on from the freeze
and flips it. In each case nothing acknowledged is lost. ``SESSIONLOG_MOVE_PACE`` slows the
mover so that a kill lands inside a step. Servers (g1: one member; g2: two, ``--lease-ttl 2``)
are module-scoped.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from sessionlog.cluster.etcd import Endpoints
from sessionlog.shard import ShardMap
from sessionlog.shard.shardmap import SHARDS_KEY
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import Client, event
from tests.cluster._etcd import EtcdProcess
from tests.cluster.test_move_slot import Writer, ids_of_slot, primary_of, said
from tests.e2e._proc import SESSIONLOG, ServerProcess, clean_env, free_port, run_cli


@dataclass
class Cluster:
    etcd: EtcdProcess
    root: Path
    members: dict[str, list[str]]
    servers: dict[str, ServerProcess] = field(default_factory=dict)
    """By address."""
    args: dict[str, list[str]] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        return f"etcd://{self.etcd.endpoint}"

    def primary(self, group: str) -> str:
        return primary_of(group, [a for a in self.members[group] if self.running(a)])

    def running(self, address: str) -> bool:
        process = self.servers[address].process
        return process is not None and process.poll() is None

    def start(self, address: str) -> None:
        server = ServerProcess(self.args[address], self.root, env=clean_env(workers=False))
        self.servers[address] = server.start()

    def map(self) -> ShardMap:
        etcd = Endpoints((self.etcd.endpoint,), 2.0)
        try:
            found, _ = etcd.get(SHARDS_KEY)
        finally:
            etcd.close()
        assert found is not None
        return ShardMap.from_json(found.value)

    def move(self, slot: int, to: str, pace: float) -> subprocess.Popen[str]:
        """The move as an operator runs it, in a process of its own (output line-buffered)."""
        env = clean_env(workers=False, SESSIONLOG_MOVE_PACE=str(pace), PYTHONUNBUFFERED="1")
        command = ["cluster", "move-slot", str(slot), "--to", to, "--cluster", self.cluster]
        return subprocess.Popen(
            [str(SESSIONLOG), *command],
            cwd=self.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("move-failover")
    with EtcdProcess(root / "etcd") as etcd:
        members = {
            "g1": [f"127.0.0.1:{free_port()}"],
            "g2": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"],
        }
        etcd_client = Endpoints((etcd.endpoint,), 2.0)
        etcd_client.put(SHARDS_KEY, ShardMap.even_split(members).to_json().encode(), 0)
        etcd_client.close()
        state = Cluster(etcd, root, members)
        try:
            for name, addresses in members.items():
                for index, address in enumerate(addresses):
                    state.args[address] = [
                        "--data", str(root / f"{name}-{index}"), "--listen", address,
                        "--advertise", address, "--cluster", f"etcd://{etcd.endpoint}",
                        "--group", name, "--shard-map", "etcd", "--log-format", "json",
                        "--lease-ttl", "2",
                    ]  # fmt: skip
                    state.start(address)
            for address, server in state.servers.items():
                server.wait_serving(address, timeout=60)
            for name in members:
                state.primary(name)
            yield state
        finally:
            for server in state.servers.values():
                server.stop()


class Output(threading.Thread):
    """Collects a mover's output lines as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.lines: list[str] = []

    def run(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.append(line)

    def wait_for(self, text: str, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline, f"{text!r} not said:\n{self.text}"
            assert self.process.poll() is None or self.is_alive(), self.text
            time.sleep(0.02)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def fill(client: Client, sessions: list[str], events: int) -> None:
    for session in sessions:
        batch = [event("user_message", {"content": f"{session}#first"})]
        batch += [event("user_message", {"content": f"{session}~{n}"}) for n in range(1, events)]
        client.append(session, batch)


def check_history(address: str, sessions: list[str], writer: Writer, events: int) -> int:
    """Every session in the group at ``address`` is whole: dense seqs, what was filled in,
    and each acknowledged append at its seq, none twice. The events checked."""
    checked = 0
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for session in sessions:
            stored = [
                e
                for reply in stub.Since(pb.SinceRequest(session_id=session), timeout=10)
                for e in reply.events
            ]
            contents = [said(e) for e in stored]
            assert [e.seq for e in stored] == list(range(len(stored))), session
            assert len(set(contents)) == len(contents), session  # nothing written twice
            assert contents[0] == f"{session}#first", session
            assert len(contents) >= events, session
            for s, seq, text, _ in writer.acked:
                if s == session:
                    assert contents[seq] == text, (session, seq)
            checked += len(stored)
    return checked


def writing(cluster: Cluster, sessions: list[str]) -> Writer:
    writer = Writer(cluster.primary("g1"), sessions)
    writer.start()
    return writer


def stop(writer: Writer) -> None:
    writer.stop.set()
    writer.join(60)
    assert not writer.is_alive()
    writer.client.close()


def test_a_move_survives_a_failover_of_the_target(cluster: Cluster) -> None:
    """The target's primary SIGKILLed mid-copy: the mover waits for the new leader, copies
    afresh to it and completes; every acknowledged append is in the target after the flip."""
    before = cluster.map()
    slot = before.group("g1").ranges[0][0] + 3
    sessions = ids_of_slot(slot, 150, "fo-")
    with Client(cluster.primary("g1"), timeout=10) as client:
        fill(client, sessions, 4)
    writer = writing(cluster, sessions[:6])
    target = cluster.primary("g2")
    started = time.monotonic()
    mover = cluster.move(slot, "g2", pace=0.03)
    output = Output(mover)
    output.start()
    try:
        output.wait_for("copying slot")
        time.sleep(1.5)  # some 50 sessions into the copy
        assert mover.poll() is None, output.text
        cluster.servers[target].kill()
        survivor = next(a for a in cluster.members["g2"] if a != target)
        deadline = time.monotonic() + 30
        while primary_of("g2", [survivor]) != survivor:
            assert time.monotonic() < deadline, "no new leader in g2"
            time.sleep(0.1)
        cluster.start(target)  # back as a replica: the move waits for every member's map
        assert mover.wait(120) == 0, output.text
        took = time.monotonic() - started
        time.sleep(1.0)
    finally:
        stop(writer)
        if mover.poll() is None:
            mover.kill()
    output.join(5)
    assert "afresh" in output.text, output.text  # the kill landed inside the copy
    assert "every member of g2 holds the copy" in output.text  # before the flip
    print(f"\nmove-slot through a target failover took {took:.2f} s\n{output.text}")
    after = cluster.map()
    assert (after.owner_of_slot(slot).name, after.frozen) == ("g2", frozenset())
    assert not writer.failed, writer.failed[:3]
    assert check_history(cluster.primary("g2"), sessions, writer, 4) >= len(sessions) * 4


def test_a_mover_killed_before_the_freeze_leaves_the_slot_writable(cluster: Cluster) -> None:
    """A mover SIGKILLed during its clear, then one during its live copy: the slot stays with
    the source, unfrozen, taking writes; a rerun moves it and nothing acknowledged is lost."""
    before = cluster.map()
    slot = before.group("g1").ranges[0][0] + 11
    sessions = ids_of_slot(slot, 40, "kb-")
    with Client(cluster.primary("g1"), timeout=10) as client:
        fill(client, sessions, 3)
    writer = writing(cluster, sessions[:4])
    try:
        for step, linger in (("clearing", 0.0), ("copying slot", 1.0)):
            mover = cluster.move(slot, "g2", pace=0.2)
            output = Output(mover)
            output.start()
            output.wait_for(step)
            time.sleep(linger)
            assert mover.poll() is None, output.text
            mover.kill()
            mover.wait(10)
            held = cluster.map()
            assert (held.owner_of_slot(slot).name, held.frozen) == ("g1", frozenset())
            acked = len(writer.acked)
            time.sleep(0.5)
            assert len(writer.acked) > acked  # still writable at the source
        done = run_cli(
            ["cluster", "move-slot", str(slot), "--to", "g2", "--cluster", cluster.cluster],
            cluster.root,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(0.5)
    finally:
        stop(writer)
    assert not writer.failed, writer.failed[:3]
    assert cluster.map().owner_of_slot(slot).name == "g2"
    check_history(cluster.primary("g2"), sessions, writer, 3)


def test_a_mover_killed_while_frozen_is_finished_by_a_rerun(cluster: Cluster) -> None:
    """A mover SIGKILLed in its paused copy leaves the slot frozen (writes SLOT_MOVING, the
    writer's client retrying them); rerunning the move carries on from the freeze and flips
    the slot; every acknowledged append is in the target."""
    before = cluster.map()
    slot = before.group("g1").ranges[0][0] + 29
    sessions = ids_of_slot(slot, 40, "kf-")
    with Client(cluster.primary("g1"), timeout=10) as client:
        fill(client, sessions, 3)
    writer = writing(cluster, sessions[:4])
    try:
        mover = cluster.move(slot, "g2", pace=0.1)
        output = Output(mover)
        output.start()
        output.wait_for("frozen at epoch")
        time.sleep(0.5)
        mover.kill()
        mover.wait(10)
        held = cluster.map()
        assert (held.owner_of_slot(slot).name, held.frozen) == ("g1", frozenset({slot}))
        done = run_cli(
            ["cluster", "move-slot", str(slot), "--to", "g2", "--cluster", cluster.cluster],
            cluster.root,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(0.5)
    finally:
        stop(writer)
    assert not writer.failed, writer.failed[:3]
    after = cluster.map()
    assert (after.owner_of_slot(slot).name, after.frozen) == ("g2", frozenset())
    check_history(cluster.primary("g2"), sessions, writer, 3)
