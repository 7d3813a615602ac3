"""What the blocking client does its own way, where the asyncio client (``_async_io``) does it
in its event loop: a watchdog thread cancels a stream's call after a silence, a lock guards the
call against a close from another thread, a pause is a wait on a ``threading.Event``, an
AppendStream call takes its requests from a queue and a thread reads its replies (``AppendPipe``).

The blocking twin of ``_async_io``, name for name (``client/python/gen_sync.py`` rewrites
``_async_io`` to ``_sync_io`` when it generates ``_sync.py`` from ``_aio.py``).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc

from sessionlog_client import _status, errors
from sessionlog_client.v1 import session_log_service_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from concurrent.futures import Future

    from sessionlog_client._routing import StreamEpochs

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


Pending = futures.Future
"""What ``append_nowait`` returns: a ``concurrent.futures.Future``."""


class AppendPipe:
    """One AppendStream call: requests go out in the order they are sent (gRPC takes them from
    a queue in its own thread), and a reader thread resolves each request's future with its
    reply (by correlation id). A call that ends before a request's reply fails its future with
    the call's error. ``epochs`` learns the server's epoch from the call's headers and judges
    every reply by it."""

    def __init__(
        self, open_call: Callable[..., Any], epochs: StreamEpochs | None = None, **call: Any
    ) -> None:
        self._epochs = epochs
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Future[pb.AppendResponse], str]] = {}
        self._outgoing: queue.SimpleQueue[pb.AppendStreamRequest | None] = queue.SimpleQueue()
        self._ended: errors.SessionLogError | None = None
        self._closing = False
        self._call = open_call(self._requests(), **call)
        self._reader = threading.Thread(
            target=self._read, name="sessionlog-append-stream", daemon=True
        )
        self._reader.start()

    def send(self, request: pb.AppendRequest) -> Future[pb.AppendResponse]:
        future: Future[pb.AppendResponse] = futures.Future()
        with self._lock:
            if self._ended is not None:
                future.set_exception(self._ended)
                return future
            if self._closing:
                raise RuntimeError("this append stream is closed: open another one")
            correlation_id = next(self._ids)
            self._pending[correlation_id] = (future, request.session_id)
            self._outgoing.put(
                pb.AppendStreamRequest(correlation_id=correlation_id, append=request)
            )
        return future

    def close(self) -> None:
        """Send no more; return once every request sent has its outcome."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._outgoing.put(None)
        self._reader.join()

    def cancel(self) -> None:
        """End the call now: every request still unanswered fails (CANCELLED)."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._outgoing.put(None)  # ends the request iterator gRPC's thread reads
        self._call.cancel()

    def _requests(self) -> Iterator[pb.AppendStreamRequest]:
        while (request := self._outgoing.get()) is not None:
            yield request

    def _read(self) -> None:
        epochs = self._epochs
        try:
            if epochs is not None:
                epochs.opened(self._call.initial_metadata())
            for reply in self._call:
                with self._lock:
                    pending = self._pending.pop(reply.correlation_id, None)
                _settle(pending, reply, epochs)
            if epochs is not None:
                epochs.finished(self._call.trailing_metadata())
        except grpc.RpcError as error:
            moved = None if epochs is None else epochs.ended(error)
            self._end(moved or _status.to_error(error))
        self._end(errors.Unavailable("the append stream ended before answering this append"))

    def _end(self, error: errors.SessionLogError) -> None:
        with self._lock:
            if self._ended is None:
                self._ended = error
            pending, self._pending = self._pending, {}
            if not self._closing:
                self._closing = True
                self._outgoing.put(None)
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(error)


def _settle(
    pending: tuple[Future[pb.AppendResponse], str] | None,
    reply: pb.AppendStreamResponse,
    epochs: StreamEpochs | None,
) -> None:
    """Resolve a request's future with its reply, judged by ``epochs``: its AppendResponse, or
    its error (LeadershipLost for an acknowledgement from a deposed server)."""
    if pending is None or pending[0].done():
        return
    future, session_id = pending
    error = _status.judged_reply_error(reply, session_id, epochs)
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(reply.append)
