"""The Python client's smart routing with the map from etcd (``shard_map="etcd://..."``): it
reads ``/sessionlog/shards`` (the JSON ``sessionlog cluster map put`` writes) from a real etcd
and sends each call to the owner among two static groups of real servers."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests

from sessionlog.shard.shardmap import SHARDS_KEY, ShardMap
from sessionlog.shard.slots import slot_of
from sessionlog_client import AsyncClient, Client, errors, event
from tests.cluster._etcd import EtcdProcess
from tests.e2e._proc import free_port
from tests.e2e.test_client_shards import Groups, ids_in


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Groups]:
    addresses = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    with ExitStack() as stack:
        yield Groups(tmp_path, addresses, stack)


def put(etcd: EtcdProcess, key: str, value: str) -> None:
    body = {
        "key": base64.b64encode(key.encode()).decode(),
        "value": base64.b64encode(value.encode()).decode(),
    }
    reply = requests.post(f"http://{etcd.endpoint}/v3/kv/put", json=body, timeout=5)
    reply.raise_for_status()


def test_the_map_is_read_from_etcd(etcd: EtcdProcess, groups: Groups) -> None:
    shard_map = ShardMap.even_split({name: [a] for name, a in groups.addresses.items()}, epoch=3)
    groups.start(shard_map)
    a, b = groups.addresses["a"], groups.addresses["b"]
    with Client(a, shard_map=f"etcd://{etcd.endpoint}", timeout=10) as absent:
        assert absent.shard_map is None  # no key yet: no routing by slot
    put(etcd, SHARDS_KEY, shard_map.to_json())
    (in_b,) = ids_in(shard_map, "b", 1)
    with Client(a, shard_map=f"etcd://{etcd.endpoint}", timeout=10) as client, Client(b) as plain:
        client.append(in_b, [event("user_message", {"content": "hi"})])
        table = client.shard_map
        assert table is not None
        assert (table.epoch, table.owner(in_b).name) == (3, "b")
        assert plain.get_session(in_b).session.event_count == 1


def test_a_damaged_key_during_a_refresh_leaves_the_wrong_group_error(
    etcd: EtcdProcess, groups: Groups
) -> None:
    """The servers hold epoch 3; etcd held epoch 9 (the session's slot moved to a) when the
    client loaded it, and is damaged by the time a's WRONG_GROUP makes the client read it
    again. The caller gets that WRONG_GROUP (errors.WrongGroup), not the client's parse error;
    and the servers' older word does not undo the client's epoch 9."""
    servers = ShardMap.even_split({name: [a] for name, a in groups.addresses.items()}, epoch=3)
    groups.start(servers)
    (in_b,) = ids_in(servers, "b", 1)
    ahead = ShardMap(9, servers.with_slots([slot_of(in_b)], to="a").groups)
    put(etcd, SHARDS_KEY, ahead.to_json())
    user = event("user_message", {"content": "hi"})
    with Client(groups.addresses["b"], shard_map=f"etcd://{etcd.endpoint}", timeout=10) as client:
        table = client.shard_map
        assert table is not None
        assert table.owner(in_b).name == "a"
        put(etcd, SHARDS_KEY, "[" * 100_000)
        with pytest.raises(errors.WrongGroup):
            client.append(in_b, [user])
        assert client.shard_map is not None
        assert (client.shard_map.epoch, client.shard_map.owner(in_b).name) == (9, "a")

    async def with_async_client() -> None:
        put(etcd, SHARDS_KEY, ahead.to_json())
        address = groups.addresses["b"]
        async with AsyncClient(address, shard_map=f"etcd://{etcd.endpoint}", timeout=10) as aio:
            assert await aio.shard_map() is not None
            put(etcd, SHARDS_KEY, "[" * 100_000)
            with pytest.raises(errors.WrongGroup):
                await aio.append(in_b, [user])

    asyncio.run(asyncio.wait_for(with_async_client(), 60))
