"""The shard map: which group owns which slots, at which epoch.

A map names every group once, with its members (``HOST:PORT``, the addresses clients dial) and the
slot ranges it owns; together the ranges cover every slot exactly once. The epoch grows by one with
every change, so a server, router or client holding two maps keeps the newer one and never goes
back. A group's primary is its first member in a static deployment; in cluster mode it is whoever
holds the group's leader key in etcd.

The map is written as TOML for static deployments (``--shard-map FILE``)::

    epoch = 1

    [groups.g1]
    members = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
    http = ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]   # optional: their --http-listen
    slots = ["0-511"]

    [groups.g2]
    members = ["10.0.1.1:50051", "10.0.1.2:50051", "10.0.1.3:50051"]
    slots = ["512-1023"]

A map may also list slots whose writes are paused while they move to another group
(``sessionlog cluster move-slot``, ``shard.move``)::

    frozen = ["17"]

The owner of a frozen slot still serves its reads but refuses its writes (SLOT_MOVING, retried by
the clients) until a map of a higher epoch gives the slot to the new owner unfrozen.

``http`` lists each member's ``--http-listen`` address in the same order: the HAProxy
configuration (``sessionlog cluster haproxy``) health-checks ``/primary`` and ``/healthz`` there.
The map is also written as JSON, the same fields, under etcd's ``/sessionlog/shards`` key
(SHARDS_KEY) in cluster mode.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tomli_w

from sessionlog.shard.slots import SLOTS, slot_of

SHARDS_KEY = "/sessionlog/shards"
"""The etcd key that holds the cluster's shard map (JSON) in cluster mode."""

_GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""The same names as ``--group`` (cluster.settings): a cluster group is a shard map group."""
_ADDRESS = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})")
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")
"""Matched whole (``fullmatch``): ``$`` would let a trailing newline through, into a name that
haproxy.cfg then carries."""
MAX_EPOCH = (1 << 63) - 1
"""The highest epoch: GetShardMap carries it as a uint64, and the Go and etcd sides as int64."""
MAX_MAP_BYTES = 4 << 20
"""A map file larger than this is refused unread (a map of a thousand groups is ~100 KB)."""


def is_address(text: str) -> bool:
    """``text`` is ``HOST:PORT`` (``[v6]:PORT`` for IPv6), port 1-65535, nothing around it."""
    match = _ADDRESS.fullmatch(text)
    return match is not None and 0 < int(match.group(2)) < 65536


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (TOML refuses it too): a map with a group
    named twice must not quietly keep the last one."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"key {key!r} is given twice in one object")
        found[key] = value
    return found


class ShardMapError(ValueError):
    """The map is not valid; the message says which field and why."""


@dataclass(frozen=True)
class Group:
    """One group: its name, its members (the first is the static primary) and its slot ranges."""

    name: str
    members: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]
    """Inclusive (first, last) slot ranges, sorted and not touching one another."""
    http: tuple[str, ...] = ()
    """The members' --http-listen addresses, in the members' order; empty when not given."""

    @property
    def primary(self) -> str:
        """The static primary: the first member."""
        return self.members[0]

    @property
    def slot_count(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)

    def owns_slot(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.ranges)

    def range_text(self) -> list[str]:
        """The ranges as the map writes them: ``"0-511"``, or ``"7"`` for one slot."""
        return [f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranges]


@dataclass(frozen=True)
class ShardMap:
    """A valid map: every slot owned by exactly one group, at one epoch (at least 1)."""

    epoch: int
    groups: tuple[Group, ...]
    frozen: frozenset[int] = frozenset()
    """Slots being moved: their owner serves reads but refuses writes (SLOT_MOVING)."""

    def __post_init__(self) -> None:
        _validate(self.epoch, self.groups)
        object.__setattr__(self, "frozen", frozenset(self.frozen))
        for slot in self.frozen:
            if not 0 <= slot < SLOTS:
                raise ShardMapError(f"frozen slot {slot} is outside 0-{SLOTS - 1}")
        owners: list[int] = [-1] * SLOTS
        for index, group in enumerate(self.groups):
            for first, last in group.ranges:
                for slot in range(first, last + 1):
                    owners[slot] = index
        object.__setattr__(self, "_owners", bytes(owners) if len(self.groups) < 256 else owners)

    # --- reading -----------------------------------------------------------------------------

    def group(self, name: str) -> Group:
        """The group called ``name``; ShardMapError when the map has none."""
        for group in self.groups:
            if group.name == name:
                return group
        known = ", ".join(g.name for g in self.groups)
        raise ShardMapError(f"the shard map (epoch {self.epoch}) has no group {name!r} ({known})")

    def has_group(self, name: str) -> bool:
        return any(group.name == name for group in self.groups)

    def owner_of_slot(self, slot: int) -> Group:
        if not 0 <= slot < SLOTS:
            raise ShardMapError(f"slot {slot} is outside 0-{SLOTS - 1}")
        owners: Sequence[int] = self._owners  # type: ignore[attr-defined]
        return self.groups[owners[slot]]

    def owner(self, session_id: str) -> Group:
        """The group that owns ``session_id``'s slot."""
        return self.owner_of_slot(slot_of(session_id))

    def is_frozen(self, slot: int) -> bool:
        """The slot's writes are paused (it is being moved)."""
        return slot in self.frozen

    def group_of_member(self, address: str) -> Group | None:
        """The group that lists ``address`` as a member, or None."""
        for group in self.groups:
            if address in group.members:
                return group
        return None

    # --- changing (a new map, one epoch up) ---------------------------------------------------

    def with_slots(self, slots: Iterable[int], to: str) -> ShardMap:
        """This map with ``slots`` owned by group ``to`` and no longer frozen, at epoch + 1."""
        target = self.group(to)
        moving = set(slots)
        for slot in moving:
            if not 0 <= slot < SLOTS:
                raise ShardMapError(f"slot {slot} is outside 0-{SLOTS - 1}")
        groups = []
        for group in self.groups:
            owned = {s for a, b in group.ranges for s in range(a, b + 1)}
            owned = owned | moving if group.name == target.name else owned - moving
            groups.append(Group(group.name, group.members, _ranges_of(owned), group.http))
        return ShardMap(self.epoch + 1, tuple(groups), self.frozen - moving)

    def with_frozen(self, slots: Iterable[int]) -> ShardMap:
        """This map with ``slots`` frozen too (their writes paused), at epoch + 1."""
        return ShardMap(self.epoch + 1, self.groups, self.frozen | set(slots))

    @staticmethod
    def even_split(
        members: Mapping[str, Sequence[str]],
        epoch: int = 1,
        http: Mapping[str, Sequence[str]] | None = None,
    ) -> ShardMap:
        """Groups in the order given, each owning one contiguous, near-equal share of the slots."""
        names = list(members)
        if not names:
            raise ShardMapError("a shard map needs at least one group")
        groups = []
        for index, name in enumerate(names):
            first = index * SLOTS // len(names)
            last = (index + 1) * SLOTS // len(names) - 1
            checks = tuple((http or {}).get(name, ()))
            groups.append(Group(name, tuple(members[name]), ((first, last),), checks))
        return ShardMap(epoch, tuple(groups))

    # --- text forms ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"epoch": self.epoch}
        if self.frozen:
            data["frozen"] = [f"{a}" if a == b else f"{a}-{b}" for a, b in _ranges_of(self.frozen)]
        data["groups"] = {
            g.name: {"members": list(g.members), "slots": g.range_text()}
            | ({"http": list(g.http)} if g.http else {})
            for g in self.groups
        }
        return data

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_dict(data: object) -> ShardMap:
        if not isinstance(data, dict):
            raise ShardMapError("a shard map is a table with `epoch` and `groups`")
        unknown = set(data) - {"epoch", "groups", "frozen"}
        if unknown:
            raise ShardMapError(f"unknown shard map key(s): {', '.join(sorted(unknown))}")
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ShardMapError("`epoch` must be an integer of at least 1")
        raw_groups = data.get("groups")
        if not isinstance(raw_groups, dict) or not raw_groups:
            raise ShardMapError("`groups` must be a table of at least one group")
        groups = []
        for name, body in raw_groups.items():
            if not isinstance(body, dict):
                raise ShardMapError(f"group {name!r}: a table with `members` and `slots`")
            extra = set(body) - {"members", "slots", "http"}
            if extra:
                raise ShardMapError(f"group {name!r}: unknown key(s) {', '.join(sorted(extra))}")
            members = body.get("members")
            if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                raise ShardMapError(f"group {name!r}: `members` must be a list of HOST:PORT")
            slots = body.get("slots")
            if not isinstance(slots, list) or not all(isinstance(s, str | int) for s in slots):
                raise ShardMapError(f'group {name!r}: `slots` must be a list like ["0-511"]')
            http = body.get("http", [])
            if not isinstance(http, list) or not all(isinstance(h, str) for h in http):
                raise ShardMapError(f"group {name!r}: `http` must be a list of HOST:PORT")
            ranges = _parse_ranges(f"group {str(name)!r}", slots)
            groups.append(Group(str(name), tuple(members), ranges, tuple(http)))
        frozen = data.get("frozen", [])
        if not isinstance(frozen, list) or not all(isinstance(s, str | int) for s in frozen):
            raise ShardMapError('`frozen` must be a list of slots like ["17"]')
        paused = {s for a, b in _parse_ranges("`frozen`", frozen) for s in range(a, b + 1)}
        return ShardMap(epoch, tuple(groups), frozenset(paused))

    @staticmethod
    def from_toml(text: str) -> ShardMap:
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
            # RecursionError: nested past the parser's limit; ValueError: an integer past
            # int()'s digit limit. Either way not a map, and never an uncaught error.
            raise ShardMapError(f"not valid TOML: {exc}") from None
        return ShardMap.from_dict(data)

    @staticmethod
    def from_json(text: str | bytes) -> ShardMap:
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys)
        except (RecursionError, ValueError) as exc:
            # ValueError covers JSONDecodeError, UnicodeDecodeError and an integer past int()'s
            # digit limit; RecursionError, nesting past the parser's: etcd's key may hold any
            # bytes, and the poller must survive them (shard.source).
            raise ShardMapError(f"not valid JSON: {str(exc)[:200]}") from None
        return ShardMap.from_dict(data)

    @staticmethod
    def load(path: str) -> ShardMap:
        """Read a TOML map file; ShardMapError names the file when it is missing or invalid."""
        try:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_MAP_BYTES + 1)
        except OSError as exc:
            raise ShardMapError(f"cannot read the shard map {path}: {exc.strerror}") from exc
        if len(raw) > MAX_MAP_BYTES:
            raise ShardMapError(f"{path}: larger than {MAX_MAP_BYTES} bytes: not a shard map")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ShardMapError(
                f"{path}: not UTF-8 text (byte {exc.start}): not a TOML map"
            ) from None
        try:
            return ShardMap.from_toml(text)
        except ShardMapError as exc:
            raise ShardMapError(f"{path}: {exc}") from exc


