"""Wakes follow streams after commits, without lost wakeups.

A follower registers a future *before* it reads storage, reads everything past its cursor, and
only then waits on the future. The writer thread calls :meth:`Notifier.notify` (through the event
loop) after each commit, resolving every future registered for the sessions it changed. A commit
that lands between the read and the wait has already resolved the future, so the follower wakes
at once: registering first is what makes a lost wakeup impossible (Litestream's Notify dance).

All methods run on the event loop thread.
"""

from __future__ import annotations

import asyncio

from sessionlog import errors


class Notifier:
    """Per-session wakeups for follow streams, plus one switch that wakes everyone to leave."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.closed = False
        self._closing: asyncio.Future[None] | None = None
        self._pauses: set[asyncio.Future[None]] = set()

    def closing(self) -> asyncio.Future[None]:
        """A future resolved when the notifier closes (shared; never cancel it)."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_future()
            if self.closed:
                self._closing.set_result(None)
        return self._closing

    def register(self, session_id: str) -> asyncio.Future[None]:
        """A future resolved by the next commit to ``session_id`` (or by close)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(None)
        else:
            self._waiters.setdefault(session_id, set()).add(future)
        return future

    def discard(self, session_id: str, future: asyncio.Future[None]) -> None:
        """Forget a follower's future when it leaves, so idle sessions hold nothing."""
        waiting = self._waiters.get(session_id)
        if waiting is not None:
            waiting.discard(future)
            if not waiting:
                del self._waiters[session_id]

    async def pause(self, seconds: float) -> None:
        """Sleep for ``seconds``, or less: ``close`` ends every pause at once, so a paced stream
        still answers shutdown promptly (and with its resume point)."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _resolve, future)
        self._pauses.add(future)
        try:
            await future
        finally:
            self._pauses.discard(future)
            timer.cancel()

    def notify(self, session_ids: set[str]) -> None:
        for session_id in session_ids:
            for future in self._waiters.pop(session_id, ()):
                if not future.done():
                    future.set_result(None)

    def notify_all(self) -> None:
        """Wake every follower (each reads its own cursor and waits again if nothing is new)."""
        waiting, self._waiters = self._waiters, {}
        for futures in waiting.values():
            for future in futures:
                _resolve(future)

    def close(self) -> None:
        """Wake every follower; from now on they see ``closed`` and end their streams."""
        self.closed = True
        if self._closing is not None and not self._closing.done():
            self._closing.set_result(None)
        waiting, self._waiters = self._waiters, {}
        for futures in (*waiting.values(), self._pauses):
            for future in futures:
                _resolve(future)

    @property
    def follower_count(self) -> int:
        return sum(len(f) for f in self._waiters.values())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def shutting_down(what: str, cursor: int) -> errors.Unavailable:
    """The error that ends a follow stream at shutdown, saying where to resume."""
    return errors.Unavailable(
        f"the server is shutting down; reconnect and resume {what} from {cursor}",
        next_seq=cursor,
    )
