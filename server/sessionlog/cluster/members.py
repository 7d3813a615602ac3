"""The group's keys in etcd and what a member publishes there; the position guard.

    /sessionlog/groups/NAME/leader        the leader's advertise address (bytes), attached to the
                                          leader's lease, created only if absent; its
                                          create_revision is the epoch of that leadership
    /sessionlog/groups/NAME/members/ID    MemberRecord as JSON, attached to the member's lease
    /sessionlog/groups/NAME/sync          SyncSet as JSON, attached to no lease (it outlives its
                                          leader): with --ack replica, the leader that wrote it
                                          and the members that hold every write it acknowledged

Invariants:
- Epochs rise: etcd's revision is cluster-wide and only grows, and a new leader key is a new
  create_revision, so every leadership gets an epoch above every earlier one.
- A member's keys live exactly as long as its lease: a member that stops renewing it disappears
  from ``members/`` (and from ``leader``) after the TTL, which is what "live" means here.
- Only a synchronous member may take over: while ``sync`` names a set, a member campaigns only
  if it is that set's leader or one of its members (``sync_blockers``). The leader writes the
  key in a transaction that requires its leader key to be the one it won, adds a replica to the
  set before any write's acknowledgement counts it, and acknowledges nothing that a member of
  the set (as etcd may hold it) lacks: so whoever may win holds every acknowledged write, even
  when a member that holds more is not listed in ``members/`` (cut off from etcd). Without the
  key (a new group, ``--ack local``), any member may campaign.
- The position guard orders members by (epoch of the last durable record, position), as Raft
  orders logs by (last term, last index): a deposed primary's extra records from an older epoch
  do not outrank a member that holds records of a newer one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

ROOT = "/sessionlog/groups/"


@dataclass(frozen=True)
class GroupKeys:
    """The etcd keys of one group."""

    group: str

    @property
    def prefix(self) -> str:
        return f"{ROOT}{self.group}/"

    @property
    def leader(self) -> str:
        return f"{self.prefix}leader"

    @property
    def members(self) -> str:
        """The prefix of every member record (a range from here to ``members_end``)."""
        return f"{self.prefix}members/"

    @property
    def members_end(self) -> str:
        return f"{self.prefix}members0"  # "0" is the byte after "/"

    def member(self, member_id: str) -> str:
        return f"{self.members}{member_id}"

    @property
    def sync(self) -> str:
        return f"{self.prefix}sync"


@dataclass(frozen=True, order=True)
class Progress:
    """How far a member's durable log goes: the epoch its last record was written in, and the
    position of that record (0: empty). Compared as a pair, epoch first."""

    epoch: int = 0
    position: int = 0


@dataclass(frozen=True)
class MemberRecord:
    """What a member publishes under ``members/ID``."""

    member_id: str
    address: str
    progress: Progress

    def encode(self) -> bytes:
        return json.dumps(
            {
                "address": self.address,
                "position": self.progress.position,
                "epoch": self.progress.epoch,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, member_id: str, data: bytes) -> MemberRecord:
        """The record, or ValueError when ``data`` is not one."""
        try:
            fields = json.loads(data)
            address, position, epoch = fields["address"], fields["position"], fields["epoch"]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"member {member_id!r}: not a member record ({exc})") from None
        if not isinstance(address, str) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (position, epoch)
        ):
            raise ValueError(f"member {member_id!r}: not a member record: {fields!r}")
        return cls(member_id, address, Progress(epoch, position))


def members_ahead(mine: Progress, others: Iterable[MemberRecord]) -> list[MemberRecord]:
    """The live members whose published progress is beyond ``mine``: while there is one, this
    member may not campaign (it would win without records someone else has durable)."""
    return [record for record in others if record.progress > mine]


@dataclass(frozen=True)
class SyncSet:
    """What a leader with --ack replica publishes under ``sync``: itself (``leader``, its
    advertise address, at ``epoch``) and the members that hold every write it acknowledged."""

    leader: str
    epoch: int
    members: frozenset[str]

    def encode(self) -> bytes:
        return json.dumps(
            {"leader": self.leader, "epoch": self.epoch, "members": sorted(self.members)},
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> SyncSet:
        """The set, or ValueError when ``data`` is not one."""
        try:
            fields = json.loads(data)
            leader, epoch, members = fields["leader"], fields["epoch"], fields["members"]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a synchronous set ({exc})") from None
        if (
            not isinstance(leader, str)
            or not isinstance(epoch, int)
            or isinstance(epoch, bool)
            or not isinstance(members, list)
            or not all(isinstance(m, str) for m in members)
        ):
            raise ValueError(f"not a synchronous set: {fields!r}")
        return cls(leader, epoch, frozenset(members))


def sync_blockers(me: str, published: SyncSet | None) -> tuple[str, ...]:
    """The members this one waits for before it may campaign: none when no set is published or
    it is the set's leader or one of its members; otherwise the set's members (and leader),
    one of whom holds writes this member may lack."""
    if published is None or me == published.leader or me in published.members:
        return ()
    return tuple(sorted(published.members)) or (published.leader,)
