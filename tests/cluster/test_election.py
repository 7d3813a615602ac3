"""The election against real etcd processes: one leader, takeover with a higher epoch after the
TTL, the self-fence before the new epoch exists, the position guard, etcd restarts, dead
endpoints. Faults are real: a TCP relay that black-holes a member's link to etcd, SIGSTOP of a
member process, SIGTERM of etcd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sessionlog.cluster.election import WAITING_FOR_SYNC, Fenced, Follow, Lead, Member
from sessionlog.cluster.etcd import Endpoints
from sessionlog.cluster.members import GroupKeys, MemberRecord, Progress, SyncSet
from sessionlog.cluster.settings import ClusterSettings, Endpoint, cluster_settings
from tests.cluster._etcd import EtcdProcess
from tests.cluster._group import ELECTION_SECONDS
from tests.e2e._proc import free_port
from tests.e2e._relay import Relay

TTL = 3
"""Seconds: short, so a takeover fits a test, and above etcd's floor of 2."""
GROUP = "g"
REPO = Path(__file__).resolve().parents[2]


def settings(endpoints: Sequence[Endpoint | str], index: int, ttl: int = TTL) -> ClusterSettings:
    text = "etcd://" + ",".join(str(e) for e in endpoints)
    made = cluster_settings(text, GROUP, f"127.0.0.1:{7100 + index}", ttl)
    assert made is not None
    return made


async def eventually(check: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``check`` until true (returns the monotonic time it was seen) or fail naming it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {within} s: {what}")


@contextlib.asynccontextmanager
async def members(
    *all_settings: ClusterSettings, positions: Sequence[int] = ()
) -> AsyncIterator[list[Member]]:
    started = [
        Member(s, progress=Progress(0, positions[i] if positions else 0))
        for i, s in enumerate(all_settings)
    ]
    for member in started:
        member.start()
    try:
        yield started
    finally:
        for member in started:
            await member.stop()


def leaders(group: list[Member]) -> list[Member]:
    return [m for m in group if m.may_write()]


def one_leader(group: list[Member]) -> Member:
    found = leaders(group)
    assert len(found) == 1, [m.role for m in group]
    return found[0]


def all_follow(group: list[Member], leader: Member) -> bool:
    role = leader.role
    return isinstance(role, Lead) and all(
        m.role == Follow(leader.settings.advertise, role.epoch) for m in group if m is not leader
    )


# -- in this process ------------------------------------------------------------------------------


@pytest.mark.serial  # one leader, unchanged for 2 TTLs of 3 s
def test_exactly_one_of_three_leads_and_the_others_follow_it(etcd: EtcdProcess) -> None:
    """Three members: one leads at an epoch, the two others follow its address at that epoch,
    and it stays so (no flapping) over two TTLs."""

    async def scenario() -> None:
        async with members(*(settings([etcd.endpoint], i) for i in range(3))) as group:
            await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "one leader")
            leader = one_leader(group)
            await eventually(
                lambda: all_follow(group, leader), ELECTION_SECONDS, "the others follow it"
            )
            epoch = leader.leading_epoch()
            assert epoch is not None
            assert epoch > 0
            end = time.monotonic() + 2 * TTL
            while time.monotonic() < end:
                assert leaders(group) == [leader]
                assert leader.leading_epoch() == epoch
                await asyncio.sleep(0.05)

    asyncio.run(scenario())


@pytest.mark.serial  # the other leads within one TTL
def test_a_resigning_leader_hands_over_without_waiting_for_its_ttl(etcd: EtcdProcess) -> None:
    """stop() revokes the lease: another member leads at a higher epoch well within one TTL."""

    async def scenario() -> None:
        async with members(*(settings([etcd.endpoint], i) for i in range(2))) as group:
            await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "one leader")
            old = one_leader(group)
            old_epoch = old.leading_epoch()
            assert old_epoch is not None
            (other,) = [m for m in group if m is not old]
            stopped = time.monotonic()
            await old.stop()
            assert not old.may_write()
            assert old.role == Fenced("stopped")
            won = await eventually(other.may_write, ELECTION_SECONDS, "the other member leads")
            assert won - stopped < TTL
            new_epoch = other.leading_epoch()
            assert new_epoch is not None
            assert new_epoch > old_epoch

    asyncio.run(scenario())


