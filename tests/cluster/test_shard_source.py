"""--shard-map etcd's poller (shard.source) against a real etcd: whatever the key holds, or
etcd not answering, the poll survives, keeps the map it holds, and says so once."""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

from sessionlog.cluster.etcd import Endpoints
from sessionlog.shard import ShardMap
from sessionlog.shard.ownership import Ownership
from sessionlog.shard.shardmap import SHARDS_KEY
from sessionlog.shard.source import EtcdShardMap
from tests.cluster._etcd import EtcdProcess

ME = "127.0.0.1:50051"


@pytest.mark.serial  # a 1 s etcd call against a SIGSTOPped etcd (seen answered at load 10)
def test_a_damaged_lower_or_unreachable_map_keeps_the_held_one(
    etcd: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sessionlog.shard.source")
    good = ShardMap.even_split({"g1": [ME], "g2": ["127.0.0.1:50061"]}, epoch=5)
    older = ShardMap.even_split({"g1": [ME], "g2": ["127.0.0.1:50061"]}, epoch=3)
    direct = Endpoints((etcd.endpoint,), 2.0)

    def warnings() -> list[str]:
        found = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        return found

    def said_once(words: str) -> None:
        said = warnings()
        assert len(said) == 1, said  # once, not once per poll
        assert words in said[0], said

    async def scenario() -> None:
        ownership = Ownership(address=ME)
        source = EtcdShardMap(ownership, (etcd.endpoint,))
        try:
            direct.put(SHARDS_KEY, b"[" * 100_000, 0)  # nested past json's recursion limit
            await source.poll()
            await source.poll()
            assert ownership.map is None
            said_once("not usable")

            direct.put(SHARDS_KEY, good.to_json().encode(), 0)
            await source.poll()
            assert ownership.epoch == 5
            assert not warnings()

            for damaged in (b"\xff\xfe binary", b'{"epoch": ' + b"9" * 5000 + b"}"):
                direct.put(SHARDS_KEY, damaged, 0)
                await source.poll()
                assert ownership.epoch == 5
                said_once("keeping the map at epoch 5")

            direct.put(SHARDS_KEY, older.to_json().encode(), 0)
            await source.poll()
            await source.poll()
            assert ownership.epoch == 5
            said_once("below the held map's 5")

            etcd.signal(signal.SIGSTOP)  # etcd hangs: a poll times out, the map stays
            try:
                await asyncio.wait_for(source.poll(), timeout=10)
            finally:
                etcd.signal(signal.SIGCONT)
            assert ownership.epoch == 5
            assert ownership.owns("s1") == (good.owner("s1").name == "g1")
            assert any("cannot read the shard map" in line for line in warnings())
        finally:
            await source.stop()
            direct.close()

    asyncio.run(scenario())
