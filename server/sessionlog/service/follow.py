"""The one loop behind every follow stream (Since, Changes): read, send, wait, repeat.

    register a wakeup ─▶ read past the cursor ─▶ send what it found; more past it? loop
                                              └▶ at the end: (once) send caught_up, then wait
                                                 for the wakeup, or send a heartbeat on timeout

Registering before reading is what makes a lost wakeup impossible (see ``notifier``). Each
response is yielded with the position a client resumes from once it has read it, which is what
``limits.StreamLimiter.guard`` reports if shutdown overtakes the send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.duration_pb2 import Duration

from sessionlog import errors
from sessionlog.defaults import MIN_HEARTBEAT_SECONDS
from sessionlog.service.errors import refusal_level
from sessionlog.service.notifier import Notifier, shutting_down

log = logging.getLogger(__name__)


def heartbeat_interval(requested: Duration, ceiling: float) -> float:
    """The heartbeat a follow stream gets: what its request asked for, clamped to
    [``MIN_HEARTBEAT_SECONDS``, ``ceiling``] (the server's --heartbeat); unset or zero asks for
    the ceiling. A client may want heartbeats sooner, to notice a dead link sooner, but never
    fewer than the server is configured to send, and never so many that they flood it."""
    seconds = requested.ToNanoseconds() / 1e9
    if seconds == 0:
        return ceiling
    return min(max(seconds, MIN_HEARTBEAT_SECONDS), ceiling)


Refuse = Callable[[errors.SessionLogError], Awaitable[None]]
"""How a stream ends with an error: a gRPC abort, or the console's in-band ``error`` event."""


async def follow(
    refuse: Refuse,
    notifier: Notifier,
    *,
    key: str,
    subject: str,
    cursor: int,
    live: bool,
    heartbeat_seconds: float,
    read: Callable[[int], tuple[bytes, int, bool]],
    marker: Callable[[bool], bytes],
    pace: Callable[[], float] = lambda: 0.0,
) -> AsyncIterator[tuple[bytes, int]]:
    """Stream ``read(cursor)`` batches (payload, how far they advance the cursor, whether more
    may follow it) until there is nothing left; with ``live``, then ``marker(True)`` once
    (caught up), then new batches as commits to ``key`` wake it, and ``marker(False)`` (a
    heartbeat) after each idle interval. Once caught up, two responses are at least ``pace()``
    seconds apart: what commits land in between goes out together in the next one.

    A refusal, and shutdown (UNAVAILABLE with the position to resume from), end the stream
    through ``refuse``: the same loop serves gRPC streams and the web console's live tail."""
    waiter: asyncio.Future[None] | None = None
    caught_up = False
    loop = asyncio.get_running_loop()
    sent_at = 0.0
    spoke_at = loop.time()  # the last response of any kind: the heartbeat counts from it
    paced = False
    try:
        while True:
            if live and (waiter is None or waiter.done()):
                if waiter is not None:
                    notifier.discard(key, waiter)
                waiter = notifier.register(key)
            if paced:
                # The stream reached the end and a commit woke it: hold the read until its turn
                # comes round. (A stream behind, reading batch after batch, is never held:
                # pacing spreads the sends out, it must not cap how fast a stream catches up.)
                paced = False
                delay = sent_at + pace() - loop.time()
                if delay > 0:
                    await notifier.pause(delay)
            if notifier.closed:
                await refuse(shutting_down(subject, cursor))
                return
            payload, advance, more = read(cursor)
            if advance:
                cursor += advance
                yield payload, cursor
                sent_at = spoke_at = loop.time()
                if more:
                    continue
                # That batch reached the end as of its read. A commit since then has resolved
                # the waiter (registered before the read), so no second read is needed to know.
            paced = caught_up  # at the end: the next wake-up waits for this stream's turn
            if not live or waiter is None:
                return
            if not caught_up:
                caught_up = True
                yield marker(True), cursor
                spoke_at = loop.time()
            # Silent since the last response, whatever woke the stream meanwhile: commits it
            # had nothing to send for (a filtered feed on a busy server) must not hold off the
            # heartbeat, or the client takes the stream for dead.
            silent = loop.time() - spoke_at
            if silent >= heartbeat_seconds:
                yield marker(False), cursor
                spoke_at = loop.time()
                continue
            if waiter.done():
                continue
            try:
                async with asyncio.timeout(heartbeat_seconds - silent):
                    await waiter
            except TimeoutError:
                yield marker(False), cursor
                spoke_at = loop.time()
    except errors.SessionLogError as error:
        log.log(
            refusal_level(error),
            "stream refused",
            extra={"stream": subject, "reason": error.reason},
        )
        await refuse(error)
    except (asyncio.CancelledError, grpc.aio.AbortError):
        raise
    except Exception:
        log.exception("unexpected failure following %s", subject)
        await refuse(errors.SessionLogError("internal error; see the server log"))
    finally:
        if waiter is not None:
            notifier.discard(key, waiter)
