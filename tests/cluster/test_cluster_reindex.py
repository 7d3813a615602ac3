"""A `--cluster` member indexes what an older server wrote once it is elected, as a static
primary does at start: the sessions of a folder without index entries list by update time."""

from __future__ import annotations

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
