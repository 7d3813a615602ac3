"""Bounds on what one client can hold open: streams in total and per connection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from sessionlog import errors
from sessionlog.service.errors import to_grpc_status

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
    ) -> None:
        self.max_total = max_total
        self.max_per_connection = max_per_connection
        self.total = 0
        self._by_peer: dict[str, int] = {}

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
        stream: Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]],
        precheck: Callable[[bytes, grpc.aio.ServicerContext], None] | None = None,
    ) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        """Wrap a streaming handler: check (auth scope), count it while open, always release."""

        async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            peer = context.peer() or ""
            try:
                if precheck is not None:
                    precheck(raw, context)
                self.acquire(peer)
            except errors.SessionLogError as error:
                status = to_grpc_status(error)
                await context.abort(status.code, status.details, status.trailing_metadata)
                return
            try:
                async for response in stream(raw, context):
                    yield response
            finally:
                self.release(peer)

        return guarded