def test_a_leader_cut_off_from_etcd_fences_itself_before_the_new_epoch_exists(
    etcd: EtcdProcess,
) -> None:
    """The leader's link to etcd goes dark (a black hole: no reset, no answer): it stops
    writing TTL/2 after its last renewal, before the member that takes over sent the
    transaction creating the new epoch; when the link heals, it follows the new leader."""

    async def scenario() -> None:
        with Relay(etcd.port).start() as r0, Relay(etcd.port).start() as r1:
            relays = [r0, r1]
            async with members(*(settings([relays[i].address], i) for i in range(2))) as group:
                await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "one leader")
                old = one_leader(group)
                old_epoch = old.leading_epoch()
                assert old_epoch is not None
                (new,) = [m for m in group if m is not old]
                relay = relays[group.index(old)]
                relay.blackhole(True)
                last_may_write = time.monotonic()

                def takeover() -> bool:
                    nonlocal last_may_write
                    if old.may_write():
                        last_may_write = time.monotonic()
                    return new.may_write()

                await eventually(takeover, ELECTION_SECONDS, "the other member takes over")
                new_epoch = new.leading_epoch()
                assert new_epoch is not None
                assert new_epoch > old_epoch
                assert new.campaign_sent_at is not None
                assert old.fence.deadline < new.campaign_sent_at
                assert last_may_write < new.campaign_sent_at
                assert isinstance(old.role, Fenced)
                relay.blackhole(False)
                relay.cut()
                await eventually(
                    lambda: old.role == Follow(new.settings.advertise, new_epoch),
                    ELECTION_SECONDS,
                    "the old leader follows the new one",
                )
                assert not old.may_write()

    asyncio.run(scenario())


def test_a_member_behind_cannot_win_while_a_member_ahead_is_live(etcd: EtcdProcess) -> None:
    """A live member record ahead of this member (position 9 against 5) keeps it from
    campaigning for three TTLs; once that member's lease is revoked, it leads."""
    keys = GroupKeys(GROUP)
    ahead = Endpoints((etcd.endpoint,), timeout=2.0)
    lease, _ = ahead.grant(TTL)
    record = MemberRecord("ahead", "127.0.0.1:7199", Progress(0, 9))
    ahead.put(keys.member("ahead"), record.encode(), lease)

    async def scenario() -> None:
        async with members(settings([etcd.endpoint], 0), positions=[5]) as (behind,):
            end = time.monotonic() + 3 * TTL
            while time.monotonic() < end:
                assert not behind.may_write()
                await asyncio.to_thread(ahead.keepalive, lease)
                await asyncio.sleep(TTL / 4)
            assert isinstance(behind.role, Fenced)
            assert behind.status()["blocked_by"] == ["ahead"]
            await asyncio.to_thread(ahead.revoke, lease)
            await eventually(behind.may_write, ELECTION_SECONDS, "the member leads once alone")

    try:
        asyncio.run(scenario())
    finally:
        ahead.close()


def test_only_a_synchronous_member_or_the_previous_leader_may_campaign(
    etcd: EtcdProcess,
) -> None:
    """With a synchronous set in etcd that names another member, a member alone in its group
    (nobody ahead of it) stays without a leader for three TTLs and says whom it waits for;
    a set whose leader it is lets it lead; and so does one that names it, at a higher epoch
    after it resigned. Without the key (a new group, --ack local), it leads as before."""
    keys = GroupKeys(GROUP)
    writer = Endpoints((etcd.endpoint,), timeout=2.0)
    me = settings([etcd.endpoint], 0)
    other = "127.0.0.1:7199"

    def publish(leader: str, members: set[str]) -> None:
        writer.put(keys.sync, SyncSet(leader, 1, frozenset(members)).encode(), 0)

    async def scenario() -> None:
        publish(other, {"127.0.0.1:7198"})
        async with members(me) as (member,):
            end = time.monotonic() + 3 * TTL
            while time.monotonic() < end:
                assert not member.may_write()
                await asyncio.sleep(0.05)
            assert member.role == Fenced(f"{WAITING_FOR_SYNC}: 127.0.0.1:7198")
            assert member.status()["blocked_by"] == ["127.0.0.1:7198"]
            publish(me.advertise, set())  # it led last: it holds every acknowledged write
            await eventually(member.may_write, ELECTION_SECONDS, "the previous leader leads")
            epoch = member.leading_epoch()
            assert epoch is not None
        publish(other, {me.advertise})
        async with members(me) as (member,):
            await eventually(member.may_write, ELECTION_SECONDS, "a synchronous member leads")
            again = member.leading_epoch()
            assert again is not None
            assert again > epoch
        writer.delete(keys.sync)
        async with members(me) as (member,):
            await eventually(member.may_write, ELECTION_SECONDS, "with no set, any member leads")

    try:
        asyncio.run(scenario())
    finally:
        writer.close()


