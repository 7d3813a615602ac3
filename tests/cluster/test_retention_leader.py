"""Retention in an elected group: the leader's sweeper deletes an expired session, the
followers erase it from their DELETE record, and every member's erasure audit holds that one
delete (a follower never sweeps on its own)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.cluster._group import Group
from tests.e2e._helpers import user
from tests.e2e._proc import run_cli


def exists(address: str, session_id: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.GetSession(pb.GetSessionRequest(session_id=session_id), timeout=5)
        return bool(reply.session.exists)


def test_the_leader_sweeps_and_followers_follow(tmp_path: Path) -> None:
    """ttl 1 s on the leader: gone on every member within seconds, one audit row each."""
    with Group(tmp_path, members=3, args=["--retention-sweep-interval", "0.2"]) as group:
        leader, _ = group.wait_healthy()
        ttl = Duration()
        ttl.FromSeconds(1)
        with grpc.insecure_channel(leader.address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for session_id, made in (("cl-gone", ttl), ("cl-kept", None)):
                request = pb.CreateSessionRequest(session_id=session_id, events=[user("x")])
                if made is not None:
                    request.ttl.CopyFrom(made)
                stub.CreateSession(request, timeout=10)
        deadline = time.monotonic() + 30
        while any(exists(m.address, "cl-gone") for m in group.members):
            assert time.monotonic() < deadline, "the expired session stayed on some member"
            time.sleep(0.1)
        assert all(exists(m.address, "cl-kept") for m in group.members)
        for member in group.members:
            done = run_cli(["admin", "erasures", "--json", "--data", str(member.data)], tmp_path)
            assert done.returncode == 0, done.stderr
            rows = [json.loads(line) for line in done.stdout.splitlines()]
            assert [(r["session_id"], r["reason"]) for r in rows] == [("cl-gone", "expired")]
