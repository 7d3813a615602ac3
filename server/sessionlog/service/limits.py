"""Bounds on what clients can hold open (streams in total and per connection), and the budget
of live follow responses that one process's caught-up streams share."""

from __future__ import annotations

import asyncio
import math
import time
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

BURST_SECONDS = 0.005
"""How much of its rate the send budget holds when unused: at 5,000 responses/s, 25 responses
may go back to back (about 2 ms of the loop) before the others wait for their share."""


class SendBudget:
    """A token bucket of live follow responses, refilled at ``rate`` per second and holding at
    most ``burst`` (at least one): every caught-up follow stream of one process draws from it.

    With few followers there is always a token and each response goes at once; with many, the
    responses per second are bounded, not each stream's turn, so what a cheaper response saves
    is not spent on more of them. Tokens are handed out in the order they are asked for, each
    at its own time (GCRA: the bucket is the time the next token comes due, no queue to keep).
    A stream asks again only after its previous write ended, so a slow client holds no tokens.
    """

    def __init__(
        self, rate: float, burst: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0:
            raise ValueError(f"the send rate must be positive, not {rate}")
        self.interval = 1.0 / rate
        self.burst = burst if burst is not None else max(1, math.ceil(rate * BURST_SECONDS))
        self._clock = clock
        self._due = -math.inf
        """When the next token comes due; the bucket is full when that is ``burst`` tokens ago."""

    def reserve(self) -> float:
        """Take the next token: the seconds to wait until it is due (0 when one is at hand).
        The caller sends once that time has passed; the token is spent whether or not it does."""
        now = self._clock()
        due = max(self._due, now - (self.burst - 1) * self.interval)
        self._due = due + self.interval
        return max(0.0, due - now)


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
        self.budget = SendBudget(send_rate)
        self.max_total = max_total
        self.max_per_connection = max_per_connection
        self.total = 0
        self._by_peer: dict[str, int] = {}
        self.opened = 0
        """Streams admitted since start (for metrics)."""
        self.sent_bytes = 0
        """Bytes the guarded streams have sent (for metrics)."""
        self._writing: dict[asyncio.Task[Any], tuple[Any, ...]] = {}
        """Stream tasks waiting on a write: its call, request, subject and resume point."""
        self._ended: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        """Stream tasks whose call shutdown ended during a write, with the task ending it."""
        self._interrupting = False
        self.elsewhere: Callable[[], int] = lambda: 0
        """Streams open in the other processes of this server (its other workers)."""
        self.published: Callable[[int], None] = lambda total: None
        """Called with this process's open streams whenever they change (for the others)."""

    def pace(self) -> float:
        """The seconds a caught-up follow stream waits before its next live response: one token
        of this process's send budget (--follow-send-rate). A commit wakes every follower of its
        session; with many of them, sending each commit to each one on its own would take all
        the time there is, appends starve and followers fall behind. Paced, a follower gets the
        events of the commits that landed while it waited in one response: fewer sends, the
        same events, in order."""
        return self.budget.reserve()

    def acquire(self, peer: str) -> None:
        """Count one more stream of ``peer``, or refuse it (TOO_MANY_STREAMS)."""
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
        self.opened += 1
        self._by_peer[peer] = open_here + 1
        self.published(self.total)

    def release(self, peer: str) -> None:
        self.total -= 1
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

        The wrapper writes each response itself, and shutdown ends a stream caught in a write
        (a follower held back by flow control) with UNAVAILABLE and the seq to resume from (the
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
                    await self._write(context, payload, raw, subject, resume)
            finally:
                self.release(peer)

        return guarded

    async def _write(
        self,
        context: grpc.aio.ServicerContext,
        payload: bytes,
        raw: bytes,
        subject: Callable[[bytes], str],
        resume: int,
    ) -> None:
        """Send one response. Shutdown while it waits ends the call (UNAVAILABLE with
        ``resume``), and the write then raises AbortError, as gRPC's abort does.

        The write runs in the stream's own task, and shutdown never cancels it: a write
        cancelled could drop its message and leave the client a gap. Shutdown ends the call
        instead, from a task of its own (``_interrupt``); gRPC sends that status after the
        message in flight, and the write then finishes, or fails with the call. A write in the
        stream's task costs one await, where a task per write cost a quarter of the send.
        """
        notifier = self.notifier
        if notifier is None:
            await context.write(payload)
            return
        task = asyncio.current_task()
        if task is None or notifier.closed:
            await self._last_write(context, payload, shutting_down(subject(raw), resume))
            return
        if not self._interrupting:
            self._interrupting = True
            notifier.closing().add_done_callback(self._interrupt)
        self._writing[task] = (context, raw, subject, resume)
        try:
            await context.write(payload)
        except Exception:
            if task not in self._ended:
                raise
        finally:
            self._writing.pop(task, None)
        ending = self._ended.pop(task, None)
        if ending is not None:
            # Shutdown ended the call while this write waited. Its status may not be sent yet
            # (the write finished first): returning before it is, the handler would end the
            # call OK. Its AbortError then ends the handler as an abort in it would.
            await ending

    def _interrupt(self, closing: asyncio.Future[None]) -> None:
        """Shutdown began: end every stream that waits on a write (flow control may hold it
        for as long as its client does not read) with the position to resume from."""
        for task, (context, raw, subject, resume) in self._writing.items():
            ending = asyncio.ensure_future(abort(context, shutting_down(subject(raw), resume)))
            ending.add_done_callback(_ignore_outcome)  # the stream hears of it, or is gone
            self._ended[task] = ending  # kept until then (the loop holds tasks weakly)

    @staticmethod
    async def _last_write(
        context: grpc.aio.ServicerContext, payload: bytes, ending: errors.SessionLogError
    ) -> None:
        """Hand a response to gRPC, then end the call with ``ending``: one turn of the loop
        lets the write hand its message over before the status that follows it."""
        write = asyncio.ensure_future(context.write(payload))
        await asyncio.sleep(0)
        if write.done():
            write.result()
        else:
            write.add_done_callback(_ignore_outcome)
        await abort(context, ending)


def _ignore_outcome(write: asyncio.Future[None]) -> None:
    if not write.cancelled():
        write.exception()
