"""The single writer thread and its group commit.

LMDB allows one write transaction at a time, and a write transaction belongs to the thread that
opened it. So every write goes through one thread: callers put a command on a queue and get a
future. The thread takes everything that queued up while it was busy (up to a bound), applies the
commands in arrival order inside one write transaction, commits once (one fsync for the whole
group), and only then resolves the futures and tells the subscribers which sessions changed.

A caller on an event loop (the gRPC handlers) gets a future of that loop instead
(``submit_on_loop``): the writer hands the outcomes of a whole group to the loop in one
``call_soon_threadsafe``, so an append costs neither a ``concurrent.futures.Future`` (a lock and a
condition) nor a chained loop future and a cross-thread wakeup of its own.

Invariants:
- a command either writes all of its changes or none: every check runs before its first put, and
  a failed check leaves the transaction as it found it;
- a future is resolved only after the transaction holding its writes is committed and synced, so
  an acknowledged append is durable; a command whose caller gave up (its future cancelled) before
  its group was taken is never written;
- with ``deferred_sync`` (``--durability group``, LMDB opened with metasync off) a commit syncs
  its data pages but leaves its meta page (the one that makes the commit the newest) in the page
  cache: a power cut there would undo the commit. So the group's outcomes, and the subscribers'
  wakeup, wait (``_pending``) until a later sync covers that meta page: the next group's commit,
  whose data sync flushes the whole file, or one ``env.sync`` when no group is queued. Under
  load a commit then costs one sync instead of two. Outcomes are given in commit order, and a
  group whose commit wrote nothing waits like the others (what it reports, a replay say, may
  stand on a pending commit);
- the change-feed position and the checksum a record chains from are read inside the write
  transaction, never cached: the store is the only truth, whoever else writes to it;
- so is the leadership record (``leadership``): a command of this store's own is refused with
  NOT_PRIMARY, writing nothing, when the record read in its transaction says this folder takes
  no writes, and its record carries the record's epoch. The process-level ``may_write`` hook
  (an election's lease deadline) is asked before each such command applies and again after the
  commit, before any outcome is given: a write committed after the hook turned off is answered
  LEADERSHIP_LOST, never acknowledged;
- a command's result (``commands.Written``) names the feed position of its record, or the
  feed's head when it wrote nothing, so a caller can wait for replicas to hold it;
- ``on_commit`` runs after the commit, so a woken subscriber always finds the new events;
- when the map fills up mid-group (or any command fails unexpectedly), the group is retried one
  command per transaction, so one bad or large append cannot fail the others queued beside it;
- when the disk fails the commit (full, or an I/O error) the cause is the environment, not one
  command: every command of the group gets the same refusal at once, without retries. LMDB
  leaves the environment as it was before the failed transaction, so the next group is
  written as soon as the disk allows (no restart);
- ``admits`` (set by the composition from the shard map, ``shard.ownership``) is asked inside
  the write transaction, right before a command of this store's own applies: a session its
  group does not own, or whose slot is frozen for a move, is refused there, writing nothing,
  however long ago the command was checked and queued (a move's copies, ``moving_in``, pass);
- an LMDB panic (a failed meta page write) leaves the environment unusable: the writer refuses
  every later command with STORAGE_IO_ERROR and tells ``on_broken``, once;
- a write that meets a damaged page (LMDB then refuses the whole transaction) fails alone with
  DATA_CORRUPTED, the others retried without it;
- a *background* command (``submit_background``: a long delete's chunk, ``purge``) never makes
  a write wait for a transaction of its own: it rides at the end of a group of other commands,
  sharing that group's commit and sync, or, when no command comes, runs alone once the writer
  has been idle ``BACKGROUND_IDLE_SECONDS`` since its last group of other commands. While
  writes flow, a job submitted with a ``pace`` (seconds) rides at most one group per pace, so it
  touches few of their commits (a chunk costs the commit it rides a fixed part of a sync, however
  short the chunk: ``docs/benchmarks.md``, case 14); once the writer is idle, repeated runs go
  back to back, each alone, until a write comes. So it cannot starve: under any load it runs
  within its pace or the idle gap. When another process (``--workers N``) has committed since
  this writer's last commit, its writes wait for LMDB's lock behind a lone run: the run is then
  paced as a rider is, and told it is not alone. The time a run adds to a group is what it does
  inside the transaction, which it bounds itself;
- a command that fails with a refusal after it wrote (a bug: refusals come before the first
  put) aborts the whole transaction, which is then retried without it: a half-applied command
  is never committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import lmdb

from sessionlog import errors
from sessionlog.stats import GROUP_BUCKETS, SECONDS_BUCKETS, Histogram
from sessionlog.storage import changes, damage, feed_index, leadership, schema
from sessionlog.storage.commands import Written
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.tables import Tables

log = logging.getLogger(__name__)

#: At most this many commands share one transaction.
MAX_GROUP = 256
#: A group stops growing once its commands carry this many bytes of events.
MAX_GROUP_BYTES = 16 << 20
#: How many of its latest commits the writer remembers the change positions of (``wrote``).
OWN_COMMITS_KEPT = 4096
#: A background command with no group to ride with runs alone once no other command has come
#: for this long since the last group of them: a write arriving meanwhile then waits for it.
BACKGROUND_IDLE_SECONDS = 0.005


class _Queued(Protocol):
    """What the writer reads of any command it queues."""

    kind: str
    """What the change feed calls it: append, create, fork or lease."""
    session_id: str
    """The session it changes."""

    def size(self) -> int:
        """Bytes this command writes, roughly; bounds the group."""

    def touched(self) -> Sequence[str]:
        """Session ids whose logs this command changed (valid after apply)."""


class Command(_Queued, Protocol):
    """A write of this store's own: applied to a ``RecordingTxn``, from whose record
    of the puts the writer makes the command's change-feed record."""

    moving_in: bool
    """A slot move's copy (or no write to a session at all): ``admits`` is not asked."""

    def apply(self, txn: RecordingTxn, now_ns: int) -> Any:
        """Check, then write. Raise a SessionLogError (having written nothing) to refuse."""


