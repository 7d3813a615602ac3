"""Bounds on what one client can hold open: streams in total and per connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from sessionlog import errors
from sessionlog.service.errors import abort
from sessionlog.service.notifier import Notifier, shutting_down

Outgoing = AsyncIterator[tuple[bytes, int]]
"""What a guarded stream yields: each response with the position a client resumes from once it
has read that response."""

DEFAULT_MAX_EVENTS_PER_APPEND = 10_000
DEFAULT_MAX_STREAMS = 10_000
DEFAULT_MAX_STREAMS_PER_CONNECTION = 1_000


class StreamLimiter:
    """Counts open streams (Since, Changes) in total and per connection, refusing past limits.

    The server's memory for an idle follow stream is small but not zero; these bounds keep a
    misbehaving client from opening streams without end.
    """

    def __init__(
        self,
        max_total: int = DEFAULT_MAX_STREAMS,
        max_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION,
        notifier: Notifier | None = None,
    ) -> None:
        self.notifier = notifier
        self.max_total = max_total
        self.max_per_connection = max_per_connection
        self.total = 0
        self._by_peer: dict[str, int] = {}
        self.opened = 0
        """Streams admitted since start (for metrics)."""
        self.sent_bytes = 0
        """Bytes the guarded streams have sent (for metrics)."""

    def acquire(self, peer: str) -> None:
        if self.total >= self.max_total:
            raise errors.TooManyStreams(
                f"the server already has {self.total} open streams, its limit "
                "(--max-streams); retry later",
                limit=self.max_total,
            )
        open_here = self._by_peer.get(peer, 0)
        if open_here >= self.max_per_connection:
            raise errors.TooManyStreams(
                f"this connection already has {open_here} open streams, the limit "
                "(--max-streams-per-connection); close some or use another connection",
                limit=self.max_per_connection,
            )
        self.total += 1
        self.opened += 1
        self._by_peer[peer] = open_here + 1

    def release(self, peer: str) -> None:
        self.total -= 1
        left = self._by_peer[peer] - 1
        if left:
            self._by_peer[peer] = left
        else:
            del self._by_peer[peer]

    def guard(
        self,
        stream: Callable[[bytes, grpc.aio.ServicerContext], Outgoing],
        precheck: Callable[[bytes, grpc.aio.ServicerContext], None] | None = None,
        subject: Callable[[bytes], str] = lambda raw: "the stream",
    ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[None]]:
        """Wrap a streaming handler: check (auth scope), count it while open, always release.

        The wrapper writes each response itself, racing the write against shutdown: a follower
        held back by flow control still gets UNAVAILABLE with the seq to resume from (the
        resume point the stream gave with the response: where a client stands once it has read
        it, since gRPC delivers a message already handed to it before the status), not a bare
        cancellation.
        """

        async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> None:
            peer = context.peer() or ""
            try:
                if precheck is not None:
                    precheck(raw, context)
                self.acquire(peer)
            except errors.SessionLogError as error:
                await abort(context, error)
                return
            try:
                async for payload, resume in stream(raw, context):
                    self.sent_bytes += len(payload)
                    if not await self._write(context, payload):
                        await abort(context, shutting_down(subject(raw), resume))
                        return
            finally:
                self.release(peer)

        return guarded

    async def _write(self, context: grpc.aio.ServicerContext, payload: bytes) -> bool:
        """Send one response; False when shutdown came first (the write is abandoned)."""
        write = asyncio.ensure_future(context.write(payload))
        if self.notifier is None:
            await write
            return True
        closing = self.notifier.closing()
        done, _ = await asyncio.wait({write, closing}, return_when=asyncio.FIRST_COMPLETED)
        if write in done:
            write.result()
            return True
        # The message is already handed to gRPC, which sends it before the status that follows;
        # leave it be (cancelling could drop it and leave the client a gap).
        write.add_done_callback(_ignore_outcome)
        return False


def _ignore_outcome(write: asyncio.Future[None]) -> None:
    if not write.cancelled():
        write.exception()
