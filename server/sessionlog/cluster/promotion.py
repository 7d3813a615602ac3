"""Promotion and fencing of a running server.

A promotion stops replication first, then takes the new epoch in one write transaction (the
leadership record, a new history id, the folder no longer a replica), and only then opens the
server to writes: no change from the old primary can be applied after the new epoch began, and
no write is taken before it. A fence is one write transaction: from its commit on, every write
(in every worker process of the server) is refused with NOT_PRIMARY.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sessionlog import errors
from sessionlog.storage import leadership
from sessionlog.storage.leadership import Leadership
from sessionlog.storage.store import Store

log = logging.getLogger(__name__)

_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


@dataclass(frozen=True)
class Promotion:
    epoch: int
    first_position: int
    history_id: str
    previous_primary: str


def check_address(address: str, what: str) -> None:
    """InvalidAddress unless ``address`` is HOST:PORT (a name or IPv4, or [IPv6])."""
    match = _ADDRESS.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise errors.InvalidAddress(
            f"{what} must be HOST:PORT (a host name or IP address, then a port from 1 to 65535)",
            field=what,
        )


class Promoter:
    """Promotes and fences the running server over ``store``. ``stop_replication`` ends the
    replica's change stream (and waits for it); ``promoted`` opens the server to writes;
    ``resume_replication`` restarts the stream after a promotion that failed once it had
    stopped it."""

    def __init__(
        self,
        store: Store,
        *,
        stop_replication: Callable[[], Awaitable[None]],
        resume_replication: Callable[[], None],
        promoted: Callable[[Leadership], Awaitable[None]],
    ) -> None:
        self.store = store
        self._stop_replication = stop_replication
        self._resume_replication = resume_replication
        self._promoted = promoted
        self._lock = asyncio.Lock()

    async def promote(self, epoch: int = 0) -> Promotion:
        """Become the primary in ``epoch`` (0: one above every epoch known)."""
        async with self._lock:
            record = self.store.leadership()
            if record.may_write:
                raise errors.AlreadyPrimary(
                    f"this server already takes writes (epoch {record.epoch}): nothing to promote",
                    epoch=record.epoch,
                )
            leadership.promoted(record, 0, epoch)  # StaleEpoch before anything stops
            await self._stop_replication()
            try:
                future = self.store.submit_promote(epoch)
                before, after = await asyncio.wrap_future(future)
            except BaseException:
                self._resume_replication()
                raise
            await self._promoted(after)
        return self._announce(
            before, after, "promoted: this server is the primary and takes writes"
        )

    async def lead(self, epoch: int) -> Promotion | None:
        """Take writes in ``epoch``, which an election gave this server: ``promote``'s steps,
        also for a folder that took writes in an older epoch (``leadership.elected``); None,
        and nothing changed, when it already leads at ``epoch``."""
        async with self._lock:
            record = self.store.leadership()
            if leadership.elected(record, 0, epoch) == record:  # StaleEpoch before anything
                return None
            await self._stop_replication()
            future = self.store.submit_leadership(
                lambda current, next_position: leadership.elected(current, next_position, epoch),
                new_history=not record.may_write,
            )
            before, after = await asyncio.wrap_future(future)
            await self._promoted(after)
        return self._announce(
            before, after, "elected: this server is the group's primary and takes writes"
        )

    def _announce(self, before: Leadership, after: Leadership, message: str) -> Promotion:
        """The promotion that turned ``before`` into ``after``, logged once."""
        promotion = Promotion(
            epoch=after.epoch,
            first_position=after.history[-1][1],
            history_id=self.store.history()[0],
            previous_primary=before.primary,
        )
        log.warning(
            message,
            extra={
                "epoch": promotion.epoch,
                "first_position": promotion.first_position,
                "history_id": promotion.history_id,
                "previous_primary": promotion.previous_primary,
                "previous_epoch": before.epoch,
            },
        )
        return promotion

    async def fence(self, epoch: int, primary: str) -> tuple[Leadership, Leadership]:
        """Learn of the newer ``epoch`` led by ``primary``: stop taking writes, for good."""
        if epoch <= 0:
            raise errors.InvalidEpoch("a fence needs the newer epoch: set epoch above 0")
        if primary:
            check_address(primary, "primary")
        known = self.store.leadership().epoch
        if epoch <= known:
            raise errors.StaleEpoch(
                f"epoch {epoch} is not above epoch {known}, the one this server knows: "
                "nothing changed",
                epoch=epoch,
                known_epoch=known,
            )
        async with self._lock:
            before, after = await asyncio.wrap_future(self.store.submit_fence(epoch, primary))
        if after.epoch != epoch:  # a newer one arrived meanwhile
            raise errors.StaleEpoch(
                f"epoch {epoch} is not above epoch {before.epoch}, the one this server knows: "
                "nothing changed",
                epoch=epoch,
                known_epoch=before.epoch,
            )
        if before.may_write:
            log.warning(
                "fenced: a newer epoch exists; this server takes no more writes",
                extra={"epoch": before.epoch, "newer_epoch": epoch, "primary": primary},
            )
        return before, after
