"""One agent turn's writes, four ways (issue 33: should framework backends pipeline a turn over
AppendStream?). Run: ``python -m bench.turn_writes [turns] [items]``.

A turn here is ``items`` events (a user message, tool calls and results, an answer) written to
one session, timed from the turn's first send to its last acknowledgement, against a
``sessionlog serve --workers 1`` of its own (synced commits) through the asyncio client:

- ``one Append``: every item in one Append, what the backends do (OpenAI Agents ``add_items``,
  LangChain ``add_messages``, Pydantic AI, the Claude Agent SDK store's ``append``);
- ``stream``: one Append per item pipelined on an AppendStream kept open across turns, the turn
  done once every item is acknowledged;
- ``unary, in a row``: one Append per item, each awaited before the next;
- ``unary, at once``: one Append per item, all sent together (``asyncio.gather``): no order
  between them, so only for writes that need none (ADK's app and user state, two sessions).

It prints the p50 and p99 of a turn in milliseconds per way. The ways run interleaved, turn by
turn, so a busy machine weighs on all of them alike.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import percentile
from bench.procs import sessionlog_server
from sessionlog_client import AsyncClient, event
from sessionlog_client.v1.event_pb2 import Event

WARMUP_TURNS = 5


def turn_items(turn: int, items: int) -> list[Event]:
    return [event("user_message", {"content": f"turn {turn} item {n}"}) for n in range(items)]


async def measure(address: str, turns: int, items: int) -> dict[str, list[float]]:
    async with AsyncClient(address) as client:
        stream = client.append_stream()
        await stream.open()

        async def one_append(session: str, batch: list[Event]) -> None:
            await client.append(session, batch)

        async def pipelined(session: str, batch: list[Event]) -> None:
            await asyncio.gather(*(stream.append_nowait(session, [e]) for e in batch))

        async def in_a_row(session: str, batch: list[Event]) -> None:
            for item in batch:
                await client.append(session, [item])

        async def at_once(session: str, batch: list[Event]) -> None:
            await asyncio.gather(*(client.append(session, [e]) for e in batch))

        ways: dict[str, Callable[[str, list[Event]], Awaitable[None]]] = {
            "one Append": one_append,
            "stream": pipelined,
            "unary, in a row": in_a_row,
            "unary, at once": at_once,
        }
        took: dict[str, list[float]] = {name: [] for name in ways}
        for turn in range(WARMUP_TURNS + turns):
            for name, way in ways.items():
                batch = turn_items(turn, items)
                started = time.perf_counter()
                await way(f"turn.{list(ways).index(name)}", batch)
                if turn >= WARMUP_TURNS:
                    took[name].append((time.perf_counter() - started) * 1000)
        await stream.aclose()
    return took


def main(turns: int = 200, items: int = 4) -> None:
    with (
        tempfile.TemporaryDirectory() as folder,
        sessionlog_server(Path(folder) / "data", Path(folder) / "server.log", workers=1) as server,
    ):
        took = asyncio.run(measure(server.address, turns, items))
    print(f"{turns} turns of {items} items, ms per turn")
    for name, times in took.items():
        times.sort()
        p50, p99 = percentile(times, 0.5) or 0.0, percentile(times, 0.99) or 0.0
        print(f"{name:>16}: p50 {p50:6.2f}  p99 {p99:6.2f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
