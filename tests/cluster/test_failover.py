"""Automatic failover, end to end, checked like Jepsen checks a history.

etcd and a group of three `sessionlog serve --cluster` processes with ``--ack replica
--sync-replicas 1``; writers append with request ids (and ``expected_seq`` whenever they know
the session's next seq) through the Python client, given every member's address and the etcd
endpoint, and record every acknowledged append (its seqs, the member that acknowledged it and
the epoch its reply carried). Meanwhile the test injects real faults, one at a time, each once
the group is whole again:

    kill       SIGKILL of the leader (it restarts on its folder and rejoins)
    freeze     SIGSTOP of the leader for longer than the lease TTL, then SIGCONT: it wakes as a
               zombie that must find itself fenced before it answers anything
    partition  the leader's link to etcd black-holed (its relay) until another member leads
    isolate    the leader cut off from its replicas and the clients (the relay in front of it
               black-holed) while it keeps its etcd lease, for longer than --sync-timeout:
               nothing may be acknowledged without a replica, and no one else may lead
    replica    SIGKILL of a follower, restarted at once
    etcd       etcd stopped and started again on its data

After the faults, everything healed and the writers stopped, ``history.check`` finds no
anomaly: nothing acknowledged is lost or misplaced, nothing is in a log twice, no epoch was
acknowledged by two members, none by a member that did not lead it, and no acknowledgement at an
epoch after a newer one existed; every member holds the same logs, and the same checksum at the
leader's position. Failover time is measured from each leader fault to the first append
acknowledged by a new leader, and printed.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog_client import Client, DeadlineExceeded, Retry, TransportError, errors, event
from sessionlog_client._routing import LOG, REPLICATION
from sessionlog_client.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog_client.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.cluster._group import ELECTION_SECONDS, GROUP, Group, Member
from tests.cluster.history import Anomaly, Append, Entry, EpochStart, Outcome, check
from tests.e2e._replication_cluster import changes_raw, percentile

# A 2 s lease, a 3 s isolation and 2 s attempts: the run stays alone on the machine (serial).
pytestmark = pytest.mark.serial

TTL = 2
"""The members' --lease-ttl (etcd's floor): a failover takes about this long."""
ROUNDS = int(os.environ.get("SESSIONLOG_FAILOVER_ROUNDS", "1"))
"""The longer manual run: SESSIONLOG_FAILOVER_ROUNDS=10 gives 300 faults (about 20 minutes)."""
FAULTS = ["kill", "freeze", "partition", "replica", "isolate", "etcd"] * 5 * ROUNDS
"""30 faults a round: 20 of the leader (kill, freeze, partition, isolate), 5 of a follower, 5
etcd restarts."""
ISOLATE_SECONDS = 3.0
"""How long an isolated leader stays cut off: past --sync-timeout and --replica-timeout."""
LEADER_FAULTS = ("kill", "freeze", "partition")
WRITERS = 3
SESSIONS_PER_WRITER = 2
RETRY = Retry(give_up_after=20.0, initial_backoff=0.05, max_backoff=0.3)
ATTEMPT_SECONDS = 2.0
"""One attempt's deadline: a frozen leader holds a call until then, then the client moves on."""
MEMBER_ARGS = [
    "--lease-ttl", str(TTL),
    "--ack", "replica",
    "--sync-replicas", "1",
    "--sync-timeout", "2",
    "--replica-timeout", "1",
    "--log-level", "info",
]  # fmt: skip


# -- the writers ---------------------------------------------------------------------------------


