"""The shard map and slots: the hash every language agrees on, and a map that is always whole."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from sessionlog.shard import SLOTS, ShardMap, ShardMapError, slot_of

TWO_GROUPS = """
epoch = 3

[groups.g1]
members = ["127.0.0.1:50051", "127.0.0.1:50052"]
http = ["127.0.0.1:8081", "127.0.0.1:8082"]
slots = ["0-511"]

[groups.g2]
members = ["127.0.0.1:50061"]
slots = ["512-1000", "1001-1023"]
"""


def test_a_slot_is_crc32_of_the_utf8_id_modulo_1024() -> None:
    """The documented hash: the same number HAProxy's crc32,mod(1024) gives."""
    assert SLOTS == 1024
    assert slot_of("abc") == zlib.crc32(b"abc") % 1024 == 450
    assert slot_of("") == 0
    assert slot_of("sessão") == zlib.crc32("sessão".encode()) % 1024


def test_a_toml_map_reads_back_with_its_owners() -> None:
    """Ranges, members and http addresses come through; touching ranges are joined."""
    shard_map = ShardMap.from_toml(TWO_GROUPS)
    assert shard_map.epoch == 3
    g1, g2 = shard_map.groups
    assert g1.primary == "127.0.0.1:50051"
    assert g1.http == ("127.0.0.1:8081", "127.0.0.1:8082")
    assert g2.ranges == ((512, 1023),)
    assert shard_map.owner_of_slot(511).name == "g1"
    assert shard_map.owner_of_slot(512).name == "g2"
    assert shard_map.owner("abc").name == "g1"
    assert shard_map.group_of_member("127.0.0.1:50061") is g2
    assert shard_map.group_of_member("127.0.0.1:1") is None


def test_toml_and_json_forms_round_trip() -> None:
    """Writing a map and reading it back gives the same map, in either form."""
    shard_map = ShardMap.from_toml(TWO_GROUPS)
    assert ShardMap.from_toml(shard_map.to_toml()) == shard_map
    assert ShardMap.from_json(shard_map.to_json()) == shard_map


def test_moving_slots_raises_the_epoch_and_keeps_the_map_whole() -> None:
    """with_slots hands slots to the target group only, one epoch up; unknown groups refused."""
    shard_map = ShardMap.from_toml(TWO_GROUPS)
    moved = shard_map.with_slots([0, 7, 1023], to="g2")
    assert moved.epoch == 4
    assert moved.group("g1").range_text() == ["1-6", "8-511"]
    assert moved.group("g2").range_text() == ["0", "7", "512-1023"]
    back = moved.with_slots([7], to="g1")
    assert back.epoch == 5
    assert back.group("g1").range_text() == ["1-511"]
    with pytest.raises(ShardMapError, match="no group 'g9'"):
        shard_map.with_slots([1], to="g9")
    assert moved.group("g1").slot_count + moved.group("g2").slot_count == SLOTS


def test_an_even_split_covers_every_slot_once() -> None:
    """Three groups share 1,024 slots in contiguous ranges."""
    shard_map = ShardMap.even_split({"a": ["h:1"], "b": ["h:2"], "c": ["h:3"]})
    assert [g.ranges for g in shard_map.groups] == [((0, 340),), ((341, 681),), ((682, 1023),)]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("epoch = 0\n[groups.g1]\nmembers=['h:1']\nslots=['0-1023']", "at least 1"),
        ("epoch = 1\n[groups.g1]\nmembers=['h:1']\nslots=['0-1022']", "slots 1023 are owned by no"),
        (
            "epoch = 1\n[groups.a]\nmembers=['h:1']\nslots=['0-600']\n"
            "[groups.b]\nmembers=['h:2']\nslots=['600-1023']",
            "slot 600 is owned by both",
        ),
        ("epoch = 1\n[groups.g1]\nmembers=['nope']\nslots=['0-1023']", "is not HOST:PORT"),
        ("epoch = 1\n[groups.g1]\nmembers=[]\nslots=['0-1023']", "has no members"),
        ("epoch = 1\n[groups.g1]\nmembers=['h:1']\nslots=['0-1024']", "not within 0-1023"),
        ("epoch = 1\n[groups.g1]\nmembers=['h:1']\nslots=['x']", "not a slot or a range"),
        (
            "epoch = 1\n[groups.g1]\nmembers=['h:1']\nhttp=['h:2','h:3']\nslots=['0-1023']",
            "one per member",
        ),
        ("epoch = 1\n[groups.'bad name']\nmembers=['h:1']\nslots=['0-1023']", "group name"),
        (
            "epoch = 1\n[groups.a]\nmembers=['h:1']\nslots=['0-9']\n"
            "[groups.b]\nmembers=['h:1']\nslots=['10-1023']",
            "member h:1 is in group 'a' and 'b'",
        ),
        ("epoch = 1\ncolour = 'red'\n[groups.g1]\nmembers=['h:1']\nslots=['0-1023']", "colour"),
        ("epoch = [", "not valid TOML"),
    ],
)
def test_an_invalid_map_says_what_is_wrong(text: str, says: str) -> None:
    """Every broken map is refused with a sentence naming the problem."""
    with pytest.raises(ShardMapError) as caught:
        ShardMap.from_toml(text)
    assert says in str(caught.value)


