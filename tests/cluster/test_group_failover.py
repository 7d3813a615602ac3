"""`sessionlog dev cluster --groups 2` (what `make cluster` runs) as a real process: etcd, two
groups of three (--cluster, --shard-map etcd, --ack replica --sync-replicas 1) and HAProxy in
front. The banner names them all; HAProxy routes each group's sessions; under load through
HAProxy, SIGKILL of g1's leader pauses g1's sessions only (the pause is measured and printed),
g2's appends go on, the killed member comes back, and the history checker (``history``, over
both groups) finds nothing acknowledged lost; Ctrl-C stops every process the command started.

One dev cluster for the module; the tests run in order (the last one stops it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sessionlog.cluster.election import read_leader
from sessionlog.cluster.etcd import Endpoints, EtcdError, EtcdUnavailable
from sessionlog.cluster.settings import Endpoint
from sessionlog.shard.slots import slot_of
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import Client, DeadlineExceeded, Retry, TransportError, errors, event
from tests.cluster.history import Append, Entry, EpochStart, Outcome, check_groups, longest_gap
from tests.e2e._proc import clean_env, free_port, health_status
from tests.e2e._replication_cluster import wait_for

GROUPS = ("g1", "g2")
MEMBERS = 6
HTTP_OFFSET = 1000
"""The dev cluster's console ports: each member's gRPC port plus this."""
TTL = 2
"""The members' --lease-ttl: g1's failover takes about this, plus HAProxy's checks."""
WRITERS_PER_GROUP = 2
SESSIONS_PER_WRITER = 2
RETRY = Retry(give_up_after=20.0, initial_backoff=0.05, max_backoff=0.3)
ATTEMPT_SECONDS = 2.0
G2_GAP_SECONDS = 2.0
"""The longest g2 may go without an acknowledgement while g1 fails over."""
SERVING = health_pb2.HealthCheckResponse.SERVING
BANNER_END = "Ctrl-C stops every member, haproxy, then etcd."
MEMBER_LINE = re.compile(
    r"^  (m\d+)  (g\d+)  (127\.0\.0\.1:\d+)  console (127\.0\.0\.1:\d+)  pid (\d+)(  \(leader\))?$",
    re.MULTILINE,
)


@dataclass
class DevMember:
    name: str
    group: str
    address: str
    http: str
    pid: int


@dataclass
class Dev:
    process: subprocess.Popen[bytes]
    out: Path
    proxy: str
    etcd: Endpoint
    members: list[DevMember]
    pids: set[int] = field(default_factory=set)
    """Every process the command started, as far as its output says (restarts included)."""

    def text(self) -> str:
        return self.out.read_text()

    def children(self) -> list[int]:
        pid = self.process.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def group(self, name: str) -> list[DevMember]:
        return [m for m in self.members if m.group == name]

    def leader(self, group: str) -> tuple[str, int] | None:
        with contextlib.closing(Endpoints((self.etcd,), 1.0)) as endpoints:
            try:
                return read_leader(endpoints, group)
            except (EtcdUnavailable, EtcdError):
                return None

    def logs(self) -> str:
        root = self.out.parent / "dev"
        tails = [self.text()[-3000:]]
        for log in sorted(root.glob("*.log")):
            tails.append(f"--- {log.name} ---\n" + "\n".join(log.read_text().splitlines()[-15:]))
        return "\n".join(tails)


