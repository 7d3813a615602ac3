"""--shard-map etcd: a cluster member takes its shard map from etcd and follows newer epochs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog.cluster.etcd import Endpoints
from sessionlog.shard import ShardMap, slot_of
from sessionlog.shard.shardmap import SHARDS_KEY
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.cluster._group import GROUP, Group
from tests.e2e._helpers import append, check, failure, user

T = TypeVar("T")
APPLIED_SECONDS = 8.0
"""A put map is in force within a poll (about 1 s); this leaves room for a loaded machine."""
ELSEWHERE = "127.0.0.1:1"
"""The other group's member: never dialled, only named."""


def eventually(attempt: Callable[[], T], seconds: float = APPLIED_SECONDS) -> T:
    """``attempt()``'s first result without an AssertionError or RpcError, within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return attempt()
        except (AssertionError, grpc.RpcError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@pytest.mark.serial  # a stream ends within 8 s
def test_a_member_serves_the_map_in_etcd_and_follows_newer_epochs(tmp_path: Path) -> None:
    """No map in etcd: SHARD_MAP_UNAVAILABLE. After a put: serving its slots. A higher epoch
    moving a session's slot away ends its follow stream with WRONG_GROUP; a lower one is
    ignored."""
    with Group(tmp_path, members=1, args=["--shard-map", "etcd"]) as group:
        member = group.members[0]
        stub = pb_grpc.SessionLogServiceStub(  # type: ignore[no-untyped-call]
            grpc.insecure_channel(member.direct)
        )
        first = ShardMap.even_split({GROUP: [member.address], "other": [ELSEWHERE]}, epoch=2)
        session = next(f"s{n}" for n in range(100) if first.owner(f"s{n}").name == GROUP)

        error = failure(append, stub, session, user())
        check(error, grpc.StatusCode.UNAVAILABLE, "SHARD_MAP_UNAVAILABLE")

        etcd = Endpoints((group.etcd.endpoint,), 1.0)
        try:
            etcd.put(SHARDS_KEY, first.to_json().encode(), 0)
            eventually(lambda: append(stub, session, user("first")))
            reply = stub.GetShardMap(pb.GetShardMapRequest(), timeout=5)
            assert (reply.shard_map.epoch, reply.group) == (2, GROUP)
            primaries = {g.name: g.primary for g in reply.shard_map.groups}
            assert primaries == {GROUP: member.address, "other": ""}  # "other" has no leader

            stream = stub.Since(
                pb.SinceRequest(
                    session_id=session, follow=True, heartbeat_interval=Duration(nanos=200_000_000)
                ),
                timeout=APPLIED_SECONDS + 5,
            )
            assert next(stream).events  # the stored event; the stream is open
            moved = first.with_slots([slot_of(session)], to="other")
            etcd.put(SHARDS_KEY, moved.to_json().encode(), 0)
            started = time.monotonic()
            ended = failure(lambda: list(stream))
            assert time.monotonic() - started < APPLIED_SECONDS
            check(ended, grpc.StatusCode.FAILED_PRECONDITION, "WRONG_GROUP", group="other")
            check(failure(append, stub, session, user()), ended.code(), "WRONG_GROUP", map_epoch=3)

            etcd.put(SHARDS_KEY, first.to_json().encode(), 0)  # epoch 2 again: older, ignored
            time.sleep(2.5)  # two polls
            check(failure(append, stub, session, user()), ended.code(), "WRONG_GROUP", map_epoch=3)
            assert stub.GetShardMap(pb.GetShardMapRequest(), timeout=5).shard_map.epoch == 3
        finally:
            etcd.close()