def test_a_missing_map_file_is_named() -> None:
    """load() names the file it could not read."""
    with pytest.raises(ShardMapError, match=r"cannot read the shard map /nonexistent/nope\.toml"):
        ShardMap.load("/nonexistent/nope.toml")


def test_frozen_slots_round_trip_and_are_validated() -> None:
    """``frozen`` (a move under way) survives TOML and JSON; a flip unfreezes the moved slot."""
    base = ShardMap.even_split({"g1": ["127.0.0.1:5001"], "g2": ["127.0.0.1:6001"]})
    frozen = base.with_frozen([17, 18, 40])
    assert (frozen.epoch, frozen.is_frozen(17), frozen.is_frozen(19)) == (2, True, False)
    assert frozen.to_dict()["frozen"] == ["17-18", "40"]
    assert ShardMap.from_toml(frozen.to_toml()) == frozen
    assert ShardMap.from_json(frozen.to_json()) == frozen
    assert "frozen" not in base.to_dict()  # a map without moves reads as before
    flipped = frozen.with_slots([17], to="g2")
    assert (flipped.epoch, sorted(flipped.frozen), flipped.owner_of_slot(17).name) == (
        3,
        [18, 40],
        "g2",
    )
    text = base.to_toml()
    with pytest.raises(ShardMapError, match="`frozen`: range '2000' is not within 0-1023"):
        ShardMap.from_toml('frozen = ["2000"]\n' + text)
    with pytest.raises(ShardMapError, match="`frozen` must be a list"):
        ShardMap.from_toml('frozen = "17"\n' + text)


def _one_group(**fields: object) -> dict[str, Any]:
    group = {"members": ["h:1"], "slots": ["0-1023"], **fields}
    return {"epoch": 1, "groups": {"g1": group}}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 100_000, "not valid JSON"),  # nested past the parser's recursion limit
        ('{"epoch": ' + "1" * 5000 + "}", "not valid JSON"),  # past int()'s digit limit
        (json.dumps({"epoch": 1 << 64, "groups": _one_group()["groups"]}), "at most"),
        (json.dumps(_one_group(slots=["1" * 5000])), "not a slot or a range"),
        (json.dumps({"epoch": 1, "groups": {"g1\n": _one_group()["groups"]["g1"]}}), "name"),
        (json.dumps(_one_group(members=["h:1\n"])), "is not HOST:PORT"),
        (json.dumps(_one_group(members=["h:1"], http=["h:2\n"])), "is not HOST:PORT"),
        (
            '{"epoch": 1, "groups": {"g1": {"members": ["h:1"], "slots": ["0-1023"]}, '
            '"g1": {"members": ["h:2"], "slots": ["0-1023"]}}}',
            "'g1' is given twice",
        ),
    ],
)
def test_a_damaged_json_map_is_a_shard_map_error(text: str, says: str) -> None:
    """Whatever etcd's key holds, from_json raises ShardMapError (which the poller logs and
    survives), never RecursionError, a bare ValueError, or a map with a newline in a name."""
    with pytest.raises(ShardMapError) as caught:
        ShardMap.from_json(text)
    assert says in str(caught.value)


def test_a_deeply_nested_toml_map_is_a_shard_map_error() -> None:
    with pytest.raises(ShardMapError, match="not valid TOML"):
        ShardMap.from_toml("a = " + "[" * 100_000)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe\x00 binary", "not UTF-8"),
        (b"# " + b"x" * (5 << 20), "larger than"),
    ],
)
def test_a_binary_or_huge_map_file_is_named(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "shards.toml"
    path.write_bytes(content)
    with pytest.raises(ShardMapError) as caught:
        ShardMap.load(str(path))
    assert str(path) in str(caught.value)
    assert says in str(caught.value)
