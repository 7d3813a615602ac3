"""The background task that frees deleted long sessions chunk by chunk (``storage.purge``).

Who purges: whoever sweeps (``sweeper``): a process that takes writes, worker 0 of ``--workers
N``. A replica never does: the primary's chunks reach it as change records. A new leader, or a
restarted server, finds the marks its predecessor left and goes on from them.

A session's purge is handed to the writer whole (``Store.start_purge``): one background command
that the writer runs again, chunk after chunk, each riding with the next group of other writes
or running when the writer is idle, each keeping its own time short (``purge.CHUNK_SECONDS``).
No thread of this process runs between two chunks; the task only awaits the end, then looks for
the next mark (every ``IDLE_SECONDS`` when there is none). A write refused (this process no
longer takes writes) ends the purge's command; the next leader resumes from the mark.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sessionlog import errors
from sessionlog.storage.store import Store

log = logging.getLogger(__name__)

IDLE_SECONDS = 0.5
"""How often a task with nothing to free looks for a mark."""
MAX_BACKOFF_SECONDS = 60.0
"""After a failed purge the task waits twice as long as before (from ``IDLE_SECONDS``) up to
this, so a purge that keeps failing (a damaged record, a bug) neither spins nor floods the
log; a purge that ends well resets the wait."""


async def keep_purged(store: Store, may_purge: Callable[[], bool]) -> None:
    """Free the purged sessions until cancelled."""
    wait = IDLE_SECONDS
    while True:
        await asyncio.sleep(wait)
        failed = await _purge_while_allowed(store, may_purge, first_failure=wait == IDLE_SECONDS)
        wait = min(wait * 2, MAX_BACKOFF_SECONDS) if failed else IDLE_SECONDS


async def _purge_while_allowed(
    store: Store, may_purge: Callable[[], bool], first_failure: bool
) -> bool:
    """Free the marked sessions one after another while ``may_purge``; whether one failed
    (its traceback is logged for the first failure of a run of them, a line after that)."""
    while may_purge():
        try:
            started = await asyncio.to_thread(store.start_purge)
            if started is None:
                return False
            chunk = await asyncio.wrap_future(started)  # no thread waits for it
        except errors.SessionLogError as error:
            log.warning("purging a deleted session stopped", extra={"error": str(error)})
            return True
        except Exception as exc:  # one failed chunk must not end purging for the server's life
            if first_failure:
                log.exception("purging a deleted session failed; it is tried again later")
            else:
                log.warning("purging a deleted session failed again", extra={"error": str(exc)})
            return True
        if not chunk.done:
            return False  # the writer stopped first
        log.info("freed a deleted session's rows", extra={"chunks": chunk.chunks})
    return False
