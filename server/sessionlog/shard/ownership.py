"""Ownership: does this server's group own a session? The check every session RPC makes first.

    Ownership(sharded=False)          no --shard-map: every session is owned, nothing is checked
    Ownership(group=..., address=...) --shard-map: owned when the map gives the session's slot to
                                      my group; until a map is installed (etcd), nothing is

Invariants:

- The map only moves forward: ``install`` takes a map of a higher epoch than the one held and
  ignores an equal or lower one, so a late or replayed read cannot undo a newer move.
- A session is refused before anything is done for it: ``check`` raises WrongGroup (the owner's
  name, primary, members and the map's epoch in its metadata) or, while no map is held,
  ShardMapUnavailable.
- A fork stays within one group: its parent and its new session have one owner
  (``check_fork``).
- A frozen slot (the map's ``frozen``: a move under way, ``shard.move``) is read (on its
  owner) but not written: ``check_write`` raises SlotMoving for it, on every group.
  ``refusal`` asks the same inside the writer's transaction (``storage.writer``'s ``admits``),
  so a write checked against an older map cannot commit after a freeze took effect;
  ``settled_epoch`` is the epoch from which on that holds (``barrier``: every write checked
  against an older map has committed by then).
- Which group is mine is the ``--group`` name, else the group that lists my address as a member.
  A first map without my group is refused by ``install`` (ShardMapError) and changes nothing. A
  newer map that drops my group once I hold one is in force all the same, and my group then
  owns nothing (every session is WRONG_GROUP, naming its new owner): keeping the older map would
  leave this group writable for sessions the newer one gives to another.

Pure: no gRPC, no etcd, no clock. ``shard.source`` feeds maps from etcd; ``on_change`` callbacks
(the server wakes its follow streams, whose next read checks again) run after each install.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from sessionlog import errors, fold
from sessionlog.shard.shardmap import Group, ShardMap, ShardMapError
from sessionlog.shard.slots import SLOTS, slot_of

log = logging.getLogger(__name__)

WILDCARD_HOSTS = ("0.0.0.0", "[::]", "::", "")

MOVE_HEADER = "x-sessionlog-move"
"""ImportSession metadata (value ``copy``) of a slot move's copy (``shard.move``): with an admin
token, the session goes as it is (seqs, times, record, request records, lease) into a slot this
group does not own yet. See ``Ownership.check_copy``. (An Append with it and ``expected_seq``,
what movers before ImportSession sent, still copies events alone.)"""
MOVE_COPY = "copy"
FORK_ID_ATTEMPTS = 100_000
"""Random fork ids tried for one in my group's slots: owning one slot of 1,024, all of them
miss with a chance of about e^-97."""

PrimaryOf = Callable[[Group], str]
"""The address that takes a group's writes now ("" when unknown)."""


def static_primary(group: Group) -> str:
    """A static deployment's primary: the group's first member."""
    return group.primary


def from_file(path: str, group: str = "", address: str = "") -> Ownership:
    """The ownership of a static deployment (``--shard-map FILE``): the file's map installed;
    ShardMapError naming the file when it cannot be read, is not a valid map, or has no group
    of mine."""
    ownership = Ownership(group=group, address=address)
    shard_map = ShardMap.load(path)
    try:
        ownership.install(shard_map)
    except ShardMapError as exc:
        raise ShardMapError(f"{path}: {exc}") from None
    return ownership