def test_of_two_members_the_one_ahead_wins(etcd: EtcdProcess) -> None:
    """Started together, the member at (epoch 0, position 9) leads, not the one at 5; when it
    resigns, the one behind (now alone) takes over."""

    async def scenario() -> None:
        both = [settings([etcd.endpoint], i) for i in range(2)]
        async with members(*both, positions=[5, 9]) as (behind, ahead):
            await eventually(
                lambda: len(leaders([behind, ahead])) == 1, ELECTION_SECONDS, "one leader"
            )
            assert one_leader([behind, ahead]) is ahead
            await ahead.stop()
            await eventually(
                behind.may_write, ELECTION_SECONDS, "the member behind leads once alone"
            )

    asyncio.run(scenario())


@pytest.mark.serial  # fenced within TTL/2 + 0.2 s
def test_an_etcd_restart_fences_the_leader_and_leadership_resumes(etcd: EtcdProcess) -> None:
    """etcd stops: within TTL/2 (+ a poll) nobody may write; etcd comes back on its ports with
    its data: one member leads again (the lease survives a restart, so the same one, at the
    same epoch) and the other follows it."""

    async def scenario() -> None:
        async with members(*(settings([etcd.endpoint], i) for i in range(2))) as group:
            await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "one leader")
            leader = one_leader(group)
            epoch = leader.leading_epoch()
            await eventually(
                lambda: all_follow(group, leader), ELECTION_SECONDS, "the other follows"
            )
            etcd.stop()
            stopped = time.monotonic()
            fenced = await eventually(
                lambda: not leaders(group), ELECTION_SECONDS, "nobody may write"
            )
            assert fenced - stopped <= TTL / 2 + 0.2
            end = time.monotonic() + TTL
            while time.monotonic() < end:  # etcd down for longer than the TTL
                assert not leaders(group)
                await asyncio.sleep(0.05)
            await asyncio.to_thread(etcd.start)
            await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "a leader again")
            again = one_leader(group)
            await eventually(
                lambda: all_follow(group, again), ELECTION_SECONDS, "the other follows"
            )
            assert again is leader
            assert again.leading_epoch() == epoch

    asyncio.run(scenario())


@pytest.mark.serial  # one leader, unchanged for 2 TTLs
def test_dead_and_silent_endpoints_before_the_live_one(etcd: EtcdProcess) -> None:
    """Endpoints: a closed port, then a black hole, then etcd. The members find etcd, elect a
    leader, and it keeps its leadership for two TTLs (the endpoint that answered is kept)."""

    async def scenario() -> None:
        with Relay(etcd.port).start() as hole:
            hole.blackhole(True)
            endpoints = [f"127.0.0.1:{free_port()}", hole.address, str(etcd.endpoint)]
            async with members(*(settings(endpoints, i) for i in range(2))) as group:
                await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "one leader")
                leader = one_leader(group)
                epoch = leader.leading_epoch()
                end = time.monotonic() + 2 * TTL
                while time.monotonic() < end:
                    assert leaders(group) == [leader]
                    assert leader.leading_epoch() == epoch
                    await asyncio.sleep(0.05)
                assert leader.status()["etcd_endpoint"] == str(etcd.endpoint)

    asyncio.run(scenario())


def test_the_endpoint_in_use_going_dark_moves_the_member_to_the_next(etcd: EtcdProcess) -> None:
    """Two routes to etcd; the one in use becomes a black hole: the members go on through the
    other, and the leader keeps its epoch (its lease never lapsed in etcd)."""

    async def scenario() -> None:
        with Relay(etcd.port).start() as first, Relay(etcd.port).start() as second:
            endpoints = [first.address, second.address]
            async with members(*(settings(endpoints, i) for i in range(2))) as group:
                await eventually(lambda: len(leaders(group)) == 1, ELECTION_SECONDS, "one leader")
                leader = one_leader(group)
                epoch = leader.leading_epoch()
                first.blackhole(True)
                first.cut()
                await eventually(
                    lambda: (
                        all(m.status()["etcd_endpoint"] == second.address for m in group)
                        and leader.may_write()
                    ),
                    ELECTION_SECONDS,
                    "every member on the second route, the leader writing",
                )
                assert leader.leading_epoch() == epoch
                await asyncio.sleep(TTL)
                assert leaders(group) == [leader]
                assert leader.leading_epoch() == epoch

    asyncio.run(scenario())


