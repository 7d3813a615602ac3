"""`sessionlog cluster slot | map` against a real etcd: put, get, epochs that must grow."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sessionlog.cluster.etcd import Endpoints
from sessionlog.shard import ShardMap
from sessionlog.shard.shardmap import SHARDS_KEY
from tests.cluster._etcd import EtcdProcess
from tests.e2e._proc import run_cli

MAP = """epoch = {epoch}

[groups.g1]
members = ["127.0.0.1:50051"]
slots = ["0-511"]

[groups.g2]
members = ["127.0.0.1:50061"]
slots = ["512-1023"]
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["cluster", *args], Path.cwd(), timeout=60)


def test_slot_prints_each_ids_slot_and_owner(tmp_path: Path) -> None:
    """`cluster slot` gives crc32 mod 1024 and, with a map, the owner and its primary."""
    path = tmp_path / "shards.toml"
    path.write_text(MAP.format(epoch=1))
    done = _cli("slot", "abc", "--shard-map", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "abc\t450\tg1\t127.0.0.1:50051\n"


def test_check_summarizes_a_good_map_and_names_a_bad_one(tmp_path: Path) -> None:
    """`map check` exits 0 with the groups, or 1 with the problem."""
    good = tmp_path / "good.toml"
    good.write_text(MAP.format(epoch=2))
    done = _cli("map", "check", str(good))
    assert done.returncode == 0, done.stderr
    assert "epoch 2, 2 group(s)" in done.stdout
    assert "g2: 512 slots (512-1023)" in done.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(MAP.format(epoch=2).replace('"512-1023"', '"512-1000"'))
    done = _cli("map", "check", str(bad))
    assert done.returncode == 1
    assert "slots 1001-1023 are owned by no group" in done.stderr


def test_put_and_get_keep_the_map_in_etcd_and_refuse_an_old_epoch(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """A put is read back whole; a second put must raise the epoch."""
    url = f"etcd://127.0.0.1:{etcd.port}"
    done = _cli("map", "get", "--cluster", url)
    assert done.returncode == 1
    assert "holds no shard map" in done.stderr

    first = tmp_path / "one.toml"
    first.write_text(MAP.format(epoch=5))
    done = _cli("map", "put", str(first), "--cluster", url)
    assert done.returncode == 0, done.stderr
    done = _cli("map", "get", "--cluster", url)
    assert done.returncode == 0, done.stderr
    assert ShardMap.from_toml(done.stdout) == ShardMap.load(str(first))

    same = _cli("map", "put", str(first), "--cluster", url)
    assert same.returncode == 1
    assert "epoch 5, not above the stored map's 5" in same.stderr

    newer = tmp_path / "two.toml"
    newer.write_text(MAP.format(epoch=6).replace('"0-511"', '"0-99"').replace("512-", "100-"))
    assert _cli("map", "put", str(newer), "--cluster", url).returncode == 0
    done = _cli("map", "get", "--cluster", url, "--json")
    assert ShardMap.from_json(done.stdout).group("g2").range_text() == ["100-1023"]


def test_put_says_when_etcd_cannot_be_reached(tmp_path: Path) -> None:
    """No etcd at the address: exit 1 and a line naming etcd, not a traceback."""
    path = tmp_path / "shards.toml"
    path.write_text(MAP.format(epoch=1))
    done = _cli("map", "put", str(path), "--cluster", "etcd://127.0.0.1:9")
    assert done.returncode == 1
    assert "etcd:" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    """An id that is not UTF-8 (it has no slot), a --cluster that is no etcd URL: exit 2 with
    a sentence, not a traceback (and not 1, which says the map or etcd refused)."""
    done = _cli("slot", "fine", "\udcff")  # the byte 0xff on the command line
    assert done.returncode == 2, done.stderr
    assert "not valid UTF-8" in done.stderr
    assert "Traceback" not in done.stderr
    path = tmp_path / "shards.toml"
    path.write_text(MAP.format(epoch=1))
    for args in (["get"], ["put", str(path)]):
        done = _cli("map", *args, "--cluster", "nonsense")
        assert done.returncode == 2, done.stderr
        assert "--cluster" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_damaged_key_is_refused_by_get_and_replaced_by_put(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """etcd's key nested past any parser's limit: `map get` exits 1 naming it, `map put`
    replaces it with a valid map."""
    endpoints = Endpoints((etcd.endpoint,), 2.0)
    try:
        endpoints.put(SHARDS_KEY, b"[" * 100_000, 0)
    finally:
        endpoints.close()
    cluster = f"etcd://{etcd.endpoint}"
    done = _cli("map", "get", "--cluster", cluster)
    assert done.returncode == 1, done.stderr
    assert "is not valid" in done.stderr
    assert "Traceback" not in done.stderr
    path = tmp_path / "shards.toml"
    path.write_text(MAP.format(epoch=1))
    done = _cli("map", "put", str(path), "--cluster", cluster)
    assert done.returncode == 0, done.stderr
    assert "replacing it" in done.stderr
    assert _cli("map", "get", "--cluster", cluster).returncode == 0


def test_move_slot_refuses_a_bad_slot_or_wait_as_a_usage_error() -> None:
    """A slot outside 0-1023, or a --wait of 0 or less (which would freeze the slot and give up
    at once), is refused by the argument parser (exit 2) before anything is read or written."""
    for args, said in (
        (["1024"], "slot 1024 is outside 0-1023"),
        (["-1"], "slot -1 is outside 0-1023"),
        (["x"], "'x' is not a slot number"),
        (["5", "--wait", "0"], "--wait must be above 0 seconds, not 0"),
        (["5", "--wait", "-5"], "--wait must be above 0 seconds, not -5"),
    ):
        done = _cli("move-slot", *args, "--to", "g1", "--cluster", "etcd://127.0.0.1:9")
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert said in done.stderr, (args, done.stderr)
