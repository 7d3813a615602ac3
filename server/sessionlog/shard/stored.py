"""The shard map as etcd holds it (SHARDS_KEY, JSON): one reading and one compare-and-put for the
commands that change it (`map put`, `move-slot`) and the ones that follow it (`haproxy-sync`).

The servers read it in ``shard.source``, in one transaction with the groups' leader keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessionlog.shard.shardmap import SHARDS_KEY, ShardMap, ShardMapError

if TYPE_CHECKING:
    from sessionlog.cluster import etcd


def read(endpoints: etcd.Endpoints) -> tuple[ShardMap | None, int]:
    """The stored map (None: no key) and the key's mod revision (0: absent). ShardMapError,
    naming the key, when the value is not a valid map; EtcdUnavailable / EtcdError from etcd."""
    found, _ = endpoints.get(SHARDS_KEY)
    if found is None:
        return None, 0
    return decode(found.value), found.mod_revision


def decode(value: bytes) -> ShardMap:
    try:
        return ShardMap.from_json(value)
    except ShardMapError as exc:
        raise ShardMapError(f"the map stored at {SHARDS_KEY} is not valid: {exc}") from exc


def put(endpoints: etcd.Endpoints, shard_map: ShardMap, revision: int) -> bool:
    """Store ``shard_map`` if the key was last written at ``revision`` (0: it is absent); False
    when someone changed it since."""
    from sessionlog.cluster import etcd

    done, _, _ = endpoints.txn(
        {
            "compare": [etcd.compare_modified(SHARDS_KEY, revision)],
            "success": [etcd.request_put(SHARDS_KEY, shard_map.to_json().encode())],
        }
    )
    return done
