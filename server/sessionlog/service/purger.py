"""The background task that frees deleted long sessions chunk by chunk (``storage.purge``).

Who purges: whoever sweeps (``sweeper``): a process that takes writes, worker 0 of ``--workers
N``. A replica never does: the primary's chunks reach it as change records. A new leader, or a
restarted server, finds the marks its predecessor left and goes on from them.

Each chunk is a background command of the writer (``Writer.submit_background``): it rides with
the next group of other writes or runs when the writer is idle, and keeps its own time short
(``purge.CHUNK_SECONDS``), so the task needs no pause of its own between chunks; it looks for
new marks every ``IDLE_SECONDS``.
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


async def keep_purged(store: Store, may_purge: Callable[[], bool]) -> None:
    """Free the purged sessions until cancelled."""
    while True:
        await asyncio.sleep(IDLE_SECONDS)
        while may_purge():
            try:
                chunk = await asyncio.to_thread(store.purge_next)
            except errors.SessionLogError as error:
                log.warning("purging a deleted session stopped", extra={"error": str(error)})
                break
            except Exception:  # one failed chunk must not end purging for the server's life
                log.exception("purging a deleted session failed; the next round tries again")
                break
            if chunk is None:
                break
            if chunk.done:
                log.info("freed a deleted session's rows", extra={"session_id": chunk.session_id})
