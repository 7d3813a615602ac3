"""Ownership: which sessions a server's group owns under a shard map (pure logic, no I/O)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sessionlog import errors
from sessionlog.shard import SLOTS, ShardMap, ShardMapError, slot_of
from sessionlog.shard.ownership import Ownership

G1 = ["127.0.0.1:5001", "127.0.0.1:5002"]
G2 = ["127.0.0.1:6001"]


def two_groups(epoch: int = 1) -> ShardMap:
    return ShardMap.even_split({"g1": G1, "g2": G2}, epoch=epoch)


def session_in(shard_map: ShardMap, group: str, avoid: str = "") -> str:
    """The first id ``s0``, ``s1``... that ``group`` owns in ``shard_map``."""
    for n in range(10_000):
        candidate = f"s{n}"
        if candidate != avoid and shard_map.owner(candidate).name == group:
            return candidate
    raise AssertionError(f"no session of {group}")


def test_an_unsharded_server_owns_every_session() -> None:
    """Without --shard-map nothing is checked and every slot is owned."""
    ownership = Ownership(sharded=False)
    ownership.check("anything", "else")
    ownership.check_fork("a", "b")
    assert ownership.owns("x")
    assert (ownership.epoch, ownership.group, ownership.owned_slots) == (0, "", SLOTS)


def test_before_a_map_every_session_is_unavailable() -> None:
    """A sharded server with no map yet (etcd) cannot tell what it owns: SHARD_MAP_UNAVAILABLE."""
    ownership = Ownership(group="g1")
    with pytest.raises(errors.ShardMapUnavailable):
        ownership.check("s1")
    with pytest.raises(errors.ShardMapUnavailable):
        ownership.check()
    assert not ownership.owns("s1")
    assert ownership.owned_slots == 0


def test_a_foreign_session_is_wrong_group_with_the_owner_in_the_metadata() -> None:
    """WRONG_GROUP names the session, its slot, the owner group, its primary and members."""
    shard_map = two_groups(epoch=3)
    ownership = Ownership(group="g1")
    assert ownership.install(shard_map)
    mine, theirs = session_in(shard_map, "g1"), session_in(shard_map, "g2")
    ownership.check(mine)
    with pytest.raises(errors.WrongGroup) as caught:
        ownership.check(mine, theirs)
    error = caught.value
    assert error.metadata == {
        "session_id": theirs,
        "slot": str(slot_of(theirs)),
        "group": "g2",
        "primary": G2[0],
        "members": ",".join(G2),
        "map_epoch": "3",
    }
    assert (error.group, error.primary, error.members, error.map_epoch) == ("g2", G2[0], G2, 3)
    assert ownership.owned_slots == SLOTS // 2


@pytest.mark.parametrize("session_id", ["", "x" * 300, "bad id"])
def test_a_bad_id_is_invalid_session_id_before_any_owner_check(session_id: str) -> None:
    """Reads and writes alike: a value that is no session id is refused as such, not sent to
    an owner (whose slot it would otherwise hash to)."""
    ownership = Ownership(group="g1")
    assert ownership.install(two_groups())
    with pytest.raises(errors.InvalidSessionId):
        ownership.check(session_id)
    with pytest.raises(errors.InvalidSessionId):
        ownership.check_write(session_id)


def test_my_group_is_the_one_listing_my_address() -> None:
    """Without --group, the map's group that lists the server's address is its own."""
    ownership = Ownership(address=G2[0])
    ownership.install(two_groups())
    assert ownership.group == "g2"
    with pytest.raises(ShardMapError, match="lists this server's address"):
        Ownership(address="127.0.0.1:9").install(two_groups())


def test_a_first_map_without_my_group_is_refused_and_changes_nothing() -> None:
    """A server holding no map yet refuses one that lacks --group (ShardMapError)."""
    ownership = Ownership(group="g1")
    other = ShardMap.even_split({"g3": G1, "g2": G2}, epoch=2)
    with pytest.raises(ShardMapError, match="no group 'g1'"):
        ownership.install(other)
    assert ownership.map is None
    assert not ownership.ready


def test_a_newer_map_that_drops_my_group_leaves_me_owning_nothing() -> None:
    """Held epoch 1 (g1 owns half), then epoch 2 without g1 (g3 took its slots): the newer map
    is in force all the same, so every session is WRONG_GROUP naming its new owner. Keeping
    epoch 1 would let stale callers write g3's sessions here: two groups writable at once."""
    for ownership in (Ownership(group="g1"), Ownership(address=G1[0])):
        ownership.install(two_groups(epoch=1))
        mine = session_in(two_groups(epoch=1), "g1")
        dropped = ShardMap.even_split({"g3": ["127.0.0.1:7001"], "g2": G2}, epoch=2)
        assert ownership.install(dropped)
        assert ownership.epoch == 2
        assert (ownership.owned_slots, ownership.ready, ownership.owns(mine)) == (0, False, False)
        with pytest.raises(errors.WrongGroup) as caught:
            ownership.check(mine)
        assert caught.value.metadata["group"] == "g3"
        assert caught.value.metadata["map_epoch"] == "2"
        assert ownership.group == "g1"
        back = dropped.with_slots(range(SLOTS), to="g3")  # epoch 3, still without g1
        assert ownership.install(back)
        assert ownership.epoch == 3