def _parse_ranges(where: str, items: Sequence[str | int]) -> tuple[tuple[int, int], ...]:
    owned: set[int] = set()
    for item in items:
        match = _RANGE.fullmatch(str(item).strip())
        if not match:
            raise ShardMapError(f"{where}: {item!r} is not a slot or a range like 0-511")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if first > last or last >= SLOTS:
            raise ShardMapError(f"{where}: range {item!r} is not within 0-{SLOTS - 1}")
        overlap = owned & set(range(first, last + 1))
        if overlap:
            raise ShardMapError(f"{where}: slot {min(overlap)} is listed twice")
        owned.update(range(first, last + 1))
    return _ranges_of(owned)


def _ranges_of(slots: Iterable[int]) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for slot in sorted(set(slots)):
        if ranges and ranges[-1][1] == slot - 1:
            ranges[-1] = (ranges[-1][0], slot)
        else:
            ranges.append((slot, slot))
    return tuple(ranges)


def _validate(epoch: int, groups: Sequence[Group]) -> None:
    if epoch < 1:
        raise ShardMapError(f"`epoch` must be at least 1, not {epoch}")
    if epoch > MAX_EPOCH:
        raise ShardMapError(f"`epoch` must be at most {MAX_EPOCH}, not {epoch}")
    if not groups:
        raise ShardMapError("a shard map needs at least one group")
    seen_names: set[str] = set()
    seen_members: dict[str, str] = {}
    owner: dict[int, str] = {}
    for group in groups:
        if not _GROUP_NAME.fullmatch(group.name):
            raise ShardMapError(
                f"group name {group.name!r}: letters, digits, '.', '_' and '-', 1-63 characters"
            )
        if group.name in seen_names:
            raise ShardMapError(f"group {group.name!r} is listed twice")
        seen_names.add(group.name)
        if not group.members:
            raise ShardMapError(f"group {group.name!r} has no members")
        for member in group.members:
            if not is_address(member):
                raise ShardMapError(f"group {group.name!r}: member {member!r} is not HOST:PORT")
            if member in seen_members:
                raise ShardMapError(
                    f"member {member} is in group {seen_members[member]!r} and {group.name!r}"
                )
            seen_members[member] = group.name
        if group.http and len(group.http) != len(group.members):
            raise ShardMapError(
                f"group {group.name!r}: `http` lists {len(group.http)} addresses for "
                f"{len(group.members)} members (one per member, in the same order)"
            )
        for check in group.http:
            if not is_address(check):
                raise ShardMapError(
                    f"group {group.name!r}: http address {check!r} is not HOST:PORT"
                )
        for first, last in group.ranges:
            for slot in range(first, last + 1):
                if slot in owner:
                    raise ShardMapError(
                        f"slot {slot} is owned by both {owner[slot]!r} and {group.name!r}"
                    )
                owner[slot] = group.name
    missing = [slot for slot in range(SLOTS) if slot not in owner]
    if missing:
        ranges = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in _ranges_of(missing))
        raise ShardMapError(f"slots {ranges} are owned by no group (every slot needs one)")