def _dev_ports() -> tuple[int, int]:
    """A first member port with it and the next five free, and the same at +1000 (the
    consoles), below Linux's ephemeral range; and two free ports in a row for etcd."""
    import random

    rng = random.Random()

    def free(ports: range) -> bool:
        with contextlib.ExitStack() as held:
            try:
                for port in ports:
                    probe = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    probe.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    for _ in range(500):
        base = rng.randrange(20_000, 31_000)
        etcd = rng.randrange(20_000, 32_000)
        members = range(base, base + MEMBERS)
        consoles = range(base + HTTP_OFFSET, base + HTTP_OFFSET + MEMBERS)
        if {etcd, etcd + 1} & {*members, *consoles}:
            continue
        if free(members) and free(consoles) and free(range(etcd, etcd + 2)):
            return base, etcd
    raise AssertionError("no free ports for the dev cluster")


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    root = tmp_path_factory.mktemp("dev-groups")
    port, etcd_port = _dev_ports()
    proxy = f"127.0.0.1:{free_port()}"
    argv = [
        sys.executable, "-m", "sessionlog.cli", "dev", "cluster", "--groups", "2",
        "--dir", str(root / "dev"), "--port", str(port), "--etcd-port", str(etcd_port),
        "--proxy-port", proxy.rsplit(":", 1)[1], "--lease-ttl", str(TTL),
    ]  # fmt: skip
    out = root / "dev.out"
    with out.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=clean_env(workers=False)
        )
    started: Dev | None = None
    try:
        wait_for(
            "the banner",
            lambda: BANNER_END in out.read_text() or process.poll() is not None,
            120,
            0.2,
        )
        assert process.poll() is None, out.read_text()
        members = [
            DevMember(name, group, address, http, int(pid))
            for name, group, address, http, pid, _ in MEMBER_LINE.findall(out.read_text())
        ]
        started = Dev(process, out, proxy, Endpoint("127.0.0.1", etcd_port), members)
        started.pids.update(started.children())
        owner = owner_of(started)
        for group in GROUPS:  # HAProxy's checks have found each group's leader
            probe = next(f"probe-{n}" for n in range(100) if owner(f"probe-{n}") == group)
            routed = functools.partial(_refused, started, probe)
            wait_for(f"HAProxy routes {group}'s writes", routed, 30, 0.1)
        yield started
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for pid in sorted(started.pids if started is not None else ()):
            with contextlib.suppress(ProcessLookupError):  # left behind by a failed test
                os.kill(pid, signal.SIGKILL)


def _refused(dev: Dev, session_id: str) -> bool:
    """An append through HAProxy reaches a primary, which refuses it (a wrong expected seq:
    nothing is written); False while it meets no primary."""
    with Client(dev.proxy) as client:
        try:
            said = [event("user_message", {"content": "probe"})]
            client.append(session_id, said, expected_seq=1_000_000, request_id="")
        except errors.SeqConflict:
            return True
        except (errors.Unavailable, errors.NotPrimary):
            return False
    raise AssertionError(f"{session_id} was written at seq 1000000")


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def owner_of(dev: Dev) -> Callable[[str], str]:
    """The map the cluster serves (GetShardMap through HAProxy, once the member that answers
    has read it from etcd): session id -> its group."""
    replies: list[pb.GetShardMapResponse] = []

    def loaded() -> bool:
        with grpc.insecure_channel(dev.proxy) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                replies.append(stub.GetShardMap(pb.GetShardMapRequest(), timeout=10))
            except grpc.RpcError:
                return False
        return bool(replies[-1].shard_map.groups)

    wait_for("the shard map served", loaded, 30, 0.1)
    reply = replies[-1]
    ranges: list[tuple[str, int, int]] = [
        (g.name, r.first, r.last) for g in reply.shard_map.groups for r in g.slot_ranges
    ]
    assert {name for name, _, _ in ranges} == set(GROUPS)

    def owner(session_id: str) -> str:
        slot = slot_of(session_id)
        return next(name for name, first, last in ranges if first <= slot <= last)

    return owner


