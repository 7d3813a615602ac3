"""The blocking client is generated from the asyncio client by client/python/gen_sync.py: the
rewrite rules, the docstrings and hand-written members the blocking client keeps, a change to
async code reaching its blocking twin (streams and shard routing included), a hand edit
undone, a name left async stopping the generation, the helper pair both sides call, and
today's _sync.py fresh."""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))

import gen_sync  # noqa: E402
import pytest  # noqa: E402

from sessionlog_client import AsyncClient, Client  # noqa: E402


def test_the_rules_turn_async_code_into_blocking_code() -> None:
    source = (
        "async def f(self) -> AsyncIterator[AsyncClient]:\n"
        "    async with self._lock:\n"
        "        await asyncio.sleep(1)\n"
        "    async for page in self.pages():\n"
        "        yield page\n"
        "    stream.aclose()\n"
        "    return await self.__aenter__()\n"
    )
    assert gen_sync.unasync(source) == (
        "def f(self) -> Iterator[Client]:\n"
        "    with self._lock:\n"
        "        time.sleep(1)\n"
        "    for page in self.pages():\n"
        "        yield page\n"
        "    stream.close()\n"
        "    return self.__enter__()\n"
    )


def test_the_parentheses_of_an_await_go_with_it_only_around_a_primary() -> None:
    assert gen_sync.unasync("n = (await self.surface(s, t=(1, 2))).event_count\n") == (
        "n = self.surface(s, t=(1, 2)).event_count\n"
    )
    assert gen_sync.unasync("x = (await self.get(s))[0]\n") == "x = self.get(s)[0]\n"
    # Without them `c and (a or b)` would read `c and a or b`.
    assert gen_sync.unasync("x = c and (await a or b)\n") == "x = c and (a or b)\n"


def test_the_sync_client_is_what_the_generator_makes() -> None:
    """_sync.py is fresh: today's _aio.py rewritten."""
    assert gen_sync.rendered() == gen_sync.TARGET.read_bytes()


def test_every_generated_method_is_a_blocking_method_of_both_clients() -> None:
    twins = {
        gen_sync.unasync(name): name
        for name, value in vars(AsyncClient).items()
        if inspect.isfunction(value) or isinstance(value, property)
    }
    hand = {name for cls, name, _ in gen_sync.HAND_WRITTEN if cls == "Client"}
    generated = [name for name in twins if name not in hand]
    assert len(generated) > 40
    for name in generated:
        asynchronous, blocking = getattr(AsyncClient, twins[name]), getattr(Client, name)
        if isinstance(blocking, property):
            assert isinstance(asynchronous, property), name
            continue
        assert not inspect.iscoroutinefunction(blocking), name
        assert not inspect.isasyncgenfunction(blocking), name


def test_a_change_to_an_async_method_reaches_its_blocking_twin() -> None:
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    old = 'reply: pb.GetUsageResponse = await self._call("GetUsage", request, timeout, retry=True)'
    assert source.count(old) == 1
    changed = source.replace(old, old.replace("retry=True", "retry=False"))
    made = gen_sync.render(changed, target)
    assert 'self._call("GetUsage", request, timeout, retry=False)' in made
    assert 'self._call("GetUsage", request, timeout, retry=True)' not in made
    undone = made.replace(
        '"GetUsage", request, timeout, retry=False', '"GetUsage", request, timeout, retry=True'
    )
    assert undone == target  # nothing else moved
    assert gen_sync.render(source, target) == target


def test_a_hand_edit_of_a_generated_method_is_undone_and_its_docstring_kept() -> None:
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    edited = target.replace(
        "            length = self.surface(session_id, timeout=timeout).event_count",
        "            length = self.surface(session_id).event_count",
    )
    assert edited != target
    assert gen_sync.render(source, edited) == target
    # The blocking client documents each call in full; the asyncio one points to it.
    assert Client.hide.__doc__ != AsyncClient.hide.__doc__
    assert Client.hide.__doc__ is not None
    assert Client.hide.__doc__ in gen_sync.render(source, edited)


