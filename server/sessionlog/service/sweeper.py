"""The retention sweeper's background task: every ``--retention-sweep-interval`` it runs one
``Store.sweep`` off the event loop, when this process may sweep.

Who sweeps: only a process that takes writes (a static primary, or the elected leader in
``--cluster`` mode; never a replica, whose copies go when the primary's DELETE records arrive),
and with ``--workers N`` only worker 0 (every worker shares one writer lock; one sweeper is
enough, and two would only race for the same sessions). Sharded, a sweep deletes only sessions
whose slot this group owns and that are not moving. A sweep that deleted a full batch is
followed by the next at once; otherwise it waits the interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sessionlog import errors
from sessionlog.retention import Policy
from sessionlog.storage.retention import SWEEP_BATCH
from sessionlog.storage.store import Store

log = logging.getLogger(__name__)


async def keep_swept(
    store: Store,
    policy: Policy,
    interval_seconds: float,
    may_sweep: Callable[[], bool],
    ours: Callable[[str], bool],
) -> None:
    """Sweep until cancelled."""
    delay = interval_seconds
    while True:
        await asyncio.sleep(delay)
        delay = interval_seconds
        if not may_sweep():
            continue
        try:
            swept = await asyncio.to_thread(store.sweep, policy, ours=ours)
        except errors.SessionLogError as error:
            log.warning("the retention sweep stopped early", extra={"error": str(error)})
            continue
        except Exception:  # never let one failed sweep end retention for the server's life
            log.exception("the retention sweep failed; the next one tries again")
            continue
        if swept.expired or swept.idle:
            log.info(
                "the retention sweep deleted sessions",
                extra={"expired": swept.expired, "idle": swept.idle, "events": swept.events},
            )
        if max(swept.expired, swept.idle) >= SWEEP_BATCH:
            delay = 0
