"""The shard map from etcd (``--shard-map etcd``): polled, installed when newer.

Every POLL_SECONDS one etcd transaction reads the map (SHARDS_KEY, JSON) and the leader key of
every group it names (``/sessionlog/groups/NAME/leader``, the key ``cluster.election`` writes):
the map goes to ``Ownership.install`` (a higher epoch replaces the held map, an equal or lower
one is ignored) and the leaders become the ``primary`` a WRONG_GROUP error and GetShardMap name,
so they are at most one poll old.

A key that is absent, not a valid map, or without this server's group installs nothing: the
server keeps what it holds (before the first valid map, every session RPC is
SHARD_MAP_UNAVAILABLE), and says so in one log line per distinct problem. etcd not answering
changes nothing either: the map held stays in force (a map only changes by an operator's put).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sessionlog.cluster import etcd
from sessionlog.cluster.members import GroupKeys
from sessionlog.cluster.settings import Endpoint
from sessionlog.shard.ownership import Ownership
from sessionlog.shard.shardmap import SHARDS_KEY, Group, ShardMap, ShardMapError

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
CALL_TIMEOUT_SECONDS = 1.0


class EtcdShardMap:
    """Keeps ``ownership`` at etcd's map and knows each group's current leader."""

    def __init__(
        self,
        ownership: Ownership,
        endpoints: tuple[Endpoint, ...],
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.ownership = ownership
        self.poll_seconds = poll_seconds
        self._etcd = etcd.Etcd(endpoints, CALL_TIMEOUT_SECONDS, "shards")
        self._leaders: dict[str, str] = {}
        self._problem = ""
        self._task: asyncio.Task[None] | None = None
        ownership.primary_of = self.primary_of

    def primary_of(self, group: Group) -> str:
        """The group's leader as last read from etcd ("" when it has none, or not read yet)."""
        return self._leaders.get(group.name, "")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._etcd.close()

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as exc:  # one bad poll must not stop every later one
                self._say(f"reading the shard map from etcd failed: {exc!r}"[:300])
            await asyncio.sleep(self.poll_seconds)

    async def poll(self) -> None:
        """One read of the map and the leaders (a second one when the map just installed names
        other groups, so that their leaders are known at once); problems are logged, never
        raised."""
        names = await self._read()
        held = self.ownership.map
        if held is not None and names is not None and names != [g.name for g in held.groups]:
            await self._read()

    async def _read(self) -> list[str] | None:
        """One transaction: the map, and the leaders of the groups of the map held before it;
        the groups whose leaders it read (None when etcd did not answer)."""
        held = self.ownership.map
        names = [g.name for g in held.groups] if held is not None else []
        body = {
            "compare": [],
            "success": [
                etcd.request_range(SHARDS_KEY),
                *(etcd.request_range(GroupKeys(name).leader) for name in names),
            ],
        }
        try:
            _, _, reply = await self._etcd.call(lambda e: e.txn(body))
        except (etcd.EtcdUnavailable, etcd.EtcdError) as exc:
            self._say(f"cannot read the shard map from etcd: {exc}")
            return None
        found = etcd.txn_ranges(reply)
        self._leaders = {
            name: kv.value.decode(errors="replace")
            for name, kv in zip(names, found[1:], strict=False)
            if kv is not None
        }
        self._take(found[0] if found else None)
        return names

    def _take(self, kv: etcd.KeyValue | None) -> None:
        held = self.ownership.map
        keeping = (
            f"keeping the map at epoch {held.epoch}"
            if held is not None
            else "sessions are unavailable"
        )
        if kv is None:
            self._say(f"no shard map in etcd (key {SHARDS_KEY}): {keeping}")
            return
        try:
            shard_map = ShardMap.from_json(kv.value)
            installed = self.ownership.install(shard_map)
        except ShardMapError as exc:
            self._say(f"the shard map in etcd ({SHARDS_KEY}) is not usable: {exc}; {keeping}")
            return
        if held is not None and shard_map.epoch < held.epoch:
            self._say(
                f"the shard map in etcd ({SHARDS_KEY}) has epoch {shard_map.epoch}, below the "
                f"held map's {held.epoch}: ignored (put a map with a higher epoch)"
            )
            return
        self._problem = ""
        if installed:
            log.info(
                "shard map installed",
                extra={
                    "map_epoch": shard_map.epoch,
                    "group": self.ownership.group,
                    "owned_slots": self.ownership.owned_slots,
                },
            )

    def _say(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            log.warning(problem)
