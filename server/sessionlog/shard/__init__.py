"""Sharding: sessions placed on groups by slot, a shard map that says which group owns which
slots, and the check every server makes that a call's session belongs to its group.

    slots.py      slot_of(session_id), SLOTS, the x-session-id header
    shardmap.py   ShardMap: groups, their members, slot ranges, an epoch; TOML and JSON forms
    ownership.py  Ownership: the map a server holds, its group, the check every session RPC makes
    source.py     EtcdShardMap: --shard-map etcd, the map and each group's leader polled from etcd
    haproxy.py    `sessionlog cluster haproxy`: HAProxy's haproxy.cfg and slots.map from a map
    scatter.py    Scatter: ListSessions across groups (fan out to every group, merge by id)
    stored.py     the map as etcd holds it: read, and a compare-and-put (map put, move-slot)
    feeds.py      every group's change feed with a cursor per group (`tail --every-group`)
"""

from sessionlog.shard.shardmap import Group, ShardMap, ShardMapError
from sessionlog.shard.slots import SESSION_HEADER, SLOTS, slot_of

__all__ = ["SESSION_HEADER", "SLOTS", "Group", "ShardMap", "ShardMapError", "slot_of"]
