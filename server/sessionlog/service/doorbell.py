"""Wake followers in every worker when any worker commits (see ``sessionlog.workers``).

Each worker slot has one eventfd, made by the supervisor before any worker starts and inherited
by every worker, so a restarted worker finds its bell where its predecessor left it. After a
commit, the writer thread rings every other slot's bell (one 8-byte write each; a full counter
is a bell already ringing). A worker's event loop reads its own bell, then asks the store for
the changes committed after the position it has seen by writers other than its own, and wakes
the followers of the sessions those changes wrote (``changes.FEED_KEY`` for change-feed
followers). Its own commits wake its followers directly, as in a single process.

No wakeup is lost: the bell is rung after the commit, and the read that answers it starts after
the bell was read, so it sees the commit; a follower registers before it reads storage
(``notifier``), so a commit it did not see has woken it. A worker that dies between its commit
and its ring would leave the others asleep (until a heartbeat, or the next commit): so the
supervisor rings every bell once it sees a worker exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from sessionlog.service.notifier import Notifier
from sessionlog.service.shared_counts import SharedCounts
from sessionlog.storage.folder import FolderLock
from sessionlog.storage.store import Store

log = logging.getLogger(__name__)


def make_bells(count: int) -> list[int]:
    """One non-blocking eventfd per worker slot (closed on exec unless handed down)."""
    return [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(count)]


def ring(bells: Sequence[int]) -> None:
    """Ring each of ``bells`` (a full counter, BlockingIOError, is a bell ringing already)."""
    for fd in bells:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_write(fd, 1)


@dataclass
class Peers:
    """What a worker shares with the other workers of its server."""

    slot: int
    """This worker's number, 0 to count - 1."""
    count: int
    """How many workers the server runs."""
    bells: Sequence[int]
    """The eventfd of every slot, this one's included."""
    lock: FolderLock
    """The folder lock the supervisor took (inherited; held as long as any process has it)."""
    counts: SharedCounts | None = None
    """The server's open streams, per worker (see ``shared_counts``)."""

    def __post_init__(self) -> None:
        self._others = [fd for slot, fd in enumerate(self.bells) if slot != self.slot]
        self._seen = 0
        self._store: Store | None = None
        self._notifier: Notifier | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failing = False
        self._beating: asyncio.Task[None] | None = None

    @property
    def own_bell(self) -> int:
        return self.bells[self.slot]

    def ring(self) -> None:
        """Tell every other worker that a commit landed (the writer thread calls it)."""
        ring(self._others)

    def listen(self, store: Store, notifier: Notifier) -> None:
        """Answer this worker's bell on the running loop from now on."""
        self._store, self._notifier = store, notifier
        self._seen = store.head()[0]
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.own_bell, self._answer)
        if self.counts is not None:
            self._beating = self._loop.create_task(_beat(self.counts))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.own_bell)
            self._loop = None
        if self._beating is not None:
            self._beating.cancel()
            self._beating = None

    def _answer(self) -> None:
        try:
            os.eventfd_read(self.own_bell)
        except BlockingIOError:  # read already by an earlier call
            return
        assert self._store is not None
        assert self._notifier is not None
        try:
            self._seen, sessions = self._store.changes_from_others(self._seen)
        except Exception:
            # The feed could not be read (a damaged record, say): wake every follower, each
            # reads its own session and finds what is new; never sleep through a commit.
            if not self._failing:
                log.exception("cannot read the change feed to wake followers; waking all")
            self._failing = True
            self._notifier.notify_all()
            with contextlib.suppress(Exception):  # skip what cannot be read, or every bell
                self._seen = self._store.head()[0]  # would read it again
            return
        self._failing = False
        if sessions:
            self._notifier.notify(sessions)


async def _beat(counts: SharedCounts) -> None:
    """The heartbeat the supervisor watches, from this worker's event loop."""
    while True:
        counts.beat()
        await asyncio.sleep(BEAT_SECONDS)


BEAT_SECONDS = 1.0