def test_only_a_higher_epoch_replaces_the_map() -> None:
    """A newer map moves slots (callbacks run); an equal or lower epoch is ignored."""
    first = two_groups(epoch=5)
    ownership = Ownership(group="g1")
    seen: list[int] = []
    ownership.on_change(lambda m: seen.append(m.epoch))
    ownership.install(first)
    moving = session_in(first, "g1")
    moved = first.with_slots([slot_of(moving)], to="g2")
    assert moved.epoch == 6
    assert not ownership.install(ShardMap(5, moved.groups))  # same epoch: ignored
    ownership.check(moving)
    assert ownership.install(moved)
    with pytest.raises(errors.WrongGroup):
        ownership.check(moving)
    assert not ownership.install(two_groups(epoch=4))  # older: ignored
    assert ownership.epoch == 6
    assert seen == [5, 6]


def test_a_fork_stays_within_its_group() -> None:
    """Parent and child of one group fork; a child in another group is CROSS_GROUP_FORK."""
    shard_map = two_groups()
    ownership = Ownership(group="g1")
    ownership.install(shard_map)
    parent = session_in(shard_map, "g1")
    ownership.check_fork(parent, session_in(shard_map, "g1", avoid=parent))
    child = session_in(shard_map, "g2")
    with pytest.raises(errors.CrossGroupFork) as caught:
        ownership.check_fork(parent, child)
    assert caught.value.metadata["target_group"] == "g2"
    assert caught.value.metadata["source_group"] == "g1"
    with pytest.raises(errors.WrongGroup):
        ownership.check_fork(child, parent)


def test_the_primary_comes_from_the_source_given() -> None:
    """In cluster mode the owner's primary is the elected leader, or "" when unknown."""
    shard_map = two_groups()
    ownership = Ownership(group="g1", primary_of=lambda group: "")
    ownership.install(shard_map)
    with pytest.raises(errors.WrongGroup) as caught:
        ownership.check(session_in(shard_map, "g2"))
    assert caught.value.primary == ""


def test_a_frozen_slot_is_read_but_not_written_anywhere() -> None:
    """A slot being moved: its owner serves reads but refuses writes SLOT_MOVING (retryable
    UNAVAILABLE), and so does every other group; a move's copy is only taken by a non-owner."""
    base = two_groups()
    mine = session_in(base, "g1")
    frozen = base.with_frozen([slot_of(mine)])
    owner, other = Ownership(group="g1"), Ownership(group="g2")
    owner.install(frozen)
    other.install(frozen)
    owner.check(mine)  # reads go on
    for ownership in (owner, other):
        with pytest.raises(errors.SlotMoving) as raised:
            ownership.check_write(mine)
        assert isinstance(raised.value, errors.Unavailable)
        assert raised.value.metadata["slot"] == str(slot_of(mine))
        assert isinstance(ownership.refusal(mine), errors.SlotMoving)
    other_session = session_in(base, "g1", avoid=mine)
    if slot_of(other_session) != slot_of(mine):
        owner.check_write(other_session)  # the group's other slots take writes
        assert owner.refusal(other_session) is None
    with pytest.raises(errors.FailedPrecondition):
        owner.check_copy(mine, 0)  # the owner takes no copy of its own slot
    other.check_copy(mine, 0)
    with pytest.raises(errors.MalformedRequest):
        other.check_copy(mine, None)
    flipped = frozen.with_slots([slot_of(mine)], to="g2")
    owner.install(flipped)
    other.install(flipped)
    assert isinstance(owner.refusal(mine), errors.WrongGroup)
    other.check_write(mine)


def test_a_map_settles_after_the_writes_queued_before_it() -> None:
    """``settled_epoch`` follows the installs through the barrier the composition gives."""
    ownership = Ownership(group="g1")
    waiting: list[Callable[[], None]] = []
    ownership.barrier = waiting.append
    ownership.install(two_groups(epoch=3))
    assert (ownership.epoch, ownership.settled_epoch) == (3, 0)
    waiting.pop()()
    assert ownership.settled_epoch == 3


def test_a_group_name_the_map_disagrees_with_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--group g1 on a server the map lists under g2: the server serves g1 (the name wins) and
    warns once per map, naming both; a member of its group, or a wildcard --listen with no
    --advertise, is not warned about."""
    shard_map = two_groups(epoch=4)
    misplaced = Ownership(group="g1", address=G2[0])
    with caplog.at_level("WARNING", logger="sessionlog.shard.ownership"):
        assert misplaced.install(shard_map)
    assert misplaced.group == "g1"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert "--group is 'g1'" in warned[0]
    assert f"{G2[0]} under group 'g2'" in warned[0]
    assert "epoch 4" in warned[0]

    unlisted = Ownership(group="g1", address="127.0.0.1:7777")
    why = unlisted.misplaced(shard_map, shard_map.group("g1"))
    assert why is not None
    assert "under no group" in why
    for fine in (
        Ownership(group="g1", address=G1[1]),
        Ownership(group="g1", address="0.0.0.0:50051"),
    ):
        assert fine.misplaced(shard_map, shard_map.group("g1")) is None
    assert Ownership(address=G1[0]).misplaced(shard_map, shard_map.group("g1")) is None
