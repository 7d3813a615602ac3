"""Bounds on what one client can hold open: streams in total and per connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from sessionlog import errors
from sessionlog.defaults import (
    DEFAULT_FOLLOW_SEND_RATE,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
)
from sessionlog.service.errors import abort
from sessionlog.service.notifier import Notifier, shutting_down

Outgoing = AsyncIterator[tuple[bytes, int]]
"""What a guarded stream yields: each response with the position a client resumes from once it
has read that response."""

MAX_PACE_SECONDS = 1.0


class StreamLimiter:
    """Counts open streams (Since, Changes, AppendStream) in total and per connection, refusing
    past limits.

    The server's memory for an idle follow stream is small but not zero, and an AppendStream
    holds up to its window of requests: these bounds keep a misbehaving client from opening
    streams without end.
    """

    def __init__(
        self,
        max_total: int = DEFAULT_MAX_STREAMS,
        max_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION,
        notifier: Notifier | None = None,
        send_rate: int = DEFAULT_FOLLOW_SEND_RATE,
    ) -> None:
        self.notifier = notifier
        self.send_rate = send_rate
        self.max_total = max_total
        self.max_per_connection = max_per_connection
        self.total = 0
        self.unpaced = 0
        """Open streams that follow no commits (AppendStream): counted, but not paced."""
        self._by_peer: dict[str, int] = {}
        self.opened = 0
        """Streams admitted since start (for metrics)."""
        self.sent_bytes = 0
        """Bytes the guarded streams have sent (for metrics)."""
        self._writing: set[asyncio.Task[Any]] = set()
        """Stream tasks waiting on a write."""
        self._interrupted: set[asyncio.Task[Any]] = set()
        self._interrupting = False
        self.elsewhere: Callable[[], int] = lambda: 0
        """Streams open in the other processes of this server (its other workers)."""
        self.published: Callable[[int], None] = lambda total: None
        """Called with this process's open streams whenever they change (for the others)."""

    def pace(self) -> float:
        """The least time between two live responses of one follow stream: open streams over
        the send rate (capped at a second). A commit wakes every follower of its session; with
        many of them, sending each commit to each one on its own would take all the time there
        is, appends starve and followers fall behind. Paced, a follower gets the events of
        several commits in one response instead: fewer sends, the same events, in order."""
        return min((self.total - self.unpaced) / self.send_rate, MAX_PACE_SECONDS)

    def acquire(self, peer: str, *, follows: bool = True) -> None:
        """Count one more stream of ``peer``, or refuse it (TOO_MANY_STREAMS). ``follows``:
        it follows commits, so it counts in the pace of follow streams."""
        total = self.total + self.elsewhere()
        if total >= self.max_total:
            raise errors.TooManyStreams(
                f"the server already has {total} open streams, its limit "
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
        self.unpaced += not follows
        self.opened += 1
        self._by_peer[peer] = open_here + 1
        self.published(self.total)

    def release(self, peer: str, *, follows: bool = True) -> None:
        self.total -= 1
        self.unpaced -= not follows
        self.published(self.total)
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
                # Headers first, on their own: an abort while the first response is still in
                # flight (see ``_write``) then sends only the status. Sent with that response,
                # the headers would be sent twice, gRPC would refuse the status batch (too many
                # operations), and the call would stay open until the shutdown grace ran out.
                await context.send_initial_metadata(())
                async for payload, resume in stream(raw, context):
                    self.sent_bytes += len(payload)
                    if not await self._write(context, payload):
                        await abort(context, shutting_down(subject(raw), resume))
                        return
            finally:
                self.release(peer)

        return guarded

    async def _write(self, context: grpc.aio.ServicerContext, payload: bytes) -> bool:
        """Send one response; False when shutdown came first (the write is abandoned).

        The write runs as its own task, so abandoning it never cancels it: the message is
        already handed to gRPC, which sends it before the status that follows (cancelling could
        drop it and leave the client a gap). Shutdown interrupts the wait instead: it cancels the
        streams' own tasks while they wait (see ``_interrupt``), which costs nothing per write.
        """
        notifier = self.notifier
        if notifier is None:
            await context.write(payload)
            return True
        write = asyncio.ensure_future(context.write(payload))
        task = asyncio.current_task()
        if task is None or notifier.closed:
            return await self._abandon(write)
        if not self._interrupting:
            self._interrupting = True
            notifier.closing().add_done_callback(self._interrupt)
        self._writing.add(task)
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            if task not in self._interrupted:
                # The client went away, or grpc is ending the call: the write then fails on
                # its own, and nobody is left to hear it (else asyncio logs it as an error).
                write.add_done_callback(_ignore_outcome)
                raise
            self._interrupted.discard(task)
            if task.uncancel():
                write.add_done_callback(_ignore_outcome)
                raise  # the client's own cancellation came in the same turn: it stands
            return await self._abandon(write)
        finally:
            self._writing.discard(task)
        return True

    def _interrupt(self, closing: asyncio.Future[None]) -> None:
        """Shutdown began: stop every stream that waits on a write (flow control may hold it
        for as long as its client does not read)."""
        for task in self._writing:
            self._interrupted.add(task)
            task.cancel()

    @staticmethod
    async def _abandon(write: asyncio.Future[None]) -> bool:
        """Leave a write to finish on its own. One turn of the loop first: the write's task
        then has handed its message to gRPC before the caller sends the status."""
        await asyncio.sleep(0)
        if write.done():
            write.result()
            return True
        write.add_done_callback(_ignore_outcome)
        return False


def _ignore_outcome(write: asyncio.Future[None]) -> None:
    if not write.cancelled():
        write.exception()
