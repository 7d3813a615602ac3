"""`sessionlog serve --cluster`: real member processes and a real etcd. One leader that takes
writes at etcd's epoch while the others replicate it and name it; no manual promotion; a
leader cut off from etcd refuses writes naming no one, and resumes at the same epoch when its
lease survived; a deposed leader with changes of its own rejoins by itself and reports them;
after three faults, only the synchronous member takes over; `sessionlog dev cluster` starts
and stops a whole group."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import error_info
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import Client, Retry, event
from tests.cluster._group import GROUP, SERVING, Group, Member, log_entries
from tests.e2e._proc import clean_env, free_ports_in_a_row, run_cli
from tests.e2e._replication_cluster import wait_for

LOCAL = ["--lease-ttl", "2", "--replica-timeout", "1", "--log-level", "info"]


def append(member: Member, session: str, text: str, request_id: str = "") -> tuple[int, int]:
    """One append straight to ``member`` (no routing): (its seq, the reply's epoch)."""
    with grpc.insecure_channel(member.direct) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.AppendRequest(session_id=session, request_id=request_id)
        request.events.add(type=event_pb2.EVENT_TYPE_USER_MESSAGE).data.update({"content": text})
        reply, call = stub.Append.with_call(request, timeout=5)
    epoch = dict(call.trailing_metadata())["sessionlog-epoch"]
    return reply.events[0].seq, int(epoch)


def refused(member: Member, session: str = "s") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        append(member, session, "refused")
    return caught.value


def test_one_member_leads_at_etcds_epoch_and_the_others_name_it(tmp_path: Path) -> None:
    """The leader takes writes stamped with the leader key's create revision; the followers
    replicate them, refuse writes with NOT_PRIMARY naming the leader, report the group in their
    status, and refuse a manual promotion, as the leader refuses a manual fence
    (CLUSTER_MANAGED)."""
    with Group(tmp_path, members=3, args=LOCAL) as group:
        leader, epoch = group.wait_healthy()
        seq, stamped = append(leader, "s", "hello", request_id="r1")
        assert (seq, stamped) == (0, epoch)
        status = leader.status()
        assert status is not None
        assert status.cluster.role == rpb.CLUSTER_ROLE_LEADER
        assert (status.cluster.group, status.cluster.member) == (GROUP, leader.address)
        assert status.cluster.epoch == status.epoch == epoch
        assert status.cluster.lease_remaining.ToNanoseconds() > 0
        for follower in (m for m in group.members if m is not leader):
            error = refused(follower)
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            info = error_info(error)
            assert info.reason == "NOT_PRIMARY"
            assert info.metadata["primary"] == leader.address
            seen = follower.status()
            assert seen is not None
            assert seen.cluster.role == rpb.CLUSTER_ROLE_FOLLOWER
            assert seen.cluster.leader == leader.address
            assert seen.state in (
                rpb.REPLICATION_STATE_STREAMING,
                rpb.REPLICATION_STATE_CATCHING_UP,
            )
            with grpc.insecure_channel(follower.direct) as channel:
                admin = apb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.RpcError) as promoted:
                    admin.Promote(apb.PromoteRequest(), timeout=5)
            assert promoted.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_info(promoted.value).reason == "CLUSTER_MANAGED"
        # Nor is the leader fenced by hand (an epoch etcd never gave would outrun its own).
        with grpc.insecure_channel(leader.direct) as channel:
            admin = apb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as fenced:
                admin.Fence(apb.FenceRequest(epoch=epoch + 1000), timeout=5)
        assert fenced.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(fenced.value).reason == "CLUSTER_MANAGED"
        assert append(leader, "s", "still the leader", request_id="r2") == (1, epoch)
        wait_for(
            "the followers hold the appends",
            lambda: all(position(m) == 2 for m in group.members),
            10,
        )
        follower = next(m for m in group.members if m is not leader)
        stats = run_cli(["admin", "stats", "--server", follower.direct], tmp_path)
        assert stats.returncode == 0, stats.stderr
        assert "cluster role" in stats.stdout
        assert "follower" in stats.stdout
        assert f"cluster leader                 {leader.address}" in stats.stdout
        with Client(group.addresses[::-1], cluster=group.cluster, group=GROUP) as client:
            client.append("s", [event("user_message", {"content": "routed"})])
            assert client.current == leader.address


