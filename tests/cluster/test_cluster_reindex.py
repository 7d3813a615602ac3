"""A `--cluster` member indexes what an older server wrote once it is elected, as a static
primary does at start: the sessions of a folder without index entries list by update time."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from sessionlog.storage.store import Store, prepare_append
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.cluster._group import Group, Member
from tests.e2e._replication_cluster import wait_for

LOCAL = ["--lease-ttl", "2", "--replica-timeout", "1", "--log-level", "info"]
NAMES = [f"old{i:03d}" for i in range(40)]


def older_servers_folder(path: Path) -> None:
    """Sessions and a fork, then the index entries dropped: what a server older than the
    indexes left."""
    store = Store(path)
    try:
        tool = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
        for future in [store.submit_append(prepare_append(n, [tool])) for n in NAMES]:
            future.result()
        store.submit_fork(NAMES[0], None, "old-fork").result()
        with store.env.begin(write=True) as txn:
            txn.drop(store.tables.recent, delete=False)
            txn.drop(store.tables.children, delete=False)
        assert store.unindexed()
    finally:
        store.close()


def listed_by_update(member: Member) -> list[str]:
    with grpc.insecure_channel(member.direct) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ListSessionsRequest(order_by="update_time desc", page_size=100)
        reply = stub.ListSessions(request, timeout=5)
    return [s.session_id for s in reply.sessions]


def test_an_elected_member_indexes_an_older_servers_sessions(tmp_path: Path) -> None:
    """The leader of a one-member group started on an older server's folder lists every
    session by update time (the fork first), and says so in its log."""
    older_servers_folder(tmp_path / "m1")
    with Group(tmp_path, members=1, args=LOCAL) as group:
        leader, _ = group.wait_healthy()
        wait_for("the sessions are indexed", lambda: len(listed_by_update(leader)) == 41, 20)
        listed = listed_by_update(leader)
        assert sorted(listed) == sorted([*NAMES, "old-fork"])
        assert listed[0] == "old-fork"
        assert "indexed the sessions of an older server" in leader.log()


def _write_records(address: str, stop: threading.Event, done: list[int]) -> None:
    """Appends and label updates spread over 30 sessions until ``stop`` (or the server dies):
    every write moves the session's ``recent`` key, every update its ``labels`` keys."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        tool = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
        n = 0
        while not stop.is_set():
            session_id = f"crash{n % 30:02d}"
            try:
                stub.Append(pb.AppendRequest(session_id=session_id, events=[tool]), timeout=2)
                stub.UpdateSession(
                    pb.UpdateSessionRequest(
                        session=pb.Session(session_id=session_id, labels={"team": f"t{n % 3}"}),
                        update_mask={"paths": ["labels.team"]},
                    ),
                    timeout=2,
                )
            except grpc.RpcError:
                return  # killed
            n += 1
            done[0] = n


def _listing(member: Member, **fields: object) -> list[pb.Session]:
    with grpc.insecure_channel(member.direct) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ListSessionsRequest(page_size=1000, **fields)  # type: ignore[arg-type]
        return list(stub.ListSessions(request, timeout=5).sessions)


def test_a_killed_members_listing_matches_its_records_after_the_restart(tmp_path: Path) -> None:
    """kill -9 during appends and label updates, then a restart: ListSessions by update time
    and by label (the ``recent`` and ``labels`` indexes) equals a full scan by id (the session
    records themselves)."""
    with Group(tmp_path, members=1, args=LOCAL) as group:
        leader, _ = group.wait_healthy()
        stop, done = threading.Event(), [0]
        writer = threading.Thread(target=_write_records, args=(leader.direct, stop, done))
        writer.start()
        wait_for("some writes", lambda: done[0] >= 60, 30)
        leader.kill()
        stop.set()
        writer.join(10)
        leader.start()
        leader, _ = group.wait_healthy()
        scan = _listing(leader, order_by="session_id")
        assert len(scan) == 30
        by_time = sorted(scan, key=lambda s: (-s.update_time.ToNanoseconds(), s.session_id))
        listed = _listing(leader, order_by="update_time desc")
        assert [s.session_id for s in listed] == [s.session_id for s in by_time]
        for team in ("t0", "t1", "t2"):
            wanted = sorted(s.session_id for s in scan if s.labels["team"] == team)
            filtered = _listing(leader, filter=f'labels.team = "{team}"')
            assert sorted(s.session_id for s in filtered) == wanted
        assert "indexed the sessions of an older server" not in leader.log()