class RecordingClient(Client):
    """The Python client, and what the last reply of each call said: which member sent it and
    its ``sessionlog-epoch`` trailing metadata. (An interceptor on each member's channel: the
    client's own routing is what is under test.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last: tuple[str, int | None] = ("", None)
        super().__init__(*args, **kwargs)

    def _open_member(self, address: str) -> tuple[grpc.Channel, dict[str, Any]]:
        channel, _ = super()._open_member(address)
        watched = grpc.intercept_channel(channel, _Trailers(self, address))
        stubs = {
            LOG: pb_grpc.SessionLogServiceStub(watched),  # type: ignore[no-untyped-call]
            REPLICATION: rpb_grpc.ReplicationServiceStub(watched),  # type: ignore[no-untyped-call]
        }
        return watched, stubs


class _Trailers(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, client: RecordingClient, address: str) -> None:
        self.client = client
        self.address = address

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, request)
        epoch = None
        try:
            for key, value in outcome.trailing_metadata() or ():
                if key == "sessionlog-epoch":
                    epoch = int(value)
        except grpc.RpcError:
            pass
        self.client.last = (self.address, epoch)
        return outcome


@dataclass(eq=False)
class Writer(threading.Thread):
    """Appends one or two events at a time to its own sessions until stopped; each event's data
    names its append's request id and its index in the append."""

    number: int
    addresses: list[str]
    cluster: str
    stopping: threading.Event
    appends: list[Append] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(daemon=True, name=f"writer-{self.number}")

    @property
    def sessions(self) -> list[str]:
        return [f"w{self.number}-s{k}" for k in range(SESSIONS_PER_WRITER)]

    def run(self) -> None:
        next_seq: dict[str, int | None] = dict.fromkeys(self.sessions, 0)
        try:
            client = RecordingClient(
                self.addresses,
                cluster=self.cluster,
                group=GROUP,
                retry=RETRY,
                timeout=ATTEMPT_SECONDS,
            )
            with client:
                for n in range(100_000):
                    if self.stopping.is_set():
                        return
                    self._append(client, n, next_seq)
        except BaseException as error:  # reported by the test
            self.failures.append(error)

    def _append(self, client: RecordingClient, n: int, next_seq: dict[str, int | None]) -> None:
        session = self.sessions[n % SESSIONS_PER_WRITER]
        rid = f"w{self.number}-r{n}"
        count = 1 + n % 2
        events = [
            event("user_message", {"content": f"{rid}/{i}", "rid": rid, "i": i})
            for i in range(count)
        ]
        expected = next_seq[session]
        sent = time.monotonic()
        try:
            reply = client.append(session, events, request_id=rid, expected_seq=expected)
        except errors.SeqConflict as refused:
            self.appends.append(
                Append(
                    rid,
                    session,
                    client.last[0],
                    sent,
                    "refused",
                    time.monotonic(),
                    count=count,
                    reason=refused.reason,
                )
            )
            next_seq[session] = None
            return
        except (errors.Unavailable, errors.NotPrimary, TransportError) as failed:
            outcome: Outcome = "timeout" if isinstance(failed, DeadlineExceeded) else "error"
            self.appends.append(
                Append(rid, session, client.last[0], sent, outcome, time.monotonic(), count=count)
            )
            next_seq[session] = None  # it may or may not have been written
            return
        server, epoch = client.last
        self.appends.append(
            Append(
                rid,
                session,
                server,
                sent,
                "ok",
                time.monotonic(),
                seq=reply.events[0].seq,
                count=count,
                epoch=epoch,
            )
        )
        next_seq[session] = reply.next_seq


class EpochWatch(threading.Thread):
    """Polls etcd's leader key and records each epoch when first seen, with its leader."""

    def __init__(self, group: Group, stopping: threading.Event) -> None:
        super().__init__(daemon=True, name="epoch-watch")
        self.group = group
        self.stopping = stopping
        self.epochs: dict[int, EpochStart] = {}

    def run(self) -> None:
        while not self.stopping.wait(0.02):
            found = self.group.leader()
            if found is not None and found[1] not in self.epochs:
                self.epochs[found[1]] = EpochStart(found[1], found[0].address, time.monotonic())


# -- the faults ----------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    member: str
    at: float
    epoch: int
    """The leader's epoch when it was injected."""


def inject(group: Group, kind: str, rng: random.Random) -> Fault:
    """Inject ``kind`` and undo it once it has had its effect (the group then heals itself)."""
    leader, epoch = group.wait_healthy()
    followers = [m for m in group.members if m is not leader]
    target = rng.choice(followers) if kind == "replica" else leader
    fault = Fault(kind, target.name, time.monotonic(), epoch)
    if kind == "kill":
        leader.kill()
        group.wait_new_leader(epoch)
        leader.start()
    elif kind == "freeze":
        leader.freeze()
        group.wait_new_leader(epoch)
        time.sleep(0.2)
        leader.thaw()
    elif kind == "partition":
        leader.etcd_link.blackhole(True)
        leader.etcd_link.cut()
        group.wait_new_leader(epoch)
        leader.etcd_link.blackhole(False)
        leader.etcd_link.cut()
    elif kind == "isolate":
        front = leader.front
        assert front is not None, "the group runs with fronts"
        front.blackhole(True)
        front.cut()
        time.sleep(ISOLATE_SECONDS)
        found = group.leader()
        assert found is not None, "no leader while the leader was isolated"
        assert found[1] == epoch, f"the isolated leader lost epoch {epoch}"
        front.blackhole(False)
        front.cut()
    elif kind == "replica":
        target.kill()
        target.start()
    elif kind == "etcd":
        group.etcd.stop()
        time.sleep(0.3)
        group.etcd.start()
    else:
        raise AssertionError(kind)
    return fault