# -- member processes -------------------------------------------------------------------------


class MemberProcess:
    """``python -m tests.cluster._member`` with its stdout in a file; stopped by its PID."""

    def __init__(self, directory: Path, member: ClusterSettings, position: int = 0) -> None:
        self.output = directory / f"member-{member.advertise.replace(':', '-')}.jsonl"
        self.advertise = member.advertise
        argv = [
            sys.executable, "-m", "tests.cluster._member",
            "--cluster", "etcd://" + ",".join(str(e) for e in member.endpoints),
            "--group", member.group,
            "--advertise", member.advertise,
            "--lease-ttl", str(member.lease_ttl),
            "--position", str(position),
        ]  # fmt: skip
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for text in self.output.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(text)
                if isinstance(line, dict) and "event" in line:
                    found.append(line)
        return found

    def roles(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["event"] == "role"]

    def role(self) -> dict[str, Any]:
        roles = self.roles()
        return roles[-1] if roles else {"role": "none"}

    def ticks(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["event"] == "tick"]

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def member_processes(
    directory: Path, etcd: EtcdProcess, count: int
) -> Iterator[list[MemberProcess]]:
    started: list[MemberProcess] = []
    try:
        for i in range(count):
            started.append(MemberProcess(directory, settings([etcd.endpoint], i)))
        yield started
    finally:
        for process in started:
            process.stop()


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, group: list[MemberProcess]
) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}; {[p.role() for p in group]}")


def test_a_frozen_leader_process_wakes_fenced(etcd: EtcdProcess, tmp_path: Path) -> None:
    """SIGSTOP the leader's process for longer than the TTL: another member leads at a higher
    epoch, whose transaction was sent after the frozen leader's write deadline; after SIGCONT
    the old leader never again says it may write at its old epoch, and follows a newer leader.

    Under load a takeover may be followed by another (the new leader's own lease lapsing while
    etcd stalls): the test then waits for the old leader to follow whoever leads above it, and
    every safety check is about the old epoch and the first takeover."""
    with member_processes(tmp_path, etcd, 3) as group:

        def leading() -> list[MemberProcess]:
            return [p for p in group if p.role()["role"] == "lead"]

        wait_until(lambda: len(leading()) == 1, ELECTION_SECONDS, "one leader", group)
        (old,) = leading()
        old_epoch = old.role()["epoch"]
        wait_until(
            lambda: all(
                p.role()
                == p.role() | {"role": "follow", "address": old.advertise, "epoch": old_epoch}
                for p in group
                if p is not old
            ),
            ELECTION_SECONDS,
            "the others follow",
            group,
        )
        wait_until(
            lambda: any(t["may_write"] for t in old.ticks()),
            ELECTION_SECONDS,
            "a writable tick",
            group,
        )
        old.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        others = [p for p in group if p is not old]

        def takeovers() -> list[dict[str, Any]]:
            """Every role line of the others that leads above the old epoch, first first."""
            found = [
                r
                for p in others
                for r in p.roles()
                if r["role"] == "lead" and r["epoch"] > old_epoch
            ]
            return sorted(found, key=lambda r: r["epoch"])

        wait_until(lambda: bool(takeovers()), ELECTION_SECONDS, "a takeover", group)
        takeover = takeovers()[0]
        woken_at = time.monotonic()
        old.signal(signal.SIGCONT)

        def follows_a_newer_leader() -> bool:
            role = old.role()
            if role["role"] != "follow" or role["epoch"] <= old_epoch:
                return False
            return any(
                r["epoch"] == role["epoch"] and p.advertise == role["address"]
                for p in others
                for r in p.roles()
                if r["role"] == "lead"
            )

        wait_until(
            follows_a_newer_leader, ELECTION_SECONDS, "the old leader follows a newer one", group
        )
        old_ticks = [t for t in old.ticks() if t["epoch"] == old_epoch]
        writable = [t for t in old_ticks if t["may_write"]]
        assert writable, "the leader never said it may write"
        assert max(t["deadline"] for t in old_ticks) < takeover["campaign_sent_at"]
        assert max(t["checked_at"] for t in writable) < min(frozen_at, takeover["campaign_sent_at"])
        assert [t for t in old.ticks() if t["checked_at"] >= woken_at]
        assert not any(t["may_write"] for t in old_ticks if t["checked_at"] >= woken_at)
        assert not any(
            r["role"] == "lead" and r["epoch"] == old_epoch
            for r in old.roles()
            if r["t"] >= woken_at
        )
