"""Smart routing over shard groups: which group owns a session, from the cluster's shard map.

Sessions are spread over groups by slot: ``slot = crc32(UTF-8 id) % 1024`` (the server's
``sessionlog.shard.slots``), and the shard map gives each group its slot ranges, members and
current primary. A client given ``shard_map`` loads the map (``"server"``: the GetShardMap RPC of
the addresses it was given; ``"etcd://HOST:PORT[,...]"``: the etcd key ``/sessionlog/shards``,
the JSON the servers read), keeps one client per group (primary first, so its own routing finds
the primary and follows failovers as for one group) and sends each call that names a session to
the owner's. A refusal with ``WRONG_GROUP`` (the map moved on) reloads the map, or, when the
reload names no newer owner, takes the owner the error names (ErrorInfo ``group``, ``primary``,
``members``, ``map_epoch``), and sends the call again there once.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SLOTS = 1024
"""The number of slots, fixed (the server's ``sessionlog.shard.slots.SLOTS``)."""
WRONG_GROUP = "WRONG_GROUP"
"""The reason of the refusal of a call sent to a group that does not own the session."""
SERVER = "server"
"""``shard_map="server"``: load the map with GetShardMap from the addresses given."""

_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")
"""Matched whole (``fullmatch``); at most 9 digits, so int() never meets its digit limit."""


def slot_of(session_id: str) -> int:
    """The slot of ``session_id``: CRC-32 (IEEE, zlib's) of its UTF-8 bytes, modulo SLOTS."""
    return zlib.crc32(session_id.encode("utf-8")) % SLOTS


class ShardMapInvalid(ValueError):
    """A shard map the client cannot route by (the message says why)."""


@dataclass(frozen=True)
class ShardGroup:
    """One group: its name, its members, its inclusive slot ranges and its primary ("": not
    known; the first member is then tried first)."""

    name: str
    members: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]
    primary: str = ""

    @property
    def addresses(self) -> tuple[str, ...]:
        """The members with the primary first: the order a group client tries them in."""
        first = (self.primary,) if self.primary else ()
        return first + tuple(m for m in self.members if m != self.primary)