@pytest.mark.serial  # fences itself within 2.5 s
def test_a_leader_cut_off_from_etcd_names_no_one_then_resumes_at_its_epoch(
    tmp_path: Path,
) -> None:
    """Alone in its group, a leader whose etcd link goes dark stops writing within TTL/2
    (NOT_PRIMARY with no primary, health NOT_SERVING, state FENCED); healed before its lease
    ran out, it takes writes again in the same epoch."""
    args = ["--lease-ttl", "4", "--log-level", "info"]
    with Group(tmp_path, members=1, args=args) as group:
        leader, epoch = group.wait_healthy()
        append(leader, "s", "before")
        leader.etcd_link.blackhole(True)
        leader.etcd_link.cut()
        cut_at = time.monotonic()
        wait_for("the leader fences itself", lambda: leader.health() != SERVING, 4)
        assert time.monotonic() - cut_at < 2.5  # TTL/2, and a check interval
        error = refused(leader)
        info = error_info(error)
        assert (error.code(), info.reason) in (
            (grpc.StatusCode.FAILED_PRECONDITION, "NOT_PRIMARY"),
            (grpc.StatusCode.UNAVAILABLE, "LEADERSHIP_LOST"),
        )
        assert info.metadata.get("primary", "") == ""
        status = leader.status()
        assert status is not None
        assert status.cluster.role == rpb.CLUSTER_ROLE_FENCED
        assert status.state == rpb.REPLICATION_STATE_FENCED
        leader.etcd_link.blackhole(False)
        leader.etcd_link.cut()
        wait_for("the leader is back", lambda: leader.health() == SERVING, 4)
        assert append(leader, "s", "after")[1] == epoch
        assert group.leader() == (leader, epoch)


def test_a_deposed_leader_rejoins_by_itself_and_reports_what_it_discarded(
    tmp_path: Path,
) -> None:
    """With --ack local, a leader acknowledges appends that its follower never gets (the link
    to it is black-holed), then freezes; the follower takes over. Woken, the old leader
    restarts in place (the same PID), rejoins the new leader and reports every discarded
    append: in its log, a report file and its status; then it replicates the new leader."""
    with Group(tmp_path, members=2, args=LOCAL, fronts=True) as group:
        old, epoch = group.wait_healthy()
        [new] = [m for m in group.members if m is not old]
        assert old.front is not None
        append(old, "kept", "shipped", request_id="k0")
        wait_for("the follower holds it", lambda: position(new) == 1, 10)
        old.front.blackhole(True)  # the follower dials the advertised address: cut off
        old.front.cut()
        lost = [f"lost-{n}" for n in range(3)]
        for n, rid in enumerate(lost):
            assert append(old, "gone", f"unshipped {n}", request_id=rid)[0] == n
        assert position(old) == 4
        pid = old.process.pid if old.process else 0
        old.freeze()
        _, newer = group.wait_new_leader(epoch)
        assert group.leader() == (new, newer)
        wait_for("the new leader serves", lambda: new.health() == SERVING, 10)
        assert position(new) == 1
        assert append(new, "kept", "after the failover")[0] == 1
        old.front.blackhole(False)
        old.thaw()
        wait_for("the old leader rejoined and follows", lambda: old.health() == SERVING, 30)
        assert old.process is not None
        assert old.process.pid == pid
        entries = log_entries(old)
        discarded = [
            e
            for e in entries
            if e.get("message") == "rejoin discarded a change the leader never had"
        ]
        assert sorted(rid for e in discarded for rid in e["request_ids"]) == lost
        assert any(e.get("message") == "restarting in place" for e in entries)
        [report] = old.data.glob("rejoin-report-*.json")
        content = json.loads(report.read_text())
        assert sorted(r for d in content["discarded"] for r in d["request_ids"]) == lost
        status = old.status()
        assert status is not None
        assert status.cluster.role == rpb.CLUSTER_ROLE_FOLLOWER
        assert "discarded 3 records" in status.detail
        with Client(old.direct) as reader:
            kept = [e.data["content"] for e in reader.since("kept")]
            assert kept == ["shipped", "after the failover"]
            assert list(reader.since("gone")) == []


