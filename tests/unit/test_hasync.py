"""`cluster haproxy-sync`'s decisions, without HAProxy: which slots to set, which maps to refuse,
the backends read from haproxy.cfg and the socket line in it (tests/cluster/test_haproxy_sync.py
runs it against a real HAProxy and etcd)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionlog.shard import haproxy, hasync
from sessionlog.shard.shardmap import ShardMap, ShardMapError
from sessionlog.shard.slots import SLOTS

SPLIT = ShardMap.even_split(
    {"ga": ["127.0.0.1:1"], "gb": ["127.0.0.1:2"]},
    http={"ga": ["127.0.0.1:3"], "gb": ["127.0.0.1:4"]},
)


def test_only_the_moved_slots_change() -> None:
    moved = SPLIT.with_slots([0, 7], "gb")
    assert moved.epoch == SPLIT.epoch + 1
    assert hasync.changes(hasync.owners(SPLIT), hasync.owners(moved)) == {0: "gb", 7: "gb"}
    assert hasync.changes(hasync.owners(moved), hasync.owners(moved)) == {}


def test_a_slot_haproxy_lacks_counts_as_changed() -> None:
    wanted = hasync.owners(SPLIT)
    routed = dict(wanted)
    del routed[5]
    routed[6] = "elsewhere"
    assert hasync.changes(routed, wanted) == {5: wanted[5], 6: wanted[6]}
    assert len(hasync.changes({}, wanted)) == SLOTS


def test_a_change_of_groups_is_refused_with_the_way_out() -> None:
    written = {"ga": ("127.0.0.1:1",), "gb": ("127.0.0.1:2",)}
    hasync.check_groups(written, SPLIT)  # same groups: fine
    three = ShardMap.even_split(
        {"ga": ["127.0.0.1:1"], "gb": ["127.0.0.1:2"], "gc": ["127.0.0.1:5"]},
        http={"ga": ["127.0.0.1:3"], "gb": ["127.0.0.1:4"], "gc": ["127.0.0.1:6"]},
    )
    with pytest.raises(hasync.SyncError, match=r"added \['gc'\].*reload HAProxy"):
        hasync.check_groups(written, three)
    with pytest.raises(hasync.SyncError, match=r"'gb'.*127.0.0.1:7 -> 127.0.0.1:2.*reload"):
        hasync.check_groups({**written, "gb": ("127.0.0.1:7",)}, SPLIT)


def test_the_backends_and_the_socket_come_from_the_written_config(tmp_path: Path) -> None:
    config, _ = haproxy.write(SPLIT, tmp_path)
    text = config.read_text()
    assert hasync.backends(text) == {"ga": ("127.0.0.1:1",), "gb": ("127.0.0.1:2",)}
    assert f"stats socket {tmp_path.absolute() / haproxy.SOCKET_FILE} mode 600 level admin" in text
    other, _ = haproxy.write(SPLIT, tmp_path / "b", socket="/run/x.sock")
    assert "stats socket /run/x.sock mode 600" in other.read_text()
    with pytest.raises(ShardMapError, match="at most 107 bytes"):
        haproxy.write(SPLIT, tmp_path / "c", socket="/" + "s" * 107)


def test_the_map_file_is_replaced_whole(tmp_path: Path) -> None:
    haproxy.write(SPLIT, tmp_path)
    moved = SPLIT.with_slots([3], "gb")
    hasync.write_map(tmp_path, moved)
    assert (tmp_path / haproxy.MAP_FILE).read_text() == haproxy.render_map(moved)
    assert sorted(p.name for p in tmp_path.iterdir()) == [haproxy.CONFIG_FILE, haproxy.MAP_FILE]