def failover_seconds(faults: list[Fault], appends: list[Append]) -> list[float]:
    """For each leader fault: the time from it to the first append a newer leader acknowledged."""
    acked = sorted(
        (a for a in appends if a.outcome == "ok" and a.epoch is not None), key=lambda a: a.done_at
    )
    out = []
    for fault in faults:
        if fault.kind not in LEADER_FAULTS:
            continue
        later = (a for a in acked if a.done_at > fault.at and (a.epoch or 0) > fault.epoch)
        first = next(later, None)
        assert first is not None, f"no append was acknowledged after the {fault}"
        out.append(first.done_at - fault.at)
    return out


# -- the final state -------------------------------------------------------------------------------


def final_logs(group: Group, sessions: list[str]) -> dict[str, dict[str, list[Entry]]]:
    logs: dict[str, dict[str, list[Entry]]] = {}
    for member in group.members:
        with Client(member.address) as reader:
            logs[member.address] = {
                session: [
                    Entry(e.seq, str(e.data["rid"]), int(float(str(e.data["i"]))))
                    for e in reader.since(session)
                ]
                for session in sessions
            }
    return logs


def converged(group: Group, leader: Member) -> int:
    """Wait until every member holds the leader's newest position; that position."""
    deadline = time.monotonic() + ELECTION_SECONDS
    while time.monotonic() < deadline:
        statuses = [m.status() for m in group.members]
        positions = {s.position for s in statuses if s is not None}
        if None not in statuses and len(positions) == 1:
            return positions.pop()
        time.sleep(0.1)
    raise AssertionError(f"members did not converge: {[m.status() for m in group.members]}")


def checksum_at(member: Member, position: int) -> bytes:
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(member.address, options=options) as channel:
        [record] = changes_raw(channel, position)
    return rpb.Change.FromString(record).checksum


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    with Group(tmp_path, members=3, args=MEMBER_ARGS, fronts=True) as started:
        yield started


@pytest.mark.timeout(900 * ROUNDS)
def test_thirty_faults_lose_no_acknowledged_append(
    group: Group, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """30 faults (kills, freezes, etcd partitions and isolation of the leader, follower kills,
    etcd restarts) under three writers: the history has no anomaly, every member converges to the
    same data and checksum, and a new leader acknowledges writes within a few seconds."""
    rng = random.Random(15)
    stopping = threading.Event()
    watch = EpochWatch(group, stopping)
    writers = [Writer(w, group.addresses, group.cluster, stopping) for w in range(WRITERS)]
    watch.start()
    for writer in writers:
        writer.start()
    faults: list[Fault] = []
    started = time.monotonic()
    try:
        time.sleep(1.0)
        for kind in FAULTS:
            faults.append(inject(group, kind, rng))
        leader, _ = group.wait_healthy()
        time.sleep(1.0)  # appends go on against the healed group
    finally:
        stopping.set()
        for writer in writers:
            writer.join(RETRY.give_up_after + 10)
        watch.join(5)
    assert [w.failures for w in writers] == [[]] * WRITERS
    appends = [a for w in writers for a in w.appends]
    leader, _ = group.wait_healthy()
    position = converged(group, leader)
    logs = final_logs(group, [s for w in writers for s in w.sessions])
    anomalies: list[Anomaly] = check(appends, logs, leader.address, list(watch.epochs.values()))
    sums = {m.name: checksum_at(m, position) for m in group.members}
    failovers = failover_seconds(faults, appends)
    acknowledged = sum(a.outcome == "ok" for a in appends)
    summary: dict[str, Any] = {
        "faults": len(faults),
        "by_kind": {k: sum(f.kind == k for f in faults) for k in dict.fromkeys(FAULTS)},
        "appends": len(appends),
        "acknowledged": acknowledged,
        "indeterminate": sum(a.outcome in ("timeout", "error") for a in appends),
        "refused": sum(a.outcome == "refused" for a in appends),
        "epochs": len(watch.epochs),
        "failover_p50_seconds": round(percentile(failovers, 0.5), 2),
        "failover_p99_seconds": round(percentile(failovers, 0.99), 2),
        "failover_max_seconds": round(max(failovers), 2),
        "run_seconds": round(time.monotonic() - started, 1),
        "anomalies": [f"{a.kind}: {a.detail}" for a in anomalies],
    }
    (tmp_path / "failover-summary.json").write_text(json.dumps(summary, indent=2))
    with capsys.disabled():
        print(f"\nfailover run: {json.dumps(summary)}")
    assert anomalies == [], "\n".join(summary["anomalies"])
    assert len(set(sums.values())) == 1, sums
    assert len(faults) == len(FAULTS)
    assert acknowledged > 10 * len(faults)
    assert not [a for a in appends if a.outcome == "refused"], "an expected_seq was refused"
