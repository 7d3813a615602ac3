"""Retention on sharded servers: each group's sweeper deletes the expired sessions of the slots
it owns, and leaves an expired copy of another group's session (a slot move's leftover) alone:
that session is the owner's to expire."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog.shard import ShardMap
from sessionlog.shard.ownership import MOVE_COPY, MOVE_HEADER
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import get, user
from tests.e2e._proc import ServerProcess, free_port, run_cli


def past() -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(time.time_ns() - 10**9)
    return stamp


@pytest.fixture
def stubs(tmp_path: Path) -> Iterator[tuple[ShardMap, dict[str, pb_grpc.SessionLogServiceStub]]]:
    g1, g2 = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    shard_map = ShardMap.even_split({"g1": [g1], "g2": [g2]}, epoch=3)
    map_path = tmp_path / "shards.toml"
    map_path.write_text(shard_map.to_toml())
    common = ["--shard-map", str(map_path), "--retention-sweep-interval", "0.2"]
    one = ServerProcess(["--data", str(tmp_path / "d1"), "--listen", g1, *common], tmp_path)
    two = ServerProcess(
        ["--data", str(tmp_path / "d2"), "--listen", g2, "--group", "g2", *common], tmp_path
    )
    with one, two:
        one.wait_serving(g1)
        two.wait_serving(g2)
        with grpc.insecure_channel(g1) as first, grpc.insecure_channel(g2) as second:
            yield (
                shard_map,
                {
                    "g1": pb_grpc.SessionLogServiceStub(first),  # type: ignore[no-untyped-call]
                    "g2": pb_grpc.SessionLogServiceStub(second),  # type: ignore[no-untyped-call]
                },
            )


def test_each_group_sweeps_only_what_it_owns(
    stubs: tuple[ShardMap, dict[str, pb_grpc.SessionLogServiceStub]], tmp_path: Path
) -> None:
    """An expired session of each group goes from its owner; g1's expired session copied into
    g2 (as a move copies) stays on g2."""
    shard_map, by_group = stubs
    owned = {
        group: next(f"s{n}" for n in range(200) if shard_map.owner(f"s{n}").name == group)
        for group in by_group
    }
    for group, session_id in owned.items():
        request = pb.ImportSessionRequest(
            session_id=session_id,
            events=[user("x")],
            record=pb.Session(session_id=session_id, expire_time=past()),
        )
        by_group[group].ImportSession(request, timeout=10)
    leftover = next(f"c{n}" for n in range(200) if shard_map.owner(f"c{n}").name == "g1")
    copy = pb.ImportSessionRequest(
        session_id=leftover,
        events=[user("copy")],
        record=pb.Session(session_id=leftover, expire_time=past()),
    )
    by_group["g2"].ImportSession(copy, metadata=((MOVE_HEADER, MOVE_COPY),), timeout=10)
    deadline = time.monotonic() + 20
    while any(get(by_group[g], s).exists for g, s in owned.items()):
        assert time.monotonic() < deadline, "an owner did not sweep its expired session"
        time.sleep(0.1)
    time.sleep(1.0)  # several more sweeps
    audits = {}
    for group in by_group:
        data = tmp_path / ("d1" if group == "g1" else "d2")
        done = run_cli(["admin", "erasures", "--json", "--data", str(data)], tmp_path)
        assert done.returncode == 0, done.stderr
        audits[group] = [json.loads(line)["session_id"] for line in done.stdout.splitlines()]
    assert audits == {"g1": [owned["g1"]], "g2": [owned["g2"]]}  # the copy was not swept
