"""The pure parts of the election: the self-fence deadline on a clock the test turns, the
position guard's order, member records, and the intervals derived from the TTL."""

from __future__ import annotations

import pytest

from sessionlog.cluster.election import Timing
from sessionlog.cluster.fence import LeaseDeadline
from sessionlog.cluster.members import GroupKeys, MemberRecord, Progress, members_ahead


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_writes_stop_half_a_ttl_after_the_renewal_was_sent() -> None:
    """Counted from the send, not the answer: a slow answer shortens the time left."""
    clock = Clock()
    fence = LeaseDeadline(6, clock)
    assert not fence.alive()
    sent = clock.now
    clock.now += 2.0  # the answer took two seconds
    fence.renewed(sent, 6)
    assert fence.deadline == sent + 3
    clock.now = sent + 2.999
    assert fence.alive()
    clock.now = sent + 3
    assert not fence.alive()


def test_a_frozen_process_wakes_past_its_deadline() -> None:
    """Nothing needs to run for the fence to close: the clock alone decides."""
    clock = Clock()
    fence = LeaseDeadline(4, clock)
    fence.renewed(clock.now, 4)
    clock.now += 30  # SIGSTOP, then SIGCONT
    assert not fence.alive()
    assert fence.remaining() < 0


def test_the_deadline_never_moves_back_and_ignores_dead_leases() -> None:
    clock = Clock()
    fence = LeaseDeadline(4, clock)
    fence.renewed(clock.now, 4)
    fence.renewed(clock.now - 1, 4)  # an older renewal answered late
    assert fence.deadline == clock.now + 2
    fence.renewed(clock.now + 1, -1)  # "no such lease"
    assert fence.deadline == clock.now + 2
    fence.reset()
    assert not fence.alive()


def test_a_longer_ttl_granted_by_etcd_does_not_stretch_the_fence() -> None:
    """etcd raises short TTLs to its floor; the fence keeps to the TTL asked for."""
    clock = Clock()
    fence = LeaseDeadline(2, clock)
    fence.renewed(clock.now, 8)
    assert fence.deadline == clock.now + 1


def test_the_guard_orders_by_epoch_then_position() -> None:
    """A member with records of a newer epoch is ahead of one with more records of an older
    one (a deposed primary's extra records do not win an election)."""
    mine = Progress(epoch=2, position=95)
    deposed = MemberRecord("a", "h:1", Progress(epoch=1, position=100))
    level = MemberRecord("b", "h:2", Progress(epoch=2, position=95))
    ahead = MemberRecord("c", "h:3", Progress(epoch=2, position=96))
    assert members_ahead(mine, [deposed, level]) == []
    assert members_ahead(mine, [deposed, level, ahead]) == [ahead]
    assert members_ahead(Progress(1, 100), [level]) == [level]


def test_member_records_round_trip_and_junk_is_refused() -> None:
    record = MemberRecord("m1", "10.0.0.1:50051", Progress(3, 42))
    assert MemberRecord.decode("m1", record.encode()) == record
    for junk in (
        b"",
        b"{",
        b"[]",
        b'{"address": "h:1", "position": -1, "epoch": 0}',
        b'{"address": "h:1", "position": true, "epoch": 0}',
        b'{"address": 1}',
    ):
        with pytest.raises(ValueError, match="not a member record"):
            MemberRecord.decode("m1", junk)


def test_group_keys() -> None:
    keys = GroupKeys("orders")
    assert keys.leader == "/sessionlog/groups/orders/leader"
    assert keys.member("m1") == "/sessionlog/groups/orders/members/m1"
    assert keys.members < keys.member("m1") < keys.members_end
    assert not keys.members_end.startswith(keys.members)


@pytest.mark.parametrize("ttl", [2, 3, 5, 60])
def test_a_renewal_that_times_out_leaves_time_for_a_retry_before_the_fence(ttl: int) -> None:
    """Interval + call timeout < TTL/2: a keepalive lost to a dead endpoint is retried on the
    next one before writes stop; a poll is well inside the TTL."""
    timing = Timing.for_ttl(ttl)
    assert timing.keepalive_interval + timing.call_timeout < ttl / 2
    assert timing.settle + timing.poll_interval < ttl
