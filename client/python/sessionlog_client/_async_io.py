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
    that ends before a request's reply fails its future with the call's error."""

    def __init__(
        self,
        open_call: Callable[..., Any],
        on_headers: Callable[[Any], None] | None = None,
        **call: Any,
    ) -> None:
        self._on_headers = on_headers
        """Given the call's initial metadata (the server's epoch) before any reply is read."""
        self._call = open_call(**call)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[pb.AppendResponse]] = {}
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
            self._pending[correlation_id] = future
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
        try:
            if self._on_headers is not None:
                self._on_headers(await self._call.initial_metadata())
            while (reply := await self._call.read()) is not grpc.aio.EOF:
                _settle(self._pending.pop(reply.correlation_id, None), reply)
        except grpc.RpcError as error:
            self._end(_status.to_error(error))
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
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        if not self._closing:
            self._closing = True
            self._outgoing.put_nowait(None)


def _settle(future: Any, reply: pb.AppendStreamResponse) -> None:
    """Resolve a request's future with its reply: its AppendResponse, or its error."""
    if future is None or future.done():
        return
    if reply.HasField("error"):
        failed = reply.error
        error = _status.stream_error(failed.code, failed.message, failed.reason, failed.metadata)
        future.set_exception(error)
    else:
        future.set_result(reply.append)