@dataclass(frozen=True)
class ShardTable:
    """A shard map as the client routes by it: each slot's owner, at an epoch."""

    epoch: int
    groups: tuple[ShardGroup, ...]

    def __post_init__(self) -> None:
        owners: list[int | None] = [None] * SLOTS
        names = set()
        for index, group in enumerate(self.groups):
            if not group.name or group.name in names:
                raise ShardMapInvalid(f"group name {group.name!r} is empty or repeated")
            names.add(group.name)
            if not group.members and not group.primary:
                raise ShardMapInvalid(f"group {group.name!r} has no member")
            for first, last in group.ranges:
                if not 0 <= first <= last < SLOTS:
                    raise ShardMapInvalid(
                        f"group {group.name!r}: slots {first}-{last} out of range"
                    )
                for slot in range(first, last + 1):
                    if owners[slot] is not None:
                        raise ShardMapInvalid(f"slot {slot} is owned twice")
                    owners[slot] = index
        missing = [slot for slot, owner in enumerate(owners) if owner is None]
        if missing:
            raise ShardMapInvalid(f"{len(missing)} slots have no owner (the first: {missing[0]})")
        object.__setattr__(self, "_owners", tuple(owners))

    def owner_of_slot(self, slot: int) -> ShardGroup:
        owners: tuple[int, ...] = object.__getattribute__(self, "_owners")
        return self.groups[owners[slot]]

    def owner(self, session_id: str) -> ShardGroup:
        """The group that owns ``session_id``."""
        return self.owner_of_slot(slot_of(session_id))

    def group(self, name: str) -> ShardGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    def with_owner(self, session_id: str, owner: ShardGroup, epoch: int) -> ShardTable:
        """This map with ``session_id``'s slot given to ``owner`` (a WRONG_GROUP's word for it,
        taken when no newer map could be read), at ``epoch``."""
        slot = slot_of(session_id)
        groups = []
        for group in self.groups:
            if group.name == owner.name:
                continue
            ranges = tuple(_minus(group.ranges, slot))
            groups.append(ShardGroup(group.name, group.members, ranges, group.primary))
        known = self.group(owner.name)
        ranges = (*(known.ranges if known else ()), (slot, slot))
        groups.append(ShardGroup(owner.name, owner.members, _merged(ranges), owner.primary))
        return ShardTable(max(epoch, self.epoch), tuple(groups))

    @staticmethod
    def from_reply(reply: Any) -> ShardTable | None:
        """From a GetShardMapResponse; None for an unsharded server (epoch 0)."""
        shard_map = reply.shard_map
        if not shard_map.epoch:
            return None
        return ShardTable(
            int(shard_map.epoch),
            tuple(
                ShardGroup(
                    g.name,
                    tuple(g.members),
                    tuple((int(r.first), int(r.last)) for r in g.slot_ranges),
                    g.primary,
                )
                for g in shard_map.groups
            ),
        )

    @staticmethod
    def from_json(text: str | bytes) -> ShardTable:
        """From the etcd form (``sessionlog.shard.shardmap.ShardMap.to_json``): ``{"epoch": N,
        "groups": {NAME: {"members": [...], "slots": ["0-511", ...], "http": [...]}}}``."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
            raise ShardMapInvalid(f"the shard map is not JSON: {str(error)[:200]}") from None
        if not isinstance(data, Mapping) or not isinstance(data.get("groups"), Mapping):
            raise ShardMapInvalid("a shard map is an object with `epoch` and `groups`")
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise ShardMapInvalid("`epoch` must be an integer of at least 1")
        groups = []
        for name, body in data["groups"].items():
            if not isinstance(body, Mapping):
                raise ShardMapInvalid(f"group {name!r} is not an object")
            members = body.get("members")
            if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                raise ShardMapInvalid(f"group {name!r}: `members` must be a list of HOST:PORT")
            slots = body.get("slots")
            if not isinstance(slots, list):
                raise ShardMapInvalid(f"group {name!r}: `slots` must be a list")
            ranges = tuple(_parse_range(str(name), item) for item in slots)
            primary = members[0] if members else ""
            groups.append(ShardGroup(str(name), tuple(members), ranges, primary))
        return ShardTable(epoch, tuple(groups))


def owner_from_error(metadata: Mapping[str, str]) -> tuple[ShardGroup, int] | None:
    """The owner a WRONG_GROUP names (``group``, ``primary``, ``members``) and the epoch of
    the map it comes from; None when it names no address to go to."""
    name = metadata.get("group", "")
    members = tuple(m for m in metadata.get("members", "").split(",") if m)
    primary = metadata.get("primary", "")
    if not name or not (members or primary):
        return None
    epoch_text = metadata.get("map_epoch", "")
    epoch = int(epoch_text) if epoch_text.isascii() and epoch_text.isdigit() else 0
    return ShardGroup(name, members, (), primary), epoch


def after_wrong_group(
    before: ShardTable | None,
    newer: ShardTable | None,
    session_id: str,
    metadata: Mapping[str, str],
) -> tuple[ShardTable | None, ShardGroup | None]:
    """The map to keep and the owner to send a call to after a WRONG_GROUP refusal (with its
    ErrorInfo ``metadata``): ``newer`` (read from the server that refused) when its epoch is
    higher, then the owner the refusal names when the map still says otherwise, unless that
    word comes from a map older than the one kept (a server that has not read the newer map
    yet: its word would undo it); no owner (None) when neither names one."""
    table = (
        newer if newer is not None and (before is None or newer.epoch > before.epoch) else before
    )
    named = owner_from_error(metadata)
    if named is not None:
        group, epoch = named
        if table is None:
            return None, group
        if table.owner(session_id).name != group.name and epoch >= table.epoch:
            table = table.with_owner(session_id, group, epoch)
    if table is None:
        return None, None
    return table, table.owner(session_id)


def is_wrong_group(error: BaseException) -> bool:
    return getattr(error, "reason", None) == WRONG_GROUP


def _parse_range(group: str, item: object) -> tuple[int, int]:
    if isinstance(item, int) and not isinstance(item, bool):
        return item, item
    match = _RANGE.fullmatch(item) if isinstance(item, str) else None
    if match is None:
        raise ShardMapInvalid(f'group {group!r}: a slot range looks like "0-511" or "7"')
    first = int(match.group(1))
    return first, int(match.group(2) or first)


def _minus(ranges: Iterable[tuple[int, int]], slot: int) -> Iterable[tuple[int, int]]:
    for first, last in ranges:
        if first <= slot <= last:
            if first < slot:
                yield first, slot - 1
            if slot < last:
                yield slot + 1, last
        else:
            yield first, last


def _merged(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(last, out[-1][1]))
        else:
            out.append((first, last))
    return tuple(out)
