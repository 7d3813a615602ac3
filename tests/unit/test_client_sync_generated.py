"""The blocking client's methods are generated from the asyncio client's by
client/python/gen_sync.py: the rewrite rules, the docstrings the blocking client keeps, a change
to an async method reaching its blocking twin, a hand edit of a generated method undone, and
today's _sync.py fresh."""

from __future__ import annotations

import inspect
import sys
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
    """_sync.py is fresh: the generated methods are today's _aio.py rewritten."""
    assert gen_sync.rendered() == gen_sync.TARGET.read_bytes()


def test_every_generated_method_is_a_blocking_method_of_both_clients() -> None:
    twins = {gen_sync.unasync(name): name for name in vars(AsyncClient)}
    for name in gen_sync.METHODS:
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
