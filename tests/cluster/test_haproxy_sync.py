"""`sessionlog cluster haproxy-sync` against a real etcd and a real HAProxy in front of two
static groups (one unsharded server each: a group is just its server here, so a session lands
wherever HAProxy sends it).

A map is put in etcd (`cluster map put`), the sync runs in a thread (as `sessionlog dev cluster`
runs it as a process); a second map moves one slot: HAProxy's `show map` names the new owner,
DIR/slots.map is written again, and a session of that slot written through HAProxy lands in
the new group's server. A map with another group set stops the sync with exit 1.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog import cli
from sessionlog.shard import haproxy, hasync
from sessionlog.shard.shardmap import Group, ShardMap
from sessionlog.shard.slots import slot_of
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.cluster._etcd import EtcdProcess
from tests.cluster.test_haproxy import _append, _eventually, _haproxy, _http, _in, _stop
from tests.e2e._proc import free_port
from tests.e2e._replication_cluster import Cluster, Node


def _put(shard_map: ShardMap, etcd: EtcdProcess, tmp_path: Path) -> None:
    path = tmp_path / f"map-{shard_map.epoch}.toml"
    path.write_text(shard_map.to_toml(), encoding="utf-8")
    assert (
        cli.main(["cluster", "map", "put", str(path), "--cluster", f"etcd://{etcd.endpoint}"]) == 0
    )


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[ShardMap, dict[str, Node], str, Path]]:
    (tmp_path / "servers").mkdir()
    with Cluster(tmp_path / "servers") as cluster:
        nodes = {
            name: cluster.primary(name, args=["--http-listen", f"127.0.0.1:{free_port()}"])
            for name in ("ga", "gb")
        }
        shard_map = ShardMap(
            1,
            tuple(
                Group(
                    name, (n.address,), ((0, 511),) if name == "ga" else ((512, 1023),), (_http(n),)
                )
                for name, n in nodes.items()
            ),
        )
        address = f"127.0.0.1:{free_port()}"
        out = tmp_path / "proxy"
        config, _ = haproxy.write(shard_map, out, address, 2.0, 0.3)
        process = _haproxy(config, tmp_path / "haproxy.log")
        try:
            hasync.wait_socket(str(out / haproxy.SOCKET_FILE), 10.0)
            yield shard_map, nodes, address, out
        finally:
            _stop(process)


def _sync(
    etcd: EtcdProcess, out: Path, stop: threading.Event
) -> tuple[threading.Thread, list[int]]:
    args = argparse.Namespace(
        cluster=f"etcd://{etcd.endpoint}", out=str(out), socket=None, once=False
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(hasync.run(args, stop)), daemon=True)
    thread.start()
    return thread, codes


def _owner(out: Path, slot: int) -> str:
    return hasync.show_map(str(out / haproxy.SOCKET_FILE))[slot]


def test_haproxy_follows_a_slot_moved_in_etcd(
    etcd: EtcdProcess, front: tuple[ShardMap, dict[str, Node], str, Path], tmp_path: Path
) -> None:
    shard_map, nodes, address, out = front
    session_id = next(
        f"moved-{i}" for i in range(1000) if shard_map.owner(f"moved-{i}").name == "ga"
    )
    slot = slot_of(session_id)
    _put(shard_map, etcd, tmp_path)
    stop = threading.Event()
    thread, codes = _sync(etcd, out, stop)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            _eventually(lambda: _append(stub, session_id, "before"))
            assert (_in(nodes["ga"], session_id), _in(nodes["gb"], session_id)) == (1, 0)
            _put(shard_map.with_slots([slot], "gb"), etcd, tmp_path)
            _eventually(lambda: _owner(out, slot) == "gb")
            assert (
                _owner(out, slot - 1 if slot else 1)
                == shard_map.owner_of_slot(slot - 1 if slot else 1).name
            )
            assert f"{slot} gb\n" in (out / haproxy.MAP_FILE).read_text()
            _append(stub, session_id, "after")
            assert (_in(nodes["ga"], session_id), _in(nodes["gb"], session_id)) == (1, 1)
    finally:
        stop.set()
        thread.join(10)
    assert codes == [0]


def test_a_new_group_stops_the_sync_with_the_reload_advice(
    etcd: EtcdProcess,
    front: tuple[ShardMap, dict[str, Node], str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shard_map, _, _, out = front
    extra = Group("gc", ("127.0.0.1:9",), (), ("127.0.0.1:10",))
    grown = ShardMap(2, (*shard_map.groups, extra))
    _put(grown, etcd, tmp_path)
    args = argparse.Namespace(
        cluster=f"etcd://{etcd.endpoint}", out=str(out), socket=None, once=True
    )
    assert hasync.run(args) == 1
    assert "reload HAProxy" in capsys.readouterr().err
    assert _owner(out, 0) == "ga"  # nothing applied
