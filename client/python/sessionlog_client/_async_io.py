"""What the asyncio client does its own way, where the blocking client (``_sync_io``) does it
with threads: reading a stream's next response with a deadline for silence, pausing a stream
between reconnects, guarding a stream's call against a concurrent close.

``_aio.py`` calls these and ``client/python/gen_sync.py`` turns the calls into ``_sync_io``'s
(the rule ``_async_io`` -> ``_sync_io``): the two modules offer the same names, so the blocking
client is generated from the asyncio one with no hand edit.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc

GENERATOR_RUNNING = RuntimeError
"""What closing a stream's generator raises while another task is inside it."""


def call_guard() -> contextlib.AbstractContextManager[Any]:
    """Held while a stream's call is opened or read for a close: nothing to guard in one loop."""
    return contextlib.nullcontext()


async def pause(closed: asyncio.Event, delay: float) -> None:
    """Sleep ``delay`` seconds, or less if ``closed`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(closed.wait(), delay)


class Reader:
    """The responses of one streaming call, each awaited for at most ``silence`` seconds."""

    def __init__(self, call: Any, silence: float | None, closed: asyncio.Event) -> None:
        self._call = call
        self._silence = silence
        self._closed = closed

    async def read(self) -> Any:
        """The next response; None at the end of the call or once the stream was closed.
        TimeoutError after ``silence`` seconds with no response (a dead link). Only the wait
        counts, not the time the caller spends with a response."""
        try:
            async with asyncio.timeout(self._silence):
                response = await self._call.read()
        except asyncio.CancelledError:
            if self._closed.is_set():
                return None
            raise
        return None if response is grpc.aio.EOF else response

    def stop(self) -> None:
        """End the call."""
        self._call.cancel()
