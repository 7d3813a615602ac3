"""The background task that frees deleted long sessions chunk by chunk (``storage.purge``).

Who purges: whoever sweeps (``sweeper``): a process that takes writes, worker 0 of ``--workers
N``. A replica never does: the primary's chunks reach it as change records. A new leader, or a
restarted server, finds the marks its predecessor left and goes on from them.

Each chunk waits its turn in the writer's queue like any append, and the task pauses after each
as long as it took (``purge.paced``), so other sessions' writes find the writer free at least
half the time; it looks for new marks every ``IDLE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sessionlog import errors
from sessionlog.storage import purge
from sessionlog.storage.store import Store

log = logging.getLogger(__name__)

IDLE_SECONDS = 0.5
"""How often a task with nothing to free looks for a mark."""


async def keep_purged(store: Store, may_purge: Callable[[], bool]) -> None:
    """Free the purged sessions until cancelled."""
    while True:
        await asyncio.sleep(IDLE_SECONDS)
        while may_purge():
            started = time.monotonic()
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
            await asyncio.sleep(purge.paced(time.monotonic() - started))
