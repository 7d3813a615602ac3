"""The follow loop's pace: a caught-up stream's turns count from its reads, not its writes."""

from __future__ import annotations

import asyncio

from sessionlog import errors
from sessionlog.service.follow import follow
from sessionlog.service.notifier import Notifier

PACE = 1.0
WRITE = 0.6
"""How long the consumer takes to send each response (a write held up behind others)."""


async def _refuse(error: errors.SessionLogError) -> None:
    raise AssertionError(f"the stream was refused: {error}")


async def _turns() -> tuple[list[float], list[bytes]]:
    """Two commits to a paced stream whose consumer is slow: when each read found them, and
    what the stream sent."""
    loop = asyncio.get_running_loop()
    notifier = Notifier()
    log: list[bytes] = []
    reads: list[float] = []

    def read(cursor: int) -> tuple[bytes, int, bool]:
        if cursor >= len(log):
            return b"", 0, False
        reads.append(loop.time())
        return b"".join(log[cursor:]), len(log) - cursor, False

    def commit(event: bytes) -> None:
        log.append(event)
        notifier.notify({"s"})

    stream = follow(
        _refuse,
        notifier,
        key="s",
        subject="session 's'",
        cursor=0,
        live=True,
        heartbeat_seconds=60.0,
        read=read,
        marker=lambda caught_up: b"caught-up" if caught_up else b"heartbeat",
        pace=lambda: PACE,
    )
    sent = [(await anext(stream))[0]]
    commit(b"a")
    sent.append((await anext(stream))[0])
    commit(b"b")  # lands while the response of "a" is still being written
    await asyncio.sleep(WRITE)
    sent.append((await anext(stream))[0])
    await stream.aclose()
    return reads, sent


def test_a_slow_write_does_not_lengthen_the_next_turn() -> None:
    """A commit that lands while the previous response is still being written goes out one pace
    after the previous read (not one pace after the write ended), and never sooner."""
    reads, sent = asyncio.run(_turns())
    assert sent == [b"caught-up", b"a", b"b"]
    gap = reads[1] - reads[0]
    assert PACE <= gap < PACE + WRITE * 2 / 3