def test_a_method_rule_that_no_longer_matches_stops_the_generation() -> None:
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    changed = source.replace("reply = await call\n", "reply = await asyncio.shield(call)\n")
    assert changed != source
    with pytest.raises(ValueError, match="_send"):
        gen_sync.render(changed, target)


def test_the_parentheses_of_a_call_around_an_await_stay() -> None:
    assert gen_sync.unasync("self._use(await self._shards.client_for(s))\n") == (
        "self._use(self._shards.client_for(s))\n"
    )
    assert gen_sync.unasync("f(x)(await g())\n") == "f(x)(g())\n"


def test_the_rules_turn_the_asyncio_names_into_their_blocking_twins() -> None:
    source = (
        "import asyncio\n"
        "from sessionlog_client import _async_io as io\n"
        "lock, closed = asyncio.Lock(), asyncio.Event()\n"
        "value = await asyncio.to_thread(read_key, a, b)\n"
        "def f() -> AsyncGenerator[pb.FollowedChange, None]: ...\n"
        "channel: grpc.aio.Channel = grpc.aio.insecure_channel(address)\n"
    )
    assert gen_sync.unasync(source) == (
        "import threading\n"
        "import time\n"
        "from sessionlog_client import _sync_io as io\n"
        "lock, closed = threading.Lock(), threading.Event()\n"
        "value = read_key(a, b)\n"
        "def f() -> Generator[pb.FollowedChange, None, None]: ...\n"
        "channel: grpc.Channel = grpc.insecure_channel(address)\n"
    )


def test_a_change_to_an_async_stream_reaches_the_blocking_stream() -> None:
    """The streams and the shard routing are generated too, not only AsyncClient's methods."""
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    old = "                        events = [e for e in events if e.seq >= self.next_seq]\n"
    assert source.count(old) == 1
    changed = source.replace(old, old.replace(">=", ">"))
    made = gen_sync.render(changed, target)
    assert made.count(old.replace(">=", ">")) == 1
    assert made.count(old) == 0
    source_shards = "self.table = table if table is not None else self.table"
    assert source.count(source_shards) == 1
    changed = source.replace(source_shards, "self.table = table")
    assert "            self.table = table\n" in gen_sync.render(changed, target)


def test_a_hand_edit_of_a_generated_stream_is_undone() -> None:
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    old = "                reader.stop()\n"
    assert target.count(old) == 2
    edited = target.replace(old, "                pass\n")
    assert gen_sync.render(source, edited) == target


def test_the_hand_written_members_are_kept_where_they_are() -> None:
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    assert isinstance(vars(Client)["shard_map"], property)  # a coroutine in AsyncClient
    assert inspect.iscoroutinefunction(AsyncClient.shard_map)
    old = "        member = self._router.pick()\n        if member is None:\n            raise"
    assert target.count(old) == 1  # Client.channel, which AsyncClient has not
    edited = target.replace(old, old.replace("self._router.pick()", "self._router.current()"))
    assert gen_sync.render(source, edited) == edited


def test_a_name_left_async_stops_the_generation() -> None:
    source, target = gen_sync.SOURCE.read_text(), gen_sync.TARGET.read_text()
    old = "        await io.pause(self._closed, delay)\n"
    assert old in source
    changed = source.replace(
        old, "        await asyncio.shield(io.pause(self._closed, delay))\n", 1
    )
    with pytest.raises(ValueError, match="still async"):
        gen_sync.render(changed, target)


def test_the_helper_pair_offers_the_same_names() -> None:
    """What _aio.py calls in _async_io, _sync.py calls in _sync_io (the rule renames the module)."""
    from sessionlog_client import _async_io, _sync_io

    def offered(module: types.ModuleType) -> set[str]:
        return {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and not isinstance(value, types.ModuleType)
            and name not in {"annotations", "Any"}
        }

    assert offered(_async_io) == offered(_sync_io)
    assert offered(_async_io) == {
        "GENERATOR_RUNNING",
        "AppendPipe",
        "Pending",
        "Reader",
        "TYPE_CHECKING",
        "call_guard",
        "pause",
    }
    assert {"read", "stop"} <= set(vars(_async_io.Reader)) & set(vars(_sync_io.Reader))
