"""The purging task (``service.purger``) against a real store: it frees marked sessions, and
backs off when a purge keeps failing instead of trying again at its idle pace."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sessionlog.service import purger
from sessionlog.storage import purge, schema
from sessionlog.storage.store import Store
from tests.integration.helpers import user


def _broken_mark(store: Store) -> None:
    """A mark whose chunk fails inside the writer the way a bug would (a removal that is not
    hex), as a damaged mark would."""
    mark = purge.Purge("gone", sid=999, upto=5, removals=[("events", "not hex", "")])
    with store.env.begin(write=True) as txn:
        txn.put(schema.u64(999), mark.encode(), db=store.tables.purges)


async def _run_for(store: Store, seconds: float) -> None:
    task = asyncio.create_task(purger.keep_purged(store, lambda: True))
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_purge_that_keeps_failing_is_tried_again_less_and_less_often(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 10 ms idle pace, a chunk that fails every time is tried a handful of times in a
    second (the wait doubles after each failure), not a hundred."""
    monkeypatch.setattr(purger, "IDLE_SECONDS", 0.01)
    _broken_mark(store)
    failed_before = store.writer.stats.failed_commits
    asyncio.run(_run_for(store, 1.0))
    tries = store.writer.stats.failed_commits - failed_before
    assert 2 <= tries <= 10, tries
    assert [mark.sid for mark in store.purging()] == [999]  # nothing half done


def test_the_task_frees_a_deleted_long_session(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session deleted is freed by the task: no mark is left."""
    monkeypatch.setattr(purger, "IDLE_SECONDS", 0.01)
    monkeypatch.setattr(purge, "PURGE_FROM", 100)
    store.append("long", [user(str(n)) for n in range(150)])
    store.delete("long")
    assert store.purging()
    asyncio.run(_run_for(store, 0.5))
    assert store.purging() == []
