"""`sessionlog cluster haproxy`: the HAProxy configuration and slot map written from a shard map.

The routing itself (a real HAProxy in front of real servers) is tests/cluster/test_haproxy.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sessionlog import cli
from sessionlog.service import auth
from sessionlog.shard import haproxy
from sessionlog.shard.shardmap import ShardMap, ShardMapError
from sessionlog.shard.slots import SLOTS
from sessionlog.v1 import session_log_service_pb2 as pb

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLE = DEPLOY / "shards.example.toml"
DEPLOY_SOCKET = "/run/haproxy/sessionlog.sock"


def _haproxy() -> str:
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if found is None:
        pytest.fail("haproxy is not installed: run `make haproxy-tools` (apt-get install haproxy)")
    return found


def test_the_deploy_files_are_what_the_command_writes(tmp_path: Path) -> None:
    argv = ["cluster", "haproxy", "--shard-map", str(EXAMPLE), "--out", str(tmp_path)]
    code = cli.main([*argv, "--socket", DEPLOY_SOCKET])
    assert code == 0
    for name in (haproxy.CONFIG_FILE, haproxy.MAP_FILE):
        assert (tmp_path / name).read_bytes() == (DEPLOY / name).read_bytes(), (
            f"deploy/{name} is stale: sessionlog cluster haproxy --shard-map "
            f"deploy/shards.example.toml --out deploy --socket {DEPLOY_SOCKET}"
        )


def test_haproxy_accepts_the_deploy_config() -> None:
    checked = subprocess.run(
        [_haproxy(), "-c", "-f", str(DEPLOY / haproxy.CONFIG_FILE)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr


def test_the_map_names_each_slots_owner() -> None:
    shard_map = ShardMap.load(str(EXAMPLE))
    lines = haproxy.render_map(shard_map).splitlines()
    assert len(lines) == SLOTS
    for slot, line in enumerate(lines):
        assert line == f"{slot} {shard_map.owner_of_slot(slot).name}"


def test_the_config_routes_by_slot_reads_and_writes_apart() -> None:
    shard_map = ShardMap.load(str(EXAMPLE))
    config = haproxy.render_config(shard_map, "0.0.0.0:443", timeout=45, check=0.25)
    assert "    bind 0.0.0.0:443 proto h2\n" in config
    assert "req.hdr(x-session-id),url_dec,crc32,mod(1024),map_int(slots.map)" in config
    assert "str(g1) unless" in config  # no header: the first group
    for line in ("timeout client 45s", "timeout server 45s", "timeout tunnel 45s"):
        assert f"    {line}\n" in config
    assert "inter 250ms" in config
    for group in shard_map.groups:
        for kind, check in (("write", "/primary"), ("read", "/healthz")):
            start = config.index(f"\nbackend {group.name}-{kind}\n") + 1
            body = config[start:].split("\n\n")[0]
            assert f"option httpchk GET {check}" in body
            for number, (member, http) in enumerate(zip(group.members, group.http, strict=True), 1):
                host, port = http.rsplit(":", 1)
                assert (
                    f"server {group.name}-{number} {member} proto h2 check check-proto h1 "
                    f"addr {host} port {port}" in body
                )


def test_read_methods_are_the_services_reads() -> None:
    """Every SessionLogService RPC is routed: the ones auth counts as reads to any member,
    every other to the primary (a new RPC lands in one of the two by its permission)."""
    methods = pb.DESCRIPTOR.services_by_name["SessionLogService"].methods_by_name
    for name in methods:
        path = haproxy.SERVICE + name
        needs = auth._NEEDS.get(path, auth.READ if name == "GetShardMap" else None)
        assert needs is not None, name
        assert (name in haproxy.READ_METHODS) == (needs == auth.READ), name


def test_a_group_without_http_addresses_is_refused(tmp_path: Path) -> None:
    bare = ShardMap.even_split({"a": ["127.0.0.1:1"], "b": ["127.0.0.1:2"]}, http={"a": ["h:1"]})
    with pytest.raises(ShardMapError, match="group 'b' has no `http` addresses"):
        haproxy.render_config(bare)
    path = tmp_path / "map.toml"
    path.write_text(bare.to_toml())
    out = tmp_path / "out"
    code = cli.main(["cluster", "haproxy", "--shard-map", str(path), "--out", str(out)])
    assert code == 1  # a refusal, as `map check` refuses a bad map; 2 is a usage error
    assert not out.exists()


def test_durations_as_haproxy_writes_them() -> None:
    assert [haproxy._seconds(s) for s in (60, 2, 0.3, 1.5)] == ["60s", "2s", "300ms", "1500ms"]


def test_ipv6_members_and_dotted_group_names_make_a_config_haproxy_accepts(
    tmp_path: Path,
) -> None:
    """An IPv6 member's health check keeps its brackets (``addr [::1]``: HAProxy refuses a bare
    ``::1`` there), and a group name with '.', '_' and '-' is a valid backend name."""
    shard_map = ShardMap.even_split(
        {"g.1_a-x": ["[::1]:50051", "[::1]:50052"], "g2": ["localhost:50061"]},
        http={"g.1_a-x": ["[::1]:8081", "[::1]:8082"], "g2": ["localhost:8091"]},
    )
    config, _ = haproxy.write(shard_map, tmp_path, bind="[::1]:50050")
    assert "addr [::1] port 8081" in config.read_text()
    checked = subprocess.run(
        [_haproxy(), "-c", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("bind", ["nonsense", "127.0.0.1:1\n    stats enable", "h:99999", ""])
def test_a_bad_bind_address_is_a_usage_error(tmp_path: Path, bind: str) -> None:
    """--bind is HOST:PORT (or :PORT); anything else, a newline above all (it would add a line
    to haproxy.cfg), is refused with exit 2 and nothing written."""
    path = tmp_path / "map.toml"
    path.write_text(ShardMap.load(str(EXAMPLE)).to_toml())
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(
            ["cluster", "haproxy", "--shard-map", str(path), "--out", str(out), "--bind", bind]
        )
    assert exited.value.code == 2
    assert not out.exists()
    with pytest.raises(ShardMapError, match="--bind"):
        haproxy.render_config(ShardMap.load(str(EXAMPLE)), bind=bind)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "0.0001", "1e300"])
@pytest.mark.parametrize("option", ["--timeout", "--check-interval"])
def test_a_duration_haproxy_cannot_write_is_a_usage_error(
    tmp_path: Path, option: str, value: str
) -> None:
    """Not a traceback (nan, inf), not ``0s`` (which HAProxy reads as no timeout), not a number
    past HAProxy's own limit: exit 2, nothing written."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(
            ["cluster", "haproxy", "--shard-map", str(EXAMPLE), "--out", str(out), option, value]
        )
    assert exited.value.code == 2
    assert not out.exists()