class ReplicatedCommand(_Queued, Protocol):
    """A write that carries its own change records (changes received from a primary) or needs
    none (a replica's identity): applied to the bare write transaction, recording nothing."""

    def apply(self, txn: lmdb.Transaction, now_ns: int) -> changes.ApplyResult:
        """Check, then write; the result names the newest change record it wrote, if any."""


Waiting = Future[Any] | asyncio.Future[Any]
"""A caller's future: a thread's (``submit``) or an event loop's (``submit_on_loop``)."""


class _Barrier:
    """Writes nothing (``Writer.barrier``)."""

    kind = "barrier"
    session_id = ""
    moving_in = True  # not a write to any session: ``admits`` is not asked

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: RecordingTxn, now_ns: int) -> None:
        return None


@dataclass(slots=True)
class _Job:
    command: Command
    future: Waiting
    settled: bool = False
    """Its outcome was given (a group retried one command at a time may meet it again)."""
    background: bool = False
    """Submitted with ``submit_background``: it joins a group of other commands, or runs when
    the writer is idle."""
    repeat: bool = False
    """A background job run again, in a later group, while its result says ``more``."""
    claimed: bool = False
    """Its future was marked running (a repeated job is claimed once)."""
    pace: float = 0.0
    """While writes flow, a repeated background job rides one group per this long at most."""
    not_before: float = 0.0
    """While writes flow, it runs no sooner than this (monotonic): its last run plus its
    ``pace``."""


@dataclass(slots=True)
class _ReplicatedJob:
    command: ReplicatedCommand
    future: Waiting
    settled: bool = False


_AnyJob = _Job | _ReplicatedJob
_Reply = tuple["asyncio.Future[Any]", bool, Any]
"""A loop future, whether it succeeded, and its result or exception."""
LoopCommit = tuple[asyncio.AbstractEventLoop, Callable[[set[str]], None]]
"""A loop, and what to call on it with the sessions each commit changed (``Writer``)."""


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
    failed_commits: int = 0
    """Write transactions that failed (a group retried one command at a time counts each)."""
    syncs: int = 0
    """Explicit syncs of the data file (deferred sync, when no commit followed to cover one)."""
    failed_syncs: int = 0
    """Explicit syncs that failed (their groups' writes were refused)."""
    write_errors: dict[tuple[str, str], int] = field(default_factory=dict)
    """Commands the storage refused, by (reason, cause): STORAGE_FULL map or disk,
    STORAGE_IO_ERROR io or panic."""


