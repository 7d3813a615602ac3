"""What the blocking client does its own way, where the asyncio client (``_async_io``) does it
in its event loop: a watchdog thread cancels a stream's call after a silence, a lock guards the
call against a close from another thread, a pause is a wait on a ``threading.Event``.

The blocking twin of ``_async_io``, name for name (``client/python/gen_sync.py`` rewrites
``_async_io`` to ``_sync_io`` when it generates ``_sync.py`` from ``_aio.py``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

GENERATOR_RUNNING = ValueError
"""What closing a stream's generator raises while another thread is inside it."""


def call_guard() -> threading.Lock:
    """Held while a stream's call is opened, and while a close (from any thread) reads it."""
    return threading.Lock()


def pause(closed: threading.Event, delay: float) -> None:
    """Sleep ``delay`` seconds, or less if ``closed`` is set meanwhile."""
    closed.wait(delay)


class _Watchdog:
    """Cancels a call that stays silent for ``limit`` seconds while the stream waits on it.

    Time the caller spends with a response it was handed does not count (``pause``/``resume``):
    a slow consumer is not a dead link. One thread per open call, ended by ``stop``.
    """

    def __init__(self, call: Any, limit: float) -> None:
        self.fired = False
        self._call = call
        self._limit = limit
        self._since: float | None = time.monotonic()
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="sessionlog-follow-watchdog", daemon=True).start()

    def pause(self) -> None:
        self._since = None

    def resume(self) -> None:
        self._since = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while True:
            since = self._since
            left = self._limit if since is None else since + self._limit - time.monotonic()
            if left <= 0:
                self.fired = True
                self._call.cancel()
                return
            if self._done.wait(left):
                return


class Reader:
    """The responses of one streaming call, each waited for at most ``silence`` seconds."""

    def __init__(self, call: Any, silence: float | None, closed: threading.Event) -> None:
        self._call = call
        self._responses = iter(call)
        self._closed = closed
        self._watchdog = None if silence is None else _Watchdog(call, silence)

    def read(self) -> Any:
        """The next response; None at the end of the call or once the stream was closed.
        TimeoutError after ``silence`` seconds with no response (a dead link: the watchdog
        cancelled the call). Only the wait counts, not the time the caller spends with a
        response."""
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.resume()
        try:
            return next(self._responses, None)
        except grpc.RpcError:
            if self._closed.is_set():
                return None
            if watchdog is not None and watchdog.fired:
                raise TimeoutError from None
            raise
        finally:
            if watchdog is not None:
                watchdog.pause()

    def stop(self) -> None:
        """End the call and its watchdog."""
        if self._watchdog is not None:
            self._watchdog.stop()
        self._call.cancel()
