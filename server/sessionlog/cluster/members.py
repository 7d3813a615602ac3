"""The group's keys in etcd and what a member publishes there; the position guard.

    /sessionlog/groups/NAME/leader        the leader's advertise address (bytes), attached to the
                                          leader's lease, created only if absent; its
                                          create_revision is the epoch of that leadership
    /sessionlog/groups/NAME/members/ID    MemberRecord as JSON, attached to the member's lease

Invariants:
- Epochs rise: etcd's revision is cluster-wide and only grows, and a new leader key is a new
  create_revision, so every leadership gets an epoch above every earlier one.
- A member's keys live exactly as long as its lease: a member that stops renewing it disappears
  from ``members/`` (and from ``leader``) after the TTL, which is what "live" means here.
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