class Writer:
    """Owns the write side of one LMDB environment."""

    def __init__(
        self,
        env: lmdb.Environment,
        tables: Tables,
        on_commit: Callable[[set[str]], None] | None = None,
        on_broken: Callable[[], None] | None = None,
        checksums: bool = True,
        may_write: Callable[[], bool] | None = None,
        deferred_sync: bool = False,
        on_loop_commit: LoopCommit | None = None,
    ) -> None:
        self._env = env
        self._on_loop_commit = on_loop_commit
        """Like ``on_commit``, but called on a loop, in the call that hands that loop the
        group's replies: one wakeup of the loop per commit, not two."""
        self._deferred_sync = deferred_sync
        self._pending: list[tuple[list[_AnyJob], list[tuple[bool, Any]], bool]] = []
        """Deferred sync: groups committed (or refused) whose outcomes wait for the next sync."""
        self._pause = _test_pause()
        self._committed_position = 0
        self.synced_position = 0
        """The newest change position this writer knows to be on disk, meta page included (with
        nosync: committed). Every outcome it has given is at or below it."""
        self._may_write = may_write or _always
        self.lead = leadership.Leadership()
        """The leadership record as this writer last read it in a write transaction: a hint
        for fast refusals (another process of the server may have changed it since)."""
        self._checksums = checksums
        self._tables = tables
        self._queue: queue.SimpleQueue[_AnyJob | _Stop] = queue.SimpleQueue()
        self._on_commit = on_commit
        self._on_broken = on_broken
        self.stats = WriterStats()
        self._group_events = 0
        self._closed = False
        self.broken: StorageFailure | None = None
        """Set once LMDB has panicked: nothing more can be written until a restart."""
        self._failing: StorageFailure | None = None
        """The storage failure of the current episode; None while writes succeed."""
        self._failed_commands = 0
        self._own: deque[tuple[int, int]] = deque(maxlen=OWN_COMMITS_KEPT)
        """(first, last) change positions of this writer's latest commits, oldest first."""
        self._own_lock = threading.Lock()
        self._replies: list[_Reply] = []
        """Outcomes for loop futures, handed to their loops together (``_deliver``)."""
        self._changed: set[str] = set()
        """What the group being given changed, for ``on_loop_commit`` (``_deliver``)."""
        self.admits: Callable[[str], errors.SessionLogError | None] | None = None
        """Why a write to a session may not commit now (None: it may); see the invariants."""
        self.stalled: tuple[str, float] | None = None
        """While the writer waits in LMDB (for the write lock, which another process of the
        server may hold, or for a commit's sync): what it waits for, since when (monotonic).
        Read by the server's watchdog (``sessionlog.server``)."""
        self._background: deque[_Job] = deque()
        """Background jobs taken from the queue, waiting for a group or for the writer's idle
        gap; the writer thread's own."""
        self._last_foreground = time.monotonic()
        """When the writer last finished a group of other than background commands (monotonic):
        the idle gap counts from it, so lone background runs follow each other at once."""
        self._txnid_after_commit = -1
        """LMDB's transaction id of this writer's latest commit that wrote (``txn.id()``): a
        higher last one means another process has committed since (a background job then never
        runs as if alone). Read by the writer only while a background job waits."""
        self._thread = threading.Thread(target=self._run, name="sessionlog-writer", daemon=True)
        self._thread.start()

    def submit(self, command: Command) -> Future[Any]:
        """Queue a command; the future holds its result once its transaction is durable."""
        future: Future[Any] = Future()
        self._queue_job(_Job(command, future))
        return future

    def submit_on_loop(self, command: Command) -> asyncio.Future[Any]:
        """``submit`` for a caller on the running event loop: the future is that loop's, resolved
        on it once the transaction is durable. Cancelling it before the command's group is taken
        leaves the command unwritten; after, the command is written and its outcome dropped."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue_job(_Job(command, future))
        return future

    def submit_background(
        self, command: Command, repeat: bool = False, pace: float = 0.0
    ) -> Future[Any]:
        """Queue a command that must not hold up other writes (see the invariants): it runs at
        the end of the next group of other commands, or alone once the writer is idle. It
        must keep its own time inside the transaction short, since a group's writes wait for
        it; a command with an ``alone`` attribute finds it set to whether it runs alone (no
        write waits on it then, unless one comes meanwhile). With a ``pace`` (seconds) it rides
        at most one group per pace while writes flow. The future holds its result once
        its transaction is durable. With ``repeat``, a result whose ``more`` is true is not
        given: the writer runs the same command again in a later group (the same rules), and
        gives only the last result, or the first refusal (no other thread runs between the
        chunks of a long job, nor is woken for them)."""
        future: Future[Any] = Future()
        self._queue_job(_Job(command, future, background=True, repeat=repeat, pace=pace))
        return future

    def barrier(self) -> Future[Any]:
        """A future resolved once every command queued before it has been committed (or
        refused): a write that writes nothing, in the next group."""
        return self.submit(_Barrier())

    def submit_replicated(self, command: ReplicatedCommand) -> Future[changes.ApplyResult]:
        """Queue a command that records no change of its own (see ``ReplicatedCommand``)."""
        future: Future[changes.ApplyResult] = Future()
        self._queue_job(_ReplicatedJob(command, future))
        return future

    def _queue_job(self, job: _AnyJob) -> None:
        """Queue a job, or refuse it at once (its caller's thread or loop is this one)."""
        if self._closed:
            job.future.set_exception(errors.Unavailable("the store is closed"))
        elif self.broken is not None:
            job.future.set_exception(self.broken.error())
        else:
            self._queue.put(job)

    def wrote(self, after: int) -> list[tuple[int, int]]:
        """The (first, last) change positions of this writer's remembered commits that end past
        ``after``, oldest first: what another process's writer did not write (``Store``'s
        ``changes_from_others``). Only the latest OWN_COMMITS_KEPT commits are remembered."""
        with self._own_lock:
            return [span for span in self._own if span[1] > after]

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
                        self._settle(job, RuntimeError("the write failed; see the server log"))
                    self._deliver()
                if not _only_background(group):
                    self._last_foreground = time.monotonic()
            if self._pending and (stop or self._queue.empty()):
                self._sync_pending()  # no commit is coming to cover them: sync now
            if stop:
                return

    def _sync_pending(self) -> None:
        """Deferred sync: flush what the pending groups committed (their meta pages), then give
        their outcomes. A failed sync leaves their durability unknown: each write is refused
        with the storage's error (it may still be on disk, as a LEADERSHIP_LOST one may be)."""
        if self._pause is not None:
            self._pause()
        self.stalled = ("syncing the last commit to disk", time.monotonic())
        try:
            self._env.sync(True)
        except Exception as exc:
            self.stats.failed_syncs += 1
            failure = storage_failure(exc, self._free_bytes(), 0) or StorageFailure(
                errors.StorageIoError.reason, IO, f"syncing the data file failed: {exc}"
            )
            log.warning("storage sync failing: %s", failure.advice, extra={"error": str(exc)})
            pending, self._pending = self._pending, []
            for group, outcomes, _ in pending:
                refused = [(ok, v) if not ok else (False, failure.error()) for ok, v in outcomes]
                self._give(group, refused, False)
            return
        finally:
            self.stalled = None
        self.stats.syncs += 1
        self.synced_position = max(self.synced_position, self._committed_position)
        self._release_pending()

    def _release_pending(self) -> None:
        """Give the outcomes of every pending group: a sync has covered their commits."""
        pending, self._pending = self._pending, []
        for group, outcomes, fed in pending:
            self._give(group, self._unless_deposed(group, outcomes), fed)

    def _take_group(self) -> tuple[list[_AnyJob], bool]:
        """Everything queued, up to the bounds, minus the jobs whose callers gave up before it
        started (they are never written), and one background job that is due at the end; or a
        background job alone once the writer has been idle ``BACKGROUND_IDLE_SECONDS`` (see
        ``_lone_wait``). Marking a thread's future running makes it uncancellable, so its caller
        learns the outcome of what was written."""
        group: list[_AnyJob] = []
        size = 0
        first = True
        wait, alone = 0.0, True
        while len(group) < MAX_GROUP and size < MAX_GROUP_BYTES:
            if first and self._pending and self._queue.empty():
                self._sync_pending()  # about to wait for work: no commit will cover them
            if not first and self._queue.empty():
                break  # (asked, not raised: a lone append's group ends here every time)
            try:
                if not first:
                    job = self._queue.get_nowait()
                elif self._background:
                    wait, alone = self._lone_wait()
                    job = self._queue.get(timeout=wait)
                else:
                    job = self._queue.get()
            except queue.Empty:
                if not first:
                    break
                if wait > 0:
                    continue  # the idle gap (or the job's pace) has passed: look again
                lone = self._with_background(group, alone=alone)  # idle: a job runs alone
                if lone:
                    return lone, False
                continue
            if isinstance(job, _Stop):
                return group + self._all_background(), True
            if isinstance(job, _Job) and job.background:
                self._background.append(job)
                continue
            first = False
            if _claim(job.future):
                group.append(job)
                size += job.command.size()
            elif not group:
                first = True  # nothing taken yet: wait for the next job
        return self._with_background(group), False

    def _lone_wait(self) -> tuple[float, bool]:
        """How long to wait for a command before a background job runs alone, and whether it
        would run as alone. The writer is idle once ``BACKGROUND_IDLE_SECONDS`` have passed
        since its last group of other commands; then a job runs at once (back to back with its
        previous run), unless another process (``--workers N``) has committed since this
        writer's last commit: that process's writes wait for LMDB's lock behind the run, so it
        waits for its pace and keeps a rider's budget."""
        now = time.monotonic()
        idle_left = self._last_foreground + BACKGROUND_IDLE_SECONDS - now
        if idle_left > 0:
            return idle_left, True
        if self._env.info()["last_txnid"] == self._txnid_after_commit:
            return 0.0, True
        due = min(job.not_before for job in self._background)
        return max(0.0, due - now), False

    def _with_background(self, group: list[_AnyJob], alone: bool = False) -> list[_AnyJob]:
        """``group`` and the oldest background job still wanted and due (its pace: any job when
        it runs alone), if any, at its end; its command's ``alone`` (when it has one) tells it
        whether it rides with nothing."""
        if not self._background:
            return group
        now = time.monotonic()
        for job in list(self._background):
            if job.not_before > now and not (alone and not group):
                continue
            self._background.remove(job)
            if job.claimed or _claim(job.future):
                job.claimed = True
                if hasattr(job.command, "alone"):
                    job.command.alone = alone
                job.not_before = now + job.pace
                return [*group, job]
        return group

    def _all_background(self) -> list[_AnyJob]:
        """Every background job still wanted (the writer is stopping: they run in its last
        group, as every queued command does)."""
        jobs, self._background = self._background, deque()
        wanted: list[_AnyJob] = [job for job in jobs if job.claimed or _claim(job.future)]
        for job in wanted:  # they ride with the last group's writes
            if hasattr(job.command, "alone"):
                job.command.alone = False
        return wanted

    def _commit(self, group: list[_AnyJob]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        self._group_events = 0
        fed = False
        if self._pending and self._pause is not None:
            self._pause()
        try:
            self.stalled = ("waiting for LMDB's write lock", time.monotonic())
            try:
                txn = self._env.begin(write=True)
            finally:
                self.stalled = None
            try:
                now_ns = time.time_ns()
                self.lead = leadership.read(txn, self._tables)
                if self._checksums:
                    feed = changes.tail(txn, self._tables)
                else:
                    feed = (changes.head(txn, self._tables)[0], b"")
                first = feed[0] + 1
                for job in group:
                    ok, value, after = self._apply(job, txn, now_ns, feed)
                    fed = fed or after != feed
                    feed = after
                    outcomes.append((ok, value))
                if fed:  # the group's records are noted: the index's progress moves once
                    feed_index.advance(txn, self._tables, first, feed[0])
                txn_id = txn.id()
                started = time.perf_counter()
                self.stalled = ("committing (writing and syncing to disk)", time.monotonic())
                try:
                    txn.commit()
                finally:
                    self.stalled = None
                committed_in = time.perf_counter() - started
                if fed:  # a commit that wrote nothing leaves LMDB's last transaction id as it was
                    self._txnid_after_commit = txn_id
                    with self._own_lock:
                        self._own.append((first, feed[0]))
                outcomes = self._unless_deposed(group, outcomes)
                self.stats.commit_seconds.observe(committed_in)
            except BaseException:
                txn.abort()
                raise
        except Exception as exc:
            self.stats.failed_commits += 1
            failure = storage_failure(exc, self._free_bytes(), _group_bytes(group))
            if len(group) > 1 and (failure is None or failure.retry_alone):
                last = group[-1]
                if isinstance(last, _Job) and last.background:
                    # The background job riding at the end first: the others keep one commit
                    # (one of them failing splits them below, in their own retry).
                    self._commit(group[:-1])
                    self._commit([last])
                    return
                # Find the one that failed: every other command still deserves its commit.
                for job in group:
                    self._commit([job])
                return
            if isinstance(exc, _HalfWritten):  # alone now: it is refused, writing nothing
                log.error(
                    "a command refused itself after writing: its transaction was aborted",
                    extra={"kind": group[0].command.kind, "error": str(exc)},
                )
                self._finish(group, [(False, exc.refusal)], False)
                return
            if outcomes and not outcomes[0][0]:
                # Refused (the damage it read breaks the transaction): the refusal stands.
                self._finish(group, outcomes, False)
                return
            if isinstance(exc, damage.LMDB_DAMAGE):
                log.error("a write met a damaged page", extra={"error": type(exc).__name__})
                self._finish(group, [(False, _damaged(group[0].command, exc))], False)
                return
            if failure is None:  # a bug: nothing of this command is durable
                log.exception("write transaction failed")
                self._finish(group, [(False, exc)], False)
                return
            self._refuse(group, failure, exc)
            return
        else:
            self.stats.commits += 1
            self.stats.commands += len(group)
            self.stats.largest_group = max(self.stats.largest_group, len(group))
            self.stats.group_sizes.observe(len(group))
            self.stats.events += self._group_events
            if fed:  # a commit that wrote nothing proves nothing about the disk (nor syncs)
                self._recovered()
                self._committed_position = feed[0]
                if not self._deferred_sync:
                    self.synced_position = feed[0]
                elif self._pending or self.synced_position < first - 1:
                    # This commit's data sync flushed the earlier commits' meta pages too.
                    self.synced_position = max(self.synced_position, first - 1)
                    self._release_pending()
            self._finish(group, outcomes, fed)

    def _free_bytes(self) -> int | None:
        """Bytes an unprivileged writer may still use on the data directory's filesystem."""
        try:
            fs = os.statvfs(self._env.path())
        except OSError:
            return None
        return fs.f_bavail * fs.f_frsize

    def _refuse(self, group: list[_AnyJob], failure: StorageFailure, exc: BaseException) -> None:
        """Fail every command of the group with ``failure``; log once per episode."""
        key = (failure.reason, failure.cause)
        self.stats.write_errors[key] = self.stats.write_errors.get(key, 0) + len(group)
        if self._failing is None or (self._failing.reason, self._failing.cause) != key:
            log.warning(
                "storage writes failing: %s",
                failure.advice,
                extra={"reason": failure.reason, "cause": failure.cause, "error": str(exc)},
            )
            self._failing = failure
        self._failed_commands += len(group)
        if failure.cause == PANIC and self.broken is None:
            self.broken = failure
            if self._on_broken is not None:
                try:
                    self._on_broken()
                except Exception:
                    log.exception("broken-storage subscriber failed")
        self._finish(group, [(False, failure.error()) for _ in group], False)

    def _recovered(self) -> None:
        """A commit succeeded: end the failure episode, if any, with one line."""
        if self._failing is None:
            return
        log.warning(
            "storage writes succeed again",
            extra={
                "reason": self._failing.reason,
                "cause": self._failing.cause,
                "refused": self._failed_commands,
            },
        )
        self._failing = None
        self._failed_commands = 0

    def _apply(
        self, job: _AnyJob, txn: lmdb.Transaction, now_ns: int, feed: tuple[int, bytes]
    ) -> tuple[bool, Any, tuple[int, bytes]]:
        """Apply one command; on success record its change. ``feed`` is the newest change's
        (position, checksum) before it; returns (ok, value, the newest change's after it)."""
        if isinstance(job, _ReplicatedJob):
            applied = _apply_replicated(job.command, txn, now_ns, feed)
            self.lead = leadership.read(txn, self._tables)  # it may have changed the record
            return applied
        command = job.command
        lead = self.lead
        if not lead.may_write:
            return False, leadership.not_primary(lead), feed
        if not self._may_write():
            return False, _leadership_lost(committed=False), feed
        admits = self.admits
        if admits is not None and not command.moving_in:
            refusal = admits(command.session_id)
            if refusal is not None:
                return False, refusal, feed
        recording = RecordingTxn(txn, self._tables)
        try:
            result = command.apply(recording, now_ns)
        except errors.SessionLogError as exc:
            if recording.wrote:  # its writes cannot be taken back but with the transaction's
                raise _HalfWritten(exc) from exc
            return False, exc, feed
        if not recording.wrote:
            if isinstance(result, Written):
                result.position = feed[0]
            return True, result, feed
        position = feed[0] + 1
        if not lead.epoch:  # the store's first write: it takes the first epoch
            self.lead = lead = leadership.stamped(lead, position)
            leadership.write(txn, self._tables, lead)
        if isinstance(result, Written):
            result.position = position
        record = changes.encode_change(
            position, command.kind, command.session_id, now_ns, recording, lead.epoch
        )
        if self._checksums:
            checksum = changes.chain(feed[1], record, recording.events)
            stored = changes.with_checksum(record, checksum)
        else:
            stored, checksum = record, b""
        txn.put(schema.u64(position), stored, db=self._tables.changes)
        feed_index.note(txn, self._tables, position, command.session_id)
        self._group_events += recording.event_count
        return True, result, (position, checksum)

    def _unless_deposed(
        self, group: list[_AnyJob], outcomes: list[tuple[bool, Any]]
    ) -> list[tuple[bool, Any]]:
        """The outcomes to give after the commit: when ``may_write`` has turned off meanwhile,
        this process may no longer be the primary, so its own writes are not acknowledged."""
        if self._may_write():
            return outcomes
        return [
            (False, _leadership_lost(committed=True)) if ok and isinstance(job, _Job) else (ok, v)
            for job, (ok, v) in zip(group, outcomes, strict=True)
        ]

    def _finish(self, group: list[_AnyJob], outcomes: list[tuple[bool, Any]], fed: bool) -> None:
        """Give a group's outcomes, or with deferred sync queue them for the next sync."""
        if self._deferred_sync:
            self._pending.append((group, outcomes, fed))
        else:
            self._give(group, outcomes, fed)

    def _give(self, group: list[_AnyJob], outcomes: list[tuple[bool, Any]], fed: bool) -> None:
        changed: set[str] = {changes.FEED_KEY} if fed else set()
        for job, (ok, value) in zip(group, outcomes, strict=True):
            if ok:
                changed.update(job.command.touched())
            if ok and isinstance(job, _Job) and job.repeat and not self._closed and value.more:
                self._background.append(job)  # its next run, behind the jobs already waiting
                continue
            self._settle(job, value, ok)
        if changed and self._on_commit is not None:
            try:
                self._on_commit(changed)
            except Exception:
                log.exception("commit subscriber failed")
        if self._on_loop_commit is not None:
            self._changed = changed
        self._deliver()  # last: the loop it wakes finds the GIL free as soon as the writer waits

    def _settle(self, job: _AnyJob, value: Any, ok: bool = False) -> None:
        """Give a job its outcome once; a second one (after a failed retry) is dropped. A
        thread's future is resolved here; a loop's waits for ``_deliver``."""
        if job.settled:
            return
        job.settled = True
        future = job.future
        if isinstance(future, Future):
            _resolve(future, ok, value)
        else:
            self._replies.append((future, ok, value))

    def _deliver(self) -> None:
        """Hand the loops their futures' outcomes, and ``on_loop_commit``'s loop what the group
        changed: one ``call_soon_threadsafe`` per loop."""
        changed = self._changed
        if changed:
            self._changed = set()
        elif not self._replies:
            return
        replies, self._replies = self._replies, []
        by_loop: dict[asyncio.AbstractEventLoop, list[_Reply]] = {}
        for reply in replies:
            by_loop.setdefault(reply[0].get_loop(), []).append(reply)
        if changed and self._on_loop_commit is not None:
            loop, notify = self._on_loop_commit
            with contextlib.suppress(RuntimeError):  # a closed loop: no one is waiting any more
                loop.call_soon_threadsafe(_resolve_all, by_loop.pop(loop, []), notify, changed)
        for loop, theirs in by_loop.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve_all, theirs)


def _apply_replicated(
    command: ReplicatedCommand, txn: lmdb.Transaction, now_ns: int, feed: tuple[int, bytes]
) -> tuple[bool, Any, tuple[int, bytes]]:
    """Apply a command that brings its own change records: the feed moves to its newest."""
    try:
        applied = command.apply(txn, now_ns)
    except errors.SessionLogError as exc:
        return False, exc, feed
    if not applied.last_position:
        return True, applied, feed
    return True, applied, (applied.last_position, applied.last_checksum)


def _always() -> bool:
    return True


def _only_background(group: list[_AnyJob]) -> bool:
    """Whether the group is background jobs only (a lone run, or the stopping group's): they
    come after every other command of a group, so its first job tells."""
    first = group[0]
    return isinstance(first, _Job) and first.background


class _HalfWritten(Exception):
    """A command refused itself after it had written: the transaction is aborted."""

    def __init__(self, refusal: errors.SessionLogError) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


PAUSE_ENV = "SESSIONLOG_TEST_PAUSE_BEFORE_SYNC"
"""Tests only: a file path, TRIGGER. Once TRIGGER exists, the next time the writer is about to
sync pending commits (deferred sync: by the next commit, or by ``env.sync``) it adds its PID to
TRIGGER.paused and sleeps: a test kills the process there, between a commit's data sync and the
sync of its meta page, and checks that nothing acknowledged was lost."""


def _test_pause() -> Callable[[], None] | None:
    trigger = os.environ.get(PAUSE_ENV, "")
    if not trigger:
        return None

    def pause() -> None:
        if not os.path.exists(trigger):
            return
        with open(f"{trigger}.paused", "a") as marker:  # a line per process (worker)
            marker.write(f"{os.getpid()}\n")
        time.sleep(3600)

    return pause


def _leadership_lost(committed: bool) -> errors.LeadershipLost:
    if committed:
        message = (
            "this server lost its leadership while the write was being committed: it may be "
            "stored, but is not acknowledged. Retry with the same request id against the "
            "current primary; it finds the write if it survived"
        )
    else:
        message = (
            "this server has lost its leadership (it could not renew it in time): nothing was "
            "written. Retry against the current primary"
        )
    return errors.LeadershipLost(message, committed=committed)


def _claim(future: Waiting) -> bool:
    """False when the caller gave up before its command was taken: it is never written."""
    if isinstance(future, Future):
        return future.set_running_or_notify_cancel()
    return not future.cancelled()


def _resolve(future: Waiting, ok: bool, value: Any) -> None:
    if future.done():  # a loop future its caller cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _resolve_all(
    replies: list[_Reply],
    notify: Callable[[set[str]], None] | None = None,
    changed: set[str] | None = None,
) -> None:
    """On a loop: resolve its futures of one group, then tell ``notify`` what it changed."""
    for future, ok, value in replies:
        _resolve(future, ok, value)
    if notify is not None and changed:
        try:
            notify(changed)
        except Exception:
            log.exception("commit subscriber failed")