def test_after_three_faults_only_the_synchronous_member_takes_over(tmp_path: Path) -> None:
    """--ack replica --sync-replicas 1: follower A frozen, follower B cut off from etcd (it
    goes on replicating), four appends acknowledged once the member records' TTL has passed
    (B holds them), the leader killed, A thawed. A is behind, the only member etcd lists, and
    not in the synchronous set: the group stays without a leader and A says it waits for B.
    Once B reaches etcd again, B leads with every acknowledged append, A follows it, nothing
    is discarded anywhere, and the new leader acknowledges writes again."""
    args = [*LOCAL, "--ack", "replica", "--sync-replicas", "1"]
    with Group(tmp_path, members=3, args=args) as group:
        leader, epoch = group.wait_healthy()
        a, b = (m for m in group.members if m is not leader)
        append(leader, "s", "before", request_id="r0")
        start = position(leader)
        wait_for(
            "every member holds it",
            lambda: all(position(m) == start for m in group.members),
            10,
        )
        a.freeze()
        b.etcd_link.blackhole(True)
        b.etcd_link.cut()
        time.sleep(2 * 2 + 1)  # past --lease-ttl 2: etcd lists neither A nor B
        acknowledged = [f"r{n}" for n in range(1, 5)]
        for n, rid in enumerate(acknowledged, 1):
            assert append(leader, "s", f"acknowledged {n}", request_id=rid)[0] == n
        wait_for("B holds them", lambda: position(b) == start + 4, 10)
        leader.kill()
        a.thaw()
        end = time.monotonic() + 3 * 2
        while time.monotonic() < end:
            found = group.leader()
            assert found is None or found == (leader, epoch), found
            time.sleep(0.1)
        status = a.status()
        assert status is not None
        assert status.cluster.role == rpb.CLUSTER_ROLE_FENCED
        assert f"waiting for a synchronous member: {b.address}" in status.cluster.reason
        assert list(status.cluster.blocked_by) == [b.address]
        b.etcd_link.blackhole(False)
        b.etcd_link.cut()
        new, _ = group.wait_new_leader(epoch)
        assert new is b
        wait_for("B serves as the leader", lambda: b.health() == SERVING, 10)
        wait_for("A follows B and holds it all", lambda: position(a) >= start + 4, 20)
        for member in (a, b):
            with Client(member.direct) as reader:
                texts = [e.data["content"] for e in reader.since("s")]
            assert texts == ["before"] + [f"acknowledged {n}" for n in range(1, 5)]
            assert not list(member.data.glob("rejoin-report-*.json"))
            assert "rejoin discarded" not in member.log()
        # A joins B's synchronous set, so B acknowledges again (K=1, the old leader is gone).
        assert append(b, "s", "after the failover", request_id="r5")[0] == 5


def test_the_leader_names_its_synchronous_set_in_its_status_and_metrics(tmp_path: Path) -> None:
    """--ack replica --sync-replicas 1: once the leader has had etcd confirm its synchronous
    set, GetReplicationStatus lists the set's members (followers, never itself) and /metrics
    counts them; a follower lists none."""
    args = [*LOCAL, "--ack", "replica", "--sync-replicas", "1"]
    with Group(tmp_path, members=3, args=args, metrics=True) as group:
        leader, _ = group.wait_healthy()
        followers = {m.address for m in group.members if m is not leader}
        append(leader, "s", "one", request_id="r0")

        def named() -> list[str]:
            status = leader.status()
            return [] if status is None else list(status.sync_set)

        wait_for("the leader's status names its synchronous set", lambda: bool(named()), 20)
        members = named()
        assert members == sorted(members)
        assert set(members) <= followers, (members, followers)
        with urllib.request.urlopen(f"http://{leader.metrics}/metrics", timeout=5) as reply:
            scraped = reply.read().decode()
        found = re.search(r"^sessionlog_sync_set_members (\S+)$", scraped, re.MULTILINE)
        assert found, "no sessionlog_sync_set_members in the leader's /metrics"
        assert float(found.group(1)) >= 1
        follower = next(m for m in group.members if m is not leader)
        status = follower.status()
        assert status is not None
        assert list(status.sync_set) == []


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def position(member: Member) -> int:
    status = member.status()
    return -1 if status is None else status.position


@pytest.mark.timeout(120)
def test_dev_cluster_starts_a_group_and_stops_it_on_ctrl_c(tmp_path: Path) -> None:
    """`sessionlog dev cluster` prints the group once a member leads, the group takes a write,
    and SIGINT stops every process it started."""
    # Members on port..port+2, etcd's client and peer on etcd_port and the one after it.
    port, etcd_port = free_ports_in_a_row(3), free_ports_in_a_row(2)
    argv = [
        sys.executable, "-m", "sessionlog.cli", "dev", "cluster",
        "--dir", str(tmp_path / "dev"), "--port", str(port), "--etcd-port", str(etcd_port),
        "--lease-ttl", "2",
    ]  # fmt: skip
    out = tmp_path / "dev.out"
    with out.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=clean_env(workers=False)
        )
    try:
        wait_for("the group is printed", lambda: "leader)" in out.read_text(), 60)
        text = out.read_text()
        listed = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        children = [int(pid) for pid in listed]
        assert len(children) == 4, text  # etcd and three members
        assert all(f"pid {pid}" in text for pid in children), text
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        with Client(addresses) as client:
            client.append("demo", [event("user_message", {"content": "hi"})])
        # The banner's failover: kill -9 the leader; another member leads, the killed one
        # comes back (a new PID) and the group goes on.
        [leader_pid] = re.findall(r"kill -9 (\d+)", text)
        os.kill(int(leader_pid), signal.SIGKILL)
        wait_for("the killed member restarts", lambda: "restarted: pid" in out.read_text(), 30)
        [restarted] = re.findall(r"restarted: pid (\d+)", out.read_text())
        children.append(int(restarted))
        with Client(addresses, retry=Retry(give_up_after=30.0)) as client:
            reply = client.append("demo", [event("user_message", {"content": "after"})])
            assert reply.events[0].seq == 1
        assert process.poll() is None, out.read_text()
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        for child in children:
            wait_for(f"pid {child} gone", functools.partial(gone, child), 10)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
