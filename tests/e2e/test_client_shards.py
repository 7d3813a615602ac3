"""The Python client's smart routing (``Client(..., shard_map="server")``) over two static groups
of real servers (``serve --shard-map FILE``): each call goes to the owner of its session, and a
call routed by an old map (the servers restarted with a newer one) is refused WRONG_GROUP, the
map reloaded and the call sent to the new owner once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionlog.shard.shardmap import ShardMap
from sessionlog.shard.slots import slot_of
from sessionlog_client import AsyncClient, Client, Retry, SessionLogError, event
from tests.e2e._proc import free_port, running_server


@dataclass
class Groups:
    folder: Path
    addresses: dict[str, str]
    stack: ExitStack

    def start(self, shard_map: ShardMap) -> None:
        path = self.folder / f"shards-{shard_map.epoch}.toml"
        path.write_text(shard_map.to_toml())
        for name, address in self.addresses.items():
            self.stack.enter_context(
                running_server(self.folder / name, listen=address, shard_map=str(path))
            )


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[Groups]:
    addresses = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    with ExitStack() as stack:
        yield Groups(tmp_path, addresses, stack)


def ids_in(shard_map: ShardMap, group: str, count: int) -> list[str]:
    found = (s for s in (f"route-{i}" for i in range(10_000)) if shard_map.owner(s).name == group)
    return [next(found) for _ in range(count)]


def test_calls_go_to_the_owner_and_a_wrong_group_reroutes_once(groups: Groups) -> None:
    """Client and AsyncClient over the same two groups, restarted once with a newer map."""
    asyncio.run(asyncio.wait_for(scenario(groups), 90))


async def scenario(groups: Groups) -> None:
    one = ShardMap.even_split({name: [a] for name, a in groups.addresses.items()}, epoch=1)
    groups.start(one)
    a, b = groups.addresses["a"], groups.addresses["b"]
    in_a, moving, async_moving = ids_in(one, "a", 3)
    (in_b,) = ids_in(one, "b", 1)
    user = event("user_message", {"content": "hi"})
    with (
        Client(a, shard_map="server", timeout=10) as client,
        Client(b, retry=Retry(wrong_group_for=0)) as plain_b,  # WRONG_GROUP raised at once
    ):
        aclient = AsyncClient(a, shard_map="server", timeout=10)
        epoch = client.shard_map.epoch if client.shard_map else 0
        assert epoch == 1
        for session in (in_a, in_b, moving):
            client.append(session, [user])
            assert [e.seq for e in client.since(session)] == [0]
        assert client.get_session(in_b).session.event_count == 1
        # in_b lives in group b: b has it, and a plain client to b sees it there.
        assert plain_b.get_session(in_b).session.exists
        with pytest.raises(SessionLogError) as refused:
            plain_b.get_session(in_a)
        assert refused.value.reason == "WRONG_GROUP"
        assert refused.value.metadata["group"] == "a"
        assert refused.value.metadata["primary"] == a

        stream = client.follow(moving)
        assert next(stream).seq == 0  # from a
        await aclient.append(in_b, [user])
        async with aclient.follow(in_b, 1) as events:
            assert (await anext(events)).seq == 1
        table = await aclient.shard_map()
        assert table is not None
        assert table.epoch == 1

        # A newer map gives two slots of a to b (their data stays behind: the move of data is
        # not the client's part); the servers restart with it, the clients still hold epoch 1.
        groups.stack.close()
        groups.start(one.with_slots([slot_of(moving), slot_of(async_moving)], "b"))
        reply = client.append(moving, [user])  # sent to a by the old map: WRONG_GROUP, then b
        assert reply.events[0].seq == 0  # a fresh session on b
        epoch = client.shard_map.epoch if client.shard_map else 0
        assert epoch == 2
        assert plain_b.get_session(moving).session.event_count == 1
        assert client.get_session(in_a).session.event_count == 1  # a still owns in_a
        client.append(moving, [user])
        # The open follow stream reconnects to a, is refused WRONG_GROUP, and goes on at b
        # from the seq after the last one it delivered.
        with stream:
            assert next(stream).seq == 1
        assert stream.reconnects >= 1

        # The asyncio client the same way: a by the old map, then b.
        reply = await aclient.append(async_moving, [user])
        assert reply.events[0].seq == 0
        table = await aclient.shard_map()
        assert table is not None
        assert table.epoch == 2
        assert [e.seq async for e in aclient.since(async_moving)] == [0]
        await aclient.close()
        assert plain_b.get_session(async_moving).session.event_count == 1