def _damaged(command: _Queued, exc: Exception) -> errors.DataCorrupted:
    """A write LMDB could not make because a page on its way is damaged; nothing was written."""
    target = f"session '{command.session_id}'" if command.session_id else "the store"
    return damage.corrupted(
        f"the write to {target}", exc, failed="could not be made", session_id=command.session_id
    )


MAP = "map"
DISK = "disk"
IO = "io"
PANIC = "panic"

#: Below this much free space, an I/O error on commit is taken for a full disk: LMDB reports a
#: short write (the filesystem ran out of room part-way) as EIO, not ENOSPC.
LOW_DISK_BYTES = 1 << 20

_ERRNO_BY_TEXT = {os.strerror(code): code for code in errno.errorcode}


@dataclass(frozen=True)
class StorageFailure:
    """Why the storage refused a commit: the error clients get, and what to do about it."""

    reason: str
    """STORAGE_FULL or STORAGE_IO_ERROR."""
    cause: str
    """map, disk, io or panic: the ErrorInfo metadata that tells full map from full disk."""
    advice: str
    """The message clients get: what happened and what to do."""
    detail: str = ""
    """The OS error's name (ENOSPC, EIO), when there is one."""

    @property
    def retry_alone(self) -> bool:
        """A full map may refuse a large command yet take the small ones queued beside it."""
        return self.cause == MAP

    def error(self) -> errors.SessionLogError:
        """A fresh error for one caller (errors carry tracebacks, so are never shared)."""
        metadata = {"cause": self.cause, **({"errno": self.detail} if self.detail else {})}
        if self.reason == errors.StorageFull.reason:
            return errors.StorageFull(self.advice, **metadata)
        return errors.StorageIoError(self.advice, **metadata)


