"""The Python client's shard routing table (sessionlog_client._shards) agrees with the server's
shard map: the same slot for every id, the same owner for every session, the etcd JSON form the
server writes, and a WRONG_GROUP's named owner taken over an old map."""

from __future__ import annotations

import pytest

from sessionlog.shard.shardmap import ShardMap
from sessionlog.shard.slots import SLOTS, slot_of
from sessionlog_client import _shards
from sessionlog_client._shards import ShardGroup, ShardMapInvalid, ShardTable, owner_from_error

IDS = ["demo", "a", "sess-1", "żółw", "x" * 235, "日本語-9", "_", "0.1-2"]


def test_the_slots_are_the_servers() -> None:
    assert _shards.SLOTS == SLOTS
    for session_id in IDS + [f"s{i}" for i in range(500)]:
        assert _shards.slot_of(session_id) == slot_of(session_id)


def test_the_etcd_form_routes_every_session_as_the_server_does() -> None:
    server_map = ShardMap.even_split(
        {"a": ["127.0.0.1:1", "127.0.0.1:2"], "b": ["127.0.0.1:3"], "c": ["127.0.0.1:4"]}, epoch=7
    ).with_slots([3, 900], "a")
    table = ShardTable.from_json(server_map.to_json())
    assert table.epoch == server_map.epoch
    for session_id in IDS + [f"s{i}" for i in range(500)]:
        owner = table.owner(session_id)
        expected = server_map.owner(session_id)
        assert (owner.name, owner.members) == (expected.name, expected.members)
    assert table.group("a") == ShardGroup(
        "a", ("127.0.0.1:1", "127.0.0.1:2"), server_map.group("a").ranges, "127.0.0.1:1"
    )


def test_a_group_tries_its_primary_first() -> None:
    group = ShardGroup("g", ("m1:1", "m2:2", "m3:3"), ((0, SLOTS - 1),), "m2:2")
    assert group.addresses == ("m2:2", "m1:1", "m3:3")
    assert ShardGroup("g", ("m1:1", "m2:2"), ()).addresses == ("m1:1", "m2:2")


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ({"a": [(0, 511)], "b": [(500, SLOTS - 1)]}, "owned twice"),
        ({"a": [(0, 511)], "b": [(513, SLOTS - 1)]}, "have no owner"),
        ({"a": [(0, SLOTS)]}, "out of range"),
    ],
)
def test_a_map_that_does_not_cover_each_slot_once_is_refused(
    ranges: dict[str, list[tuple[int, int]]], message: str
) -> None:
    groups = tuple(ShardGroup(name, ("h:1",), tuple(r)) for name, r in ranges.items())
    with pytest.raises(ShardMapInvalid, match=message):
        ShardTable(1, groups)


def test_the_etcd_form_is_checked() -> None:
    for text in ["[]", "{", '{"epoch": 0, "groups": {}}', '{"epoch": 1, "groups": {"a": 3}}']:
        with pytest.raises(ShardMapInvalid):
            ShardTable.from_json(text)


def test_a_wrong_groups_owner_replaces_the_old_one_for_that_slot() -> None:
    table = ShardTable(
        1,
        (
            ShardGroup("a", ("h:1",), ((0, 511),), "h:1"),
            ShardGroup("b", ("h:2",), ((512, SLOTS - 1),), "h:2"),
        ),
    )
    session = next(s for s in (f"s{i}" for i in range(100)) if slot_of(s) < 512)
    named = owner_from_error(
        {"group": "b", "primary": "h:9", "members": "h:2,h:9", "map_epoch": "4", "slot": "1"}
    )
    assert named == (ShardGroup("b", ("h:2", "h:9"), (), "h:9"), 4)
    moved = table.with_owner(session, *named)
    assert moved.epoch == 4
    assert moved.owner(session) == ShardGroup(
        "b", ("h:2", "h:9"), tuple(sorted(((slot_of(session),) * 2, (512, SLOTS - 1)))), "h:9"
    )
    others = [s for s in (f"t{i}" for i in range(300)) if slot_of(s) != slot_of(session)]
    assert all(moved.owner(s).name == table.owner(s).name for s in others)
    assert owner_from_error({"group": "b", "members": "", "primary": ""}) is None


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,  # nested past json's recursion limit
        '{"epoch": ' + "1" * 5000 + "}",  # past int()'s digit limit
        '{"epoch": 1, "groups": {"a": {"members": ["h:1"], "slots": ["' + "1" * 5000 + '"]}}}',
        '{"epoch": 1, "groups": {"a": {"members": ["h:1"], "slots": ["0-1023\\n"]}}}',
    ],
)
def test_a_damaged_etcd_value_is_shard_map_invalid(text: str) -> None:
    """Whatever the etcd key holds, the client gets ShardMapInvalid (which a WRONG_GROUP
    refresh passes over for the error's owner), never RecursionError or a bare ValueError."""
    with pytest.raises(ShardMapInvalid):
        ShardTable.from_json(text)


def test_a_stale_servers_wrong_group_does_not_undo_a_newer_map() -> None:
    """The client holds epoch 5 (the slot is b's); b still holds epoch 4 and refuses, naming
    a. Neither the older map b hands out nor its word replaces epoch 5: the call is not sent
    on (no owner other than b), and the table still routes the slot to b."""
    old = ShardMap.even_split({"a": ["h:1"], "b": ["h:2"]}, epoch=4)
    session = next(f"s{i}" for i in range(100) if old.owner(f"s{i}").name == "a")
    newer = ShardTable.from_json(old.with_slots([slot_of(session)], to="b").to_json())
    assert newer.epoch == 5
    stale = ShardTable.from_json(old.to_json())
    error = {"group": "a", "primary": "h:1", "members": "h:1", "map_epoch": "4"}
    table, owner = _shards.after_wrong_group(newer, stale, session, error)
    assert table is newer
    assert owner is not None
    assert owner.name == "b"
    fresh = {**error, "map_epoch": "6"}  # a newer word than the table's is taken
    table, owner = _shards.after_wrong_group(newer, stale, session, fresh)
    assert owner is not None
    assert owner.name == "a"
    assert table is not None
    assert table.epoch == 6
