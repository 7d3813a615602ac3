"""What the asyncio client does its own way, where the blocking client (``_sync_io``) does it
with threads: reading a stream's next response with a deadline for silence, pausing a stream
between reconnects, guarding a stream's call against a concurrent close, pipelining appends on
an AppendStream call (``AppendPipe``: a writer and a reader task, loop futures).

``_aio.py`` calls these and ``client/python/gen_sync.py`` turns the calls into ``_sync_io``'s
(the rule ``_async_io`` -> ``_sync_io``): the two modules offer the same names, so the blocking
client is generated from the asyncio one with no hand edit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import TYPE_CHECKING, Any

import grpc

from sessionlog_client import _status, errors
from sessionlog_client.v1 import session_log_service_pb2 as pb

if TYPE_CHECKING:
    from collections.abc import Callable

    from sessionlog_client._routing import StreamEpochs

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


Pending = asyncio.Future
"""What ``append_nowait`` returns: a future of the loop it was called on."""


class AppendPipe:
    """One AppendStream call: requests go out in the order they are sent, as the call's flow
    control lets them, and each reply resolves its request's future (by correlation id). A call
    that ends before a request's reply fails its future with the call's error. ``epochs``
    learns the server's epoch from the call's headers and judges every reply by it."""

    def __init__(
        self, open_call: Callable[..., Any], epochs: StreamEpochs | None = None, **call: Any
    ) -> None:
        self._epochs = epochs
        self._call = open_call(**call)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[pb.AppendResponse], str]] = {}
        self._outgoing: asyncio.Queue[pb.AppendStreamRequest | None] = asyncio.Queue()
        self._ended: errors.SessionLogError | None = None
        self._closing = False
        self._writer = asyncio.ensure_future(self._write())
        self._reader = asyncio.ensure_future(self._read())

    def send(self, request: pb.AppendRequest) -> asyncio.Future[pb.AppendResponse]:
        future: asyncio.Future[pb.AppendResponse] = asyncio.get_running_loop().create_future()
        if self._ended is not None:
            future.set_exception(self._ended)
        elif self._closing:
            raise RuntimeError("this append stream is closed: open another one")
        else:
            correlation_id = next(self._ids)
            self._pending[correlation_id] = (future, request.session_id)
            sent = pb.AppendStreamRequest(correlation_id=correlation_id, append=request)
            self._outgoing.put_nowait(sent)
        return future

    async def close(self) -> None:
        """Send no more; return once every request sent has its outcome."""
        if not self._closing:
            self._closing = True
            self._outgoing.put_nowait(None)
        await asyncio.gather(self._writer, self._reader)

    def cancel(self) -> None:
        """End the call now: every request still unanswered fails (CANCELLED)."""
        self._closing = True
        self._writer.cancel()
        self._call.cancel()

    async def _write(self) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            while (request := await self._outgoing.get()) is not None:
                await self._call.write(request)
            await self._call.done_writing()
        # a failed write ends the call: the reader reports why

    async def _read(self) -> None:
        epochs = self._epochs
        try:
            if epochs is not None:
                epochs.opened(await self._call.initial_metadata())
            while (reply := await self._call.read()) is not grpc.aio.EOF:
                _settle(self._pending.pop(reply.correlation_id, None), reply, epochs)
            if epochs is not None:
                epochs.finished(await self._call.trailing_metadata())
        except grpc.RpcError as error:
            moved = None if epochs is None else epochs.ended(error)
            self._end(moved or _status.to_error(error))
        except asyncio.CancelledError:  # the call was cancelled (``cancel``)
            self._end(
                _status.Cancelled("the append stream was cancelled before answering this append")
            )
            return
        self._end(errors.Unavailable("the append stream ended before answering this append"))

    def _end(self, error: errors.SessionLogError) -> None:
        if self._ended is None:
            self._ended = error
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(error)
        if not self._closing:
            self._closing = True
            self._outgoing.put_nowait(None)


def _settle(
    pending: tuple[asyncio.Future[pb.AppendResponse], str] | None,
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