def storage_failure(
    exc: BaseException, free_bytes: int | None, needed: int
) -> StorageFailure | None:
    """Classify a failed write transaction; None when it is not the storage's doing (a bug).

    ``free_bytes`` is the space left on the data directory's filesystem after the failure and
    ``needed`` roughly what the group wrote: together they tell LMDB's short write on a full
    disk (reported as EIO) from a disk that really failed.
    """
    if isinstance(exc, lmdb.MapFullError):
        return StorageFailure(
            errors.StorageFull.reason,
            MAP,
            "the LMDB map is full: nothing was written; reads still work. Restart the server "
            "with a larger --map-size",
        )
    if isinstance(exc, lmdb.PanicError):
        return StorageFailure(
            errors.StorageIoError.reason,
            PANIC,
            "the storage engine stopped after the disk failed a write to its data file (LMDB "
            "panic): this write was not acknowledged and no write can succeed until the server "
            "is restarted. Check the disk, restart the server, then retry (with the same "
            "request id)",
        )
    code = _os_errno(exc)
    if code is None:
        return None
    full = code in (errno.ENOSPC, errno.EDQUOT) or (
        code == errno.EIO
        and free_bytes is not None
        and free_bytes < max(LOW_DISK_BYTES, 2 * needed)
    )
    if full:
        return StorageFailure(
            errors.StorageFull.reason,
            DISK,
            "the disk holding the data directory is full: nothing was written; reads still "
            "work. Free disk space there; writes resume by themselves, no restart needed",
            errno.errorcode.get(code, str(code)),
        )
    return StorageFailure(
        errors.StorageIoError.reason,
        IO,
        f"the disk failed the write ({os.strerror(code)}): nothing was written; reads may still "
        "work. Retry later; if it persists, check the disk (the server log has the details)",
        errno.errorcode.get(code, str(code)),
    )


def _os_errno(exc: BaseException) -> int | None:
    """The OS error number behind a failed write, if it was the OS that failed it.

    py-lmdb raises DiskError for ENOSPC, a plain ``lmdb.Error`` naming the OS error (``what:
    strerror``) for other system errors, and subclasses for LMDB's own codes, which are not
    the disk's doing.
    """
    if isinstance(exc, OSError):
        return exc.errno
    if isinstance(exc, lmdb.DiskError):
        return errno.ENOSPC
    if type(exc) is lmdb.Error:
        return _ERRNO_BY_TEXT.get(str(exc).rpartition(": ")[2])
    return None


def _group_bytes(group: list[_AnyJob]) -> int:
    return sum(job.command.size() for job in group)
