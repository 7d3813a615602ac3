"""The single writer thread and its group commit.

LMDB allows one write transaction at a time, and a write transaction belongs to the thread that
opened it. So every write goes through one thread: callers put a command on a queue and get a
future. The thread takes everything that queued up while it was busy (up to a bound), applies the
commands in arrival order inside one write transaction, commits once (one fsync for the whole
group), and only then resolves the futures and tells the subscribers which sessions changed.

Invariants:
- a command either writes all of its changes or none: every check runs before its first put, and
  a failed check leaves the transaction as it found it;
- a future is resolved only after the transaction holding its writes is committed and synced, so
  an acknowledged append is durable;
- ``on_commit`` runs after the commit, so a woken subscriber always finds the new events;
- when the map fills up mid-group (or any command fails unexpectedly), the group is retried one
  command per transaction, so one bad or large append cannot fail the others queued beside it;
- a write that meets a damaged page (LMDB then refuses the whole transaction) fails alone with
  DATA_CORRUPTED, the others retried without it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import lmdb

from sessionlog import errors
from sessionlog.stats import GROUP_BUCKETS, SECONDS_BUCKETS, Histogram
from sessionlog.storage import changes, damage, schema
from sessionlog.storage.commands import Tables

log = logging.getLogger(__name__)

#: At most this many commands share one transaction.
MAX_GROUP = 256
#: A group stops growing once its commands carry this many bytes of events.
MAX_GROUP_BYTES = 16 << 20


class Command(Protocol):
    """Something the writer applies inside a write transaction."""

    kind: str
    """What the change feed calls it: append, create, fork or lease."""
    session_id: str
    """The session it changes."""

    def apply(self, txn: lmdb.Transaction, now_ns: int) -> Any:
        """Check, then write. Raise a SessionLogError (having written nothing) to refuse."""

    def size(self) -> int:
        """Bytes this command writes, roughly; bounds the group."""

    def touched(self) -> Sequence[str]:
        """Session ids whose logs this command changed (valid after apply)."""


@dataclass
class _Job:
    command: Command
    future: Future[Any] = field(default_factory=Future)


class _Stop:
    pass


_STOP = _Stop()


@dataclass
class WriterStats:
    """Counters for tests, benchmarks and metrics. Written by the writer thread only."""

    commits: int = 0
    commands: int = 0
    largest_group: int = 0
    events: int = 0
    """Events written by committed commands (appends, creates, seeds, forks; not replicated)."""
    group_sizes: Histogram = field(default_factory=lambda: Histogram(GROUP_BUCKETS))
    """Commands per committed group."""
    commit_seconds: Histogram = field(default_factory=lambda: Histogram(SECONDS_BUCKETS))
    """Time each commit took, its fsync included."""


class Writer:
    """Owns the write side of one LMDB environment."""

    def __init__(
        self,
        env: lmdb.Environment,
        tables: Tables,
        on_commit: Callable[[set[str]], None] | None = None,
    ) -> None:
        self._env = env
        self._tables = tables
        with env.begin() as txn:
            self._next_position = changes.head(txn, tables)[0] + 1
        self._queue: queue.SimpleQueue[_Job | _Stop] = queue.SimpleQueue()
        self._on_commit = on_commit
        self.stats = WriterStats()
        self._group_events = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sessionlog-writer", daemon=True)
        self._thread.start()

    def submit(self, command: Command) -> Future[Any]:
        """Queue a command; the future holds its result once its transaction is durable."""
        job = _Job(command)
        if self._closed:
            job.future.set_exception(errors.Unavailable("the store is closed"))
            return job.future
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        """Finish every queued command, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            group, stop = self._take_group()
            if group:
                try:
                    self._commit(group)
                except Exception:  # never let one group end the writer: every append needs it
                    log.exception("writer failed a group; carrying on")
                    for job in group:
                        _settle(job.future, RuntimeError("the write failed; see the server log"))
            if stop:
                return

    def _take_group(self) -> tuple[list[_Job], bool]:
        """Everything queued, up to the bounds, minus the jobs whose callers gave up before it
        started (they are never written). Marking a future running makes it uncancellable, so
        its caller learns the outcome of what was written."""
        group: list[_Job] = []
        size = 0
        first = True
        while len(group) < MAX_GROUP and size < MAX_GROUP_BYTES:
            try:
                job = self._queue.get() if first else self._queue.get_nowait()
            except queue.Empty:
                break
            first = False
            if isinstance(job, _Stop):
                return group, True
            if job.future.set_running_or_notify_cancel():
                group.append(job)
                size += job.command.size()
            elif not group:
                first = True  # nothing taken yet: wait for the next job
        return group, False

    def _commit(self, group: list[_Job]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        position = self._next_position
        self._group_events = 0
        try:
            txn = self._env.begin(write=True)
            try:
                now_ns = time.time_ns()
                for job in group:
                    ok, value, position = self._apply(job.command, txn, now_ns, position)
                    outcomes.append((ok, value))
                started = time.perf_counter()
                txn.commit()
                committed_in = time.perf_counter() - started
                self.stats.commit_seconds.observe(committed_in)
            except BaseException:
                txn.abort()
                raise
        except Exception as exc:
            if len(group) > 1:
                # Find the one that failed: every other command still deserves its commit.
                for job in group:
                    self._commit([job])
                return
            if outcomes and not outcomes[0][0]:
                pass  # refused (damage it read breaks the transaction): the refusal stands
            elif isinstance(exc, lmdb.MapFullError):
                outcomes = [(False, _storage_full())]
            elif isinstance(exc, damage.LMDB_DAMAGE):
                log.error("a write met a damaged page", extra={"error": type(exc).__name__})
                outcomes = [(False, _damaged(group[0].command, exc))]
            else:  # a disk failure or a bug: nothing of this command is durable
                log.exception("write transaction failed")
                outcomes = [(False, exc)]
        else:
            fed = position != self._next_position
            self._next_position = position
            self.stats.commits += 1
            self.stats.commands += len(group)
            self.stats.largest_group = max(self.stats.largest_group, len(group))
            self.stats.group_sizes.observe(len(group))
            self.stats.events += self._group_events
            self._finish(group, outcomes, fed)
            return
        self._finish(group, outcomes, False)

    def _apply(
        self, command: Command, txn: lmdb.Transaction, now_ns: int, position: int
    ) -> tuple[bool, Any, int]:
        """Apply one command; on success record its change. Returns (ok, value, next position)."""
        if getattr(command, "replicated", False):
            try:
                applied: changes.ApplyResult = command.apply(txn, now_ns)
            except errors.SessionLogError as exc:
                return False, exc, position
            return True, applied, applied.last_position + 1 if applied.last_position else position
        recording = changes.RecordingTxn(txn, self._tables)
        try:
            result = command.apply(recording, now_ns)  # type: ignore[arg-type]
        except errors.SessionLogError as exc:
            return False, exc, position
        if recording.wrote:
            record = changes.encode_change(
                position, command.kind, command.session_id, now_ns, recording
            )
            txn.put(schema.u64(position), record, db=self._tables.changes)
            position += 1
            self._group_events += recording.event_count
        return True, result, position

    def _finish(self, group: list[_Job], outcomes: list[tuple[bool, Any]], fed: bool) -> None:
        changed: set[str] = {changes.FEED_KEY} if fed else set()
        for job, (ok, value) in zip(group, outcomes, strict=True):
            if ok:
                changed.update(job.command.touched())
            _settle(job.future, value, ok)
        if changed and self._on_commit is not None:
            try:
                self._on_commit(changed)
            except Exception:
                log.exception("commit subscriber failed")


def _settle(future: Future[Any], value: Any, ok: bool = False) -> None:
    """Resolve a job's future once; a second resolution (after a failed retry) is dropped."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _damaged(command: Command, exc: Exception) -> errors.DataCorrupted:
    """A write LMDB could not make because a page on its way is damaged; nothing was written."""
    target = f"session '{command.session_id}'" if command.session_id else "the store"
    return damage.corrupted(
        f"the write to {target}", exc, failed="could not be made", session_id=command.session_id
    )


def _storage_full() -> errors.StorageFull:
    return errors.StorageFull(
        "the LMDB map is full: nothing was written; reads still work. Restart the server with a "
        "larger --map-size"
    )