def test_make_cluster_prints_both_groups_and_routes_through_haproxy(dev: Dev) -> None:
    """The banner lists etcd, HAProxy and six members, three per group, one leader each (as
    etcd says); its processes are the command's children; each group's sessions are written
    through HAProxy to that group, and `sessionlog sessions` through HAProxy lists them."""
    text = dev.text()
    assert f"haproxy  {dev.proxy}" in text
    assert f"etcd     etcd://127.0.0.1:{dev.etcd.port}" in text
    assert "groups   g1, g2" in text
    assert [m.group for m in dev.members] == ["g1"] * 3 + ["g2"] * 3
    pids = re.findall(r"\(pid (\d+),", text)  # etcd's, HAProxy's and the sync's
    assert sorted(dev.children()) == sorted([*map(int, pids), *(m.pid for m in dev.members)])
    for group in GROUPS:
        [leader] = [m for m in MEMBER_LINE.findall(text) if m[1] == group and m[5]]
        found = dev.leader(group)
        assert found is not None
        assert found[0] == leader[2]
    owner = owner_of(dev)
    candidates = [f"demo-{n}" for n in range(100)]
    ids = [s for g in GROUPS for s in [c for c in candidates if owner(c) == g][:3]]
    assert len(ids) == 6, "three of each group"
    for group in GROUPS:
        mine = [s for s in ids if owner(s) == group]
        with Client(dev.proxy, retry=RETRY) as client:
            for session_id in mine:
                wait_for(
                    f"{session_id} through HAProxy",
                    functools.partial(_write, client, session_id),
                    30,
                )
        for member in dev.group(group):
            with Client(member.address) as direct:
                for session_id in mine:
                    wait_for(
                        f"{session_id} on {member.name}",
                        functools.partial(_has_one, direct, session_id),
                        10,
                    )
    done = subprocess.run(
        [sys.executable, "-m", "sessionlog.cli", "sessions", "--server", dev.proxy],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(workers=False),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [line.split("\t")[0] for line in done.stdout.splitlines()] == sorted(ids)


def _has_one(client: Client, session_id: str) -> bool:
    return len(list(client.since(session_id))) == 1


def _write(client: Client, session_id: str) -> bool:
    try:
        client.append(session_id, [event("user_message", {"content": "hi"})], request_id=session_id)
    except errors.Unavailable:
        return False
    return True


def test_one_client_through_haproxy_writes_to_both_groups(dev: Dev) -> None:
    """The Python client given HAProxy's address writes to sessions of g1 and g2 in turn. Each
    group's epoch is its own leader key's etcd revision, so the two differ: the client keeps the
    highest epoch per group (the servers name their group beside it) and sends each write its
    own group's, so neither group takes the other's epoch for a newer leader's."""
    owner = owner_of(dev)
    candidates = [f"both-{n}" for n in range(100)]
    per_group = [[c for c in candidates if owner(c) == g][:3] for g in GROUPS]
    ids = [s for pair in zip(*per_group, strict=True) for s in pair]  # g1, g2, g1, ...
    assert len(ids) == 6, "three of each group"
    with Client(dev.proxy, retry=RETRY) as client:
        for _ in range(2):
            for session_id in ids:
                client.append(session_id, [event("user_message", {"content": "hi"})])
        for session_id in ids:
            assert len(list(client.since(session_id))) == 2


# -- writers through HAProxy, and the failover of one group ---------------------------------------


@dataclass(eq=False)
class Writer(threading.Thread):
    """Appends one or two events at a time through HAProxy to its own sessions (all of one
    group) until stopped, recording each append; each event names its append's request id and
    its index in it."""

    number: int
    sessions: list[str]
    proxy: str
    stopping: threading.Event
    appends: list[Append] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(daemon=True, name=f"writer-{self.number}")

    def run(self) -> None:
        next_seq: dict[str, int | None] = dict.fromkeys(self.sessions, 0)
        try:
            with Client(self.proxy, retry=RETRY, timeout=ATTEMPT_SECONDS) as client:
                for n in range(100_000):
                    if self.stopping.is_set():
                        return
                    self._append(client, n, next_seq)
        except BaseException as error:  # reported by the test
            self.failures.append(error)

    def _append(self, client: Client, n: int, next_seq: dict[str, int | None]) -> None:
        session = self.sessions[n % len(self.sessions)]
        rid = f"w{self.number}-r{n}"
        count = 1 + n % 2
        said = [
            event("user_message", {"content": f"{rid}/{i}", "rid": rid, "i": i})
            for i in range(count)
        ]
        sent = time.monotonic()

        def record(outcome: Outcome, **more: Any) -> None:
            self.appends.append(
                Append(
                    rid, session, self.proxy, sent, outcome, time.monotonic(), count=count, **more
                )
            )

        try:
            reply = client.append(session, said, request_id=rid, expected_seq=next_seq[session])
        except errors.SeqConflict as refused:
            record("refused", reason=refused.reason)
            next_seq[session] = None
            return
        except (
            errors.Unavailable,
            errors.NotPrimary,
            errors.LeadershipLost,
            errors.ReplicasUnavailable,
            TransportError,
        ) as failed:
            record("timeout" if isinstance(failed, DeadlineExceeded) else "error")
            next_seq[session] = None  # it may or may not have been written
            return
        record("ok", seq=reply.events[0].seq, epoch=client.epoch or None)
        next_seq[session] = reply.next_seq


class EpochWatch(threading.Thread):
    """Polls etcd's leader key of each group; records each epoch when first seen, with its
    leader."""

    def __init__(self, dev: Dev, stopping: threading.Event) -> None:
        super().__init__(daemon=True, name="epoch-watch")
        self.dev = dev
        self.stopping = stopping
        self.epochs: dict[str, dict[int, EpochStart]] = {g: {} for g in GROUPS}

    def run(self) -> None:
        with contextlib.closing(Endpoints((self.dev.etcd,), 1.0)) as endpoints:
            while not self.stopping.wait(0.05):
                for group in GROUPS:
                    try:
                        found = read_leader(endpoints, group)
                    except (EtcdUnavailable, EtcdError):
                        continue
                    if found is not None and found[1] not in self.epochs[group]:
                        start = EpochStart(found[1], found[0], time.monotonic())
                        self.epochs[group][found[1]] = start


def acknowledged(writers: list[Writer], sessions: set[str], after: float = 0.0) -> int:
    return sum(
        a.outcome == "ok" and a.session in sessions and a.done_at > after
        for w in writers
        for a in list(w.appends)
    )


def final_logs(dev: Dev, owner: Callable[[str], str], sessions: list[str]) -> dict[str, Any]:
    """group -> member -> session -> its events: each member's share of ``sessions`` (Since,
    straight to it), and any session of another group its store lists (without its events: it
    cannot read them)."""
    logs: dict[str, dict[str, dict[str, list[Entry]]]] = {g: {} for g in GROUPS}
    for member in dev.members:
        held: set[str] = set()
        with grpc.insecure_channel(member.address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            token = ""
            for _ in range(20):
                reply = stub.ListSessions(
                    pb.ListSessionsRequest(page_size=1000, page_token=token),
                    metadata=(("x-sessionlog-scope", "group"),),
                    timeout=10,
                )
                held |= {s.session_id for s in reply.sessions}
                token = reply.next_page_token
                if not token:
                    break
        log = logs[member.group][member.address] = {}
        for session in held:
            if owner(session) != member.group:
                log[session] = []
        with Client(member.address) as reader:
            for session in sessions:
                if owner(session) == member.group:
                    log[session] = [
                        Entry(e.seq, str(e.data["rid"]), int(float(str(e.data["i"]))))
                        for e in reader.since(session)
                    ]
    return logs


def converged(dev: Dev, group: str) -> None:
    """Every member of ``group`` SERVING (a follower once it has caught up with its leader)."""
    wait_for(
        f"every member of {group} serving",
        lambda: all(health_status(m.address, 0.5) == SERVING for m in dev.group(group)),
        60,
        0.1,
    )


def positions(dev: Dev, group: str) -> set[int | None]:
    """The replication position of each member of ``group`` (None: it did not answer)."""
    found: set[int | None] = set()
    for member in dev.group(group):
        with grpc.insecure_channel(member.address) as channel:
            stub = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                status = stub.GetReplicationStatus(rpb.GetReplicationStatusRequest(), timeout=2)
                found.add(status.position)
            except grpc.RpcError:
                found.add(None)
    return found


def at_one_position(dev: Dev, group: str) -> bool:
    """Every member of ``group`` answers, at the same position."""
    found = positions(dev, group)
    return None not in found and len(found) == 1


def test_killing_one_groups_leader_pauses_only_that_group(
    dev: Dev, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four writers through HAProxy, two per group; g1's leader SIGKILLed once both groups
    took writes: g2's acknowledgements never stop for more than G2_GAP_SECONDS, g1's resume at
    a new epoch after a pause (printed), the dev cluster restarts the killed member, which
    rejoins; the history over both groups has no anomaly."""
    owner = owner_of(dev)
    candidates = (f"load-{n}" for n in range(1000))
    sessions: dict[str, list[str]] = {g: [] for g in GROUPS}
    for session_id in candidates:
        chosen = sessions[owner(session_id)]
        if len(chosen) < WRITERS_PER_GROUP * SESSIONS_PER_WRITER:
            chosen.append(session_id)
        if all(len(s) == WRITERS_PER_GROUP * SESSIONS_PER_WRITER for s in sessions.values()):
            break
    stopping = threading.Event()
    writers = [
        Writer(
            len(GROUPS) * k + i,
            sessions[group][k * SESSIONS_PER_WRITER : (k + 1) * SESSIONS_PER_WRITER],
            dev.proxy,
            stopping,
        )
        for i, group in enumerate(GROUPS)
        for k in range(WRITERS_PER_GROUP)
    ]
    watch = EpochWatch(dev, stopping)
    g1, g2 = set(sessions["g1"]), set(sessions["g2"])
    watch.start()
    for writer in writers:
        writer.start()
    try:
        wait_for(
            "both groups take writes",
            lambda: min(acknowledged(writers, g1), acknowledged(writers, g2)) >= 20,
            30,
            0.05,
        )
        found = dev.leader("g1")
        assert found is not None
        leader_address, epoch = found
        [leader] = [m for m in dev.group("g1") if m.address == leader_address]
        killed_at = time.monotonic()
        os.kill(leader.pid, signal.SIGKILL)
        wait_for("a new g1 leader", lambda: (dev.leader("g1") or ("", 0))[1] > epoch, 30, 0.05)
        wait_for(
            "g1 takes writes again",
            lambda: any(
                a.outcome == "ok"
                and a.session in g1
                and a.done_at > killed_at
                and (a.epoch or 0) > epoch
                for w in writers
                for a in list(w.appends)
            ),
            30,
            0.05,
        )
        wait_for("the killed member restarts", lambda: "restarted: pid" in dev.text(), 30, 0.1)
        [restarted] = re.findall(r"restarted: pid (\d+)", dev.text())
        dev.pids.add(int(restarted))
        leader.pid = int(restarted)
        converged(dev, "g1")  # the killed member has rejoined and caught up
        found = dev.leader("g1")
        assert found is not None
        assert found[0] != leader.address, "the restarted member follows the new leader"
        after = time.monotonic()
        wait_for(
            "writes go on in both groups",
            lambda: min(acknowledged(writers, g1, after), acknowledged(writers, g2, after)) >= 10,
            30,
            0.05,
        )
    finally:
        stopping.set()
        for writer in writers:
            writer.join(RETRY.give_up_after + 10)
        watch.join(5)
    assert [w.failures for w in writers] == [[]] * len(writers)
    appends = [a for w in writers for a in w.appends]
    for group in GROUPS:  # every member holds its leader's newest change
        wait_for(
            f"{group}'s members at one position",
            functools.partial(at_one_position, dev, group),
            30,
            0.1,
        )
    primaries = {}
    for group in GROUPS:
        found = dev.leader(group)
        assert found is not None
        primaries[group] = found[0]
    logs = final_logs(dev, owner, [s for group in GROUPS for s in sessions[group]])
    epochs = {g: list(watch.epochs[g].values()) for g in GROUPS}
    anomalies = check_groups(appends, logs, primaries, owner, epochs, proxy=dev.proxy)
    mine = {g: [a for a in appends if owner(a.session) == g] for g in GROUPS}
    resumed_at = min(
        a.done_at
        for a in mine["g1"]
        if a.outcome == "ok" and a.done_at > killed_at and (a.epoch or 0) > epoch
    )
    g1_pause, g1_paused_at = longest_gap(mine["g1"], killed_at - 1.0, resumed_at + 1.0)
    g2_gap, _ = longest_gap(mine["g2"], killed_at, resumed_at)
    summary: dict[str, Any] = {
        "g1_pause_seconds": round(g1_pause, 2),
        "g1_pause_began_after_kill_seconds": round(g1_paused_at - killed_at, 2),
        "g1_writes_resumed_after_kill_seconds": round(resumed_at - killed_at, 2),
        "g2_longest_gap_during_failover_seconds": round(g2_gap, 2),
        "acknowledged": {g: sum(a.outcome == "ok" for a in mine[g]) for g in GROUPS},
        "indeterminate": {
            g: sum(a.outcome in ("timeout", "error") for a in mine[g]) for g in GROUPS
        },
        "epochs": {g: sorted(watch.epochs[g]) for g in GROUPS},
        "anomalies": [f"{a.kind}: {a.detail}" for a in anomalies],
    }  # fmt: skip
    (tmp_path / "group-failover-summary.json").write_text(json.dumps(summary, indent=2))
    with capsys.disabled():
        print(f"\ngroup failover through HAProxy: {json.dumps(summary)}")
    assert anomalies == [], "\n".join(summary["anomalies"])
    assert g2_gap < G2_GAP_SECONDS, f"g2 paused while g1 failed over: {summary}"
    assert len(watch.epochs["g2"]) == 1, "g2 kept its leader"
    assert len(watch.epochs["g1"]) >= 2
    assert not [a for a in appends if a.outcome == "refused"], "an expected_seq was refused"


def test_ctrl_c_stops_every_process_it_started(dev: Dev) -> None:
    """SIGINT: the command exits 0 after stopping etcd, HAProxy, the HAProxy sync and every
    member (the restarted one too)."""
    children = dev.children()
    assert len(children) == 3 + MEMBERS, dev.text()
    dev.pids.update(children)
    dev.process.send_signal(signal.SIGINT)
    assert dev.process.wait(60) == 0, dev.logs()
    for pid in sorted(dev.pids):
        wait_for(f"pid {pid} gone", functools.partial(gone, pid), 15, 0.1)