class Ownership:
    """The shard map this server holds, and its group in it; see the module docstring."""

    def __init__(
        self,
        *,
        sharded: bool = True,
        group: str = "",
        address: str = "",
        primary_of: PrimaryOf = static_primary,
    ) -> None:
        self.sharded = sharded
        """False without --shard-map: one group owns everything and nothing is checked."""
        self._group_name = group
        self._address = address
        self.primary_of = primary_of
        self.map: ShardMap | None = None
        self._mine: Group | None = None
        self._former = ""
        """My group's name in the last map that had it (after a newer map dropped it)."""
        self._on_change: list[Callable[[ShardMap], None]] = []
        self._settled = 0
        self.barrier: Callable[[Callable[[], None]], None] | None = None
        """Set by the composition: ``barrier(done)`` calls ``done`` once every write queued
        before it has committed (a no-op through the writer); None: at once."""

    # --- what is held -------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The held map's epoch (0: unsharded, or no map yet)."""
        return self.map.epoch if self.map is not None else 0

    @property
    def settled_epoch(self) -> int:
        """The epoch of the held map once every write checked against an older one committed
        (what GetStats reports as map_epoch: a mover waits for it before its last copy)."""
        return self._settled if self.sharded else 0

    @property
    def group(self) -> str:
        """My group's name ("" unsharded; the --group name, or "" until a map names mine)."""
        if self._mine is not None:
            return self._mine.name
        return self._group_name or self._former

    @property
    def owned_slots(self) -> int:
        """How many slots my group owns (every slot unsharded; none while no map is held)."""
        if not self.sharded:
            return SLOTS
        return self._mine.slot_count if self._mine is not None else 0

    @property
    def ready(self) -> bool:
        """Sessions can be checked: unsharded, or a map with my group is held."""
        return not self.sharded or self._mine is not None

    def on_change(self, callback: Callable[[ShardMap], None]) -> None:
        """Call ``callback(new_map)`` after every map installed from now on."""
        self._on_change.append(callback)

    # --- changing -----------------------------------------------------------------------------

    def mine_in(self, shard_map: ShardMap) -> Group:
        """My group in ``shard_map``; ShardMapError saying why when it has none."""
        if self._group_name:
            return shard_map.group(self._group_name)
        found = shard_map.group_of_member(self._address) if self._address else None
        if found is None:
            names = ", ".join(g.name for g in shard_map.groups)
            raise ShardMapError(
                f"no group of the shard map (epoch {shard_map.epoch}: {names}) lists this "
                f"server's address {self._address or '(none)'} as a member: start it with "
                "--group NAME, or list its --advertise/--listen address under the group's members"
            )
        return found

    def misplaced(self, shard_map: ShardMap, mine: Group) -> str | None:
        """Why the --group name and this server's address disagree in ``shard_map`` (the map
        lists the address under another group, or the named group's members omit it), or None.
        The --group name wins; the disagreement is only reported, since the members a map lists
        are what routers and smart clients dial."""
        if not self._group_name or not self._address or self._address in mine.members:
            return None
        listed = shard_map.group_of_member(self._address)
        if listed is None and self._address.rpartition(":")[0] in WILDCARD_HOSTS:
            return None  # --listen 0.0.0.0:P without --advertise: no address to compare
        where = f"under group {listed.name!r}" if listed is not None else "under no group"
        return (
            f"--group is {mine.name!r}, but the shard map (epoch {shard_map.epoch}) lists this "
            f"server's address {self._address} {where}, not among {mine.name!r}'s members "
            f"({', '.join(mine.members)}): clients and routers reading the map will not find it"
        )

    def _warn_when_misplaced(self, shard_map: ShardMap, mine: Group) -> None:
        why = self.misplaced(shard_map, mine)
        if why is not None:
            log.warning(why, extra={"map_epoch": shard_map.epoch, "group": mine.name})

    def install(self, shard_map: ShardMap) -> bool:
        """Hold ``shard_map`` when its epoch is above the held one's (True); an equal or lower
        epoch changes nothing (False). ShardMapError, holding nothing new, when the map has no
        group of mine."""
        if self.map is not None and shard_map.epoch <= self.map.epoch:
            return False
        try:
            mine: Group | None = self.mine_in(shard_map)
        except ShardMapError as exc:
            if self.map is None:
                raise
            log.warning(
                "the newer shard map has no group of this server: it owns no session now",
                extra={"map_epoch": shard_map.epoch, "why": str(exc)},
            )
            mine = None
            self._former = self.group
        if mine is not None:
            self._warn_when_misplaced(shard_map, mine)
        self.map, self._mine = shard_map, mine
        epoch = shard_map.epoch

        def settle() -> None:
            self._settled = max(self._settled, epoch)

        if self.barrier is None:
            settle()
        else:
            self.barrier(settle)
        for callback in self._on_change:
            try:
                callback(shard_map)
            except Exception:
                log.exception("a shard map change callback failed")
        return True

    # --- the checks ---------------------------------------------------------------------------

    def check(self, *session_ids: str) -> None:
        """Raise unless my group owns every one of ``session_ids``."""
        if not self.sharded:
            return
        shard_map, mine = self.map, self._mine
        if shard_map is None:
            raise self.unavailable()
        for session_id in session_ids:
            # Not an id at all (too long, ...): INVALID_SESSION_ID, as its owner would say; a
            # WRONG_GROUP would echo it in trailers past the client's metadata limit.
            fold.check_session_id(session_id)
            slot = slot_of(session_id)
            owner = shard_map.owner_of_slot(slot)
            if mine is None or owner.name != mine.name:
                raise self._wrong_group(session_id, slot, owner, shard_map.epoch)

    def check_write(self, *session_ids: str) -> None:
        """``check`` for a write: SlotMoving (retried by clients) for a session whose slot is
        frozen (being moved), on its owner and on any other group alike: a client whose map
        already names the slot's next owner waits there until the flip reaches it."""
        for session_id in session_ids:
            if self.sharded:
                fold.check_session_id(session_id)  # INVALID_SESSION_ID first, as in ``check``
            refusal = self.refusal(session_id)
            if refusal is not None:
                raise refusal

    def refusal(self, session_id: str) -> errors.SessionLogError | None:
        """Why a write to ``session_id`` may not commit now (None: it may): another group owns
        it, its slot is frozen, or no map is held. Safe to call from the writer's thread."""
        if not self.sharded:
            return None
        shard_map, mine = self.map, self._mine
        if shard_map is None:
            return self.unavailable()
        slot = slot_of(session_id)
        owner = shard_map.owner_of_slot(slot)
        if shard_map.is_frozen(slot):
            return errors.SlotMoving(
                f"session '{session_id}' (slot {slot}) is being moved to another group: its "
                f"writes pause until the move's last copy is done (shard map epoch "
                f"{shard_map.epoch}); retry shortly",
                session_id=session_id,
                slot=slot,
                map_epoch=shard_map.epoch,
            )
        if mine is None or owner.name != mine.name:
            return self._wrong_group(session_id, slot, owner, shard_map.epoch)
        return None

    def check_copy(self, session_id: str, expected_seq: int | None) -> None:
        """A move's copy (MOVE_HEADER) may only fill a session whose slot another group owns
        (the slot's next owner takes it before the map gives it the slot), at a given seq."""
        if not self.sharded:
            raise errors.FailedPrecondition(
                "a slot move's copy goes to a server with --shard-map etcd; this one is not sharded"
            )
        if self.map is None or self._mine is None:
            raise self.unavailable()
        if self.owns(session_id):
            raise errors.SlotOwned(
                f"session '{session_id}' (slot {slot_of(session_id)}) is owned by this group "
                f"'{self.group}' (shard map epoch {self.epoch}): a move's copy only fills a "
                "group before the map gives it the slot",
                session_id=session_id,
                slot=slot_of(session_id),
                group=self.group,
                map_epoch=self.epoch,
            )
        if expected_seq is None:
            raise errors.MalformedRequest(
                "a slot move's copy names the seq its first event takes (expected_seq)"
            )

    def check_fork(self, source: str, target: str) -> None:
        """Raise unless my group owns ``source`` and ``target`` lies in the same group."""
        self.check(source)
        if not self.sharded or self.map is None:
            return
        source_slot, target_slot = slot_of(source), slot_of(target)
        target_group = self.map.owner_of_slot(target_slot)
        if target_group.name != self.group:
            raise errors.CrossGroupFork(
                f"cannot fork session '{source}' (slot {source_slot}, group '{self.group}') "
                f"into '{target}' (slot {target_slot}, group '{target_group.name}'): a fork "
                "stays within its parent's group; pick a new id whose slot the parent's group "
                "owns",
                source_slot=source_slot,
                source_group=self.group,
                target_slot=target_slot,
                target_group=target_group.name,
                map_epoch=self.map.epoch,
            )
        refusal = self.refusal(target)  # the new session is written: not in a frozen slot
        if refusal is not None:
            raise refusal

    def fork_id(self, prefix: str = "") -> str:
        """The id of a fork whose caller named none: unsharded, "" (the store makes one up)
        or, given a tenant token's ``prefix``, a new ``<prefix>fork-<uuid>`` (a made-up id
        outside the prefix would be refused to the caller); sharded, a new
        ``<prefix>fork-<uuid>`` whose slot my group owns, so that the fork stays in its
        parent's group (a made-up id anywhere would name another group's slot)."""
        if not self.sharded:
            return f"{prefix}fork-{uuid.uuid4().hex}" if prefix else ""
        mine = self._mine
        if mine is None:
            raise self.unavailable()
        for _ in range(FORK_ID_ATTEMPTS):
            candidate = f"{prefix}fork-{uuid.uuid4().hex}"
            if mine.owns_slot(slot_of(candidate)):
                return candidate
        raise errors.CrossGroupFork(  # only when my group owns no slot
            f"group '{mine.name}' owns no slot, so a fork made here would lie in another "
            "group; fork on the group that owns the parent",
            source_group=mine.name,
            map_epoch=self.epoch,
        )

    def owns(self, session_id: str) -> bool:
        """My group owns ``session_id`` now (always unsharded; never while no map is held)."""
        if not self.sharded:
            return True
        mine = self._mine
        return mine is not None and mine.owns_slot(slot_of(session_id))

    def owns_slot(self, slot: int) -> bool:
        """My group owns ``slot`` now (always unsharded; never while no map is held)."""
        if not self.sharded:
            return True
        mine = self._mine
        return mine is not None and mine.owns_slot(slot)

    def unavailable(self) -> errors.ShardMapUnavailable:
        held = f" (the map at epoch {self.epoch} has no group of mine)" if self.map else ""
        return errors.ShardMapUnavailable(
            "this server has not read a shard map with its group yet"
            f"{held}, so it cannot tell which sessions it owns; retry shortly",
            map_epoch=self.epoch,
        )

    def _wrong_group(
        self, session_id: str, slot: int, owner: Group, epoch: int
    ) -> errors.WrongGroup:
        primary = self.primary_of(owner)
        where = f"; its primary is {primary}" if primary else ""
        return errors.WrongGroup(
            f"session '{session_id}' (slot {slot}) belongs to group '{owner.name}', not to "
            f"'{self.group}' (shard map epoch {epoch}){where}: send the call there",
            session_id=session_id,
            slot=slot,
            group=owner.name,
            primary=primary,
            members=",".join(owner.members),
            map_epoch=epoch,
        )
