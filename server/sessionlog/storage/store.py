"""The store: one data folder's LMDB environment behind one facade.

``Store`` composes the modules that each do one job, and adds only the transaction a read runs
in and the writer a write is queued on:

- ``opening``: the folder's lock, its checks, LMDB and the folder's identity;
- ``preparing``: the checks and commands a write needs before it reaches the writer;
- ``writer`` (and ``commands`` and its kin): the single writer thread and its group commit;
- ``fold_cache``: each session's memoized fold, and the surface, state and message pages
  served from it;
- ``views``: GetSession, ListSessions, ListEvents and ListLeaseAudit reads;
- ``eraser``: deletes, redactions, erasing by prefix or slot, the retention sweep.

Reads run in the caller's thread inside short read transactions; writes go through the single
:class:`~sessionlog.storage.writer.Writer` thread and its group commit. See ``schema`` for the
layout and its invariants.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.struct_pb2 import Struct

from sessionlog import errors, fold
from sessionlog.defaults import DEFAULT_MAP_SIZE, DEFAULT_REQUEST_ID_TTL_SECONDS, GROUP, SYNC
from sessionlog.records import Filter, SessionRecord
from sessionlog.retention import Policy
from sessionlog.storage import (
    changes,
    commands,
    damage,
    erasure,
    folder,
    following,
    identity,
    imports,
    indexes,
    leadership,
    ledger,
    preparing,
    purge,
    rebuild,
    records,
    retention,
    views,
)
from sessionlog.storage.changes import (
    ApplyChangesCommand,
    ApplyResult,
    ReceivedChange,
    head,
    read_changes,
)
from sessionlog.storage.commands import AppendBatch, AppendResult, ForkResult, LeaseChange
from sessionlog.storage.eraser import ERASE_BATCH, Eraser
from sessionlog.storage.fold_cache import FoldCache, MessagesPage, Resume, SurfaceSnapshot
from sessionlog.storage.leadership import Change as LeadershipChange
from sessionlog.storage.leadership import Leadership
from sessionlog.storage.opening import open_folder
from sessionlog.storage.preparing import (
    BULK_CHECK_FROM,
    MAX_HOLDER_BYTES,
    MAX_LEASE_TTL_NS,
    MAX_REQUEST_ID_BYTES,
    MIN_LEASE_TTL_NS,
    check_request_id,
    prepare_append,
    prepare_seed,
)
from sessionlog.storage.reads import Txn, load_meta, read_range
from sessionlog.storage.schema import SessionMeta
from sessionlog.storage.views import AuditEntry, EventsPage, SessionView
from sessionlog.storage.writer import LoopCommit, Writer
from sessionlog.v1.event_pb2 import Event

__all__ = [
    "BULK_CHECK_FROM",
    "ERASE_BATCH",
    "MAX_HOLDER_BYTES",
    "MAX_LEASE_TTL_NS",
    "MAX_REQUEST_ID_BYTES",
    "MIN_LEASE_TTL_NS",
    "AppendBatch",
    "AppendResult",
    "AuditEntry",
    "EventsPage",
    "MessagesPage",
    "Resume",
    "SessionView",
    "Store",
    "StoreConfig",
    "SurfaceSnapshot",
    "check_request_id",
    "prepare_append",
    "prepare_seed",
]


@dataclass(frozen=True)
class StoreConfig:
    """How the store opens LMDB and what it accepts."""

    map_size: int = DEFAULT_MAP_SIZE
    """Largest size the data file may grow to, in bytes (LMDB's map size)."""
    durability: str = SYNC
    """When a write is acknowledged (``defaults.DURABILITY_MODES``): sync, once its commit is on
    disk; group, the same, with the meta page of a commit synced by the next one (``Writer``);
    nosync, at once (faster; a machine crash may lose recent appends)."""
    limits: fold.Limits = fold.DEFAULT_LIMITS
    request_id_ttl_seconds: int = DEFAULT_REQUEST_ID_TTL_SECONDS
    """How long a request_id is remembered for replays."""
    fold_cache_sessions: int = 1024
    """How many sessions keep a memoized surface in memory."""
    fold_cache_bytes: int = 256 << 20
    """About how much stored data the memoized surfaces may cover in all (their heap is a small
    multiple of it); least recently read sessions are dropped first."""
    record_checksums: bool = True
    """Chain a checksum into every change record (see ``changes``). Off only for the benchmark
    that measures their cost side by side: records then carry none, like those written before
    checksums existed."""
    replica_of: str = ""
    """The primary this folder follows when opened as a replica ("" for a primary): recorded
    in the folder, so that opening a former replica as a primary starts a new history."""
    elected: bool = False
    """The folder's role comes from an election (a --cluster member): opening it changes no role
    and starts no history (see ``identity.reconcile``)."""


class Store:
    """One LMDB environment holding every session."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: StoreConfig | None = None,
        on_commit: Callable[[set[str]], None] | None = None,
        lock: folder.FolderLock | None = None,
        on_broken: Callable[[], None] | None = None,
        prepared: bool = False,
        may_write: Callable[[], bool] | None = None,
        on_loop_commit: LoopCommit | None = None,
    ) -> None:
        """Open (or create) the store in ``path``, owning the folder: with ``lock`` (taken by a
        parent process, which keeps it), under that lock; else under one taken here
        (FolderInUse when another server holds it) and given up by ``close``. A folder that
        has lost its data raises FolderDamaged. ``on_broken`` runs (on the writer thread) once
        LMDB panics: see ``Writer``.

        ``prepared``: the lock's owner has already opened this folder once since taking the
        lock (checked it, and worked out its history: ``identity.reconcile``), as the
        supervisor of several worker processes does before starting them; each worker then
        only reads the identity. Reconciling again, in several processes at once, would read
        the others' new instances as a restore.

        ``may_write``: a process-level leadership check (an election's lease), asked by the
        writer before each write applies and before it is acknowledged (see ``Writer``).

        ``on_loop_commit``: (a loop, a callable) called on that loop with the sessions each
        commit changed, in the same wakeup of the loop as the commit's replies."""
        self.path = Path(path)
        self.config = config = config or StoreConfig()
        self._owns_lock = lock is None
        opened = open_folder(
            self.path,
            lock=lock,
            map_size=config.map_size,
            durability=config.durability,
            replica_of=config.replica_of,
            elected=config.elected,
            prepared=prepared,
        )
        self._lock = opened.lock
        self.env = opened.env
        self.tables = opened.tables
        self.identity = opened.identity
        self.writer = Writer(
            self.env,
            self.tables,
            on_commit=on_commit,
            on_broken=on_broken,
            checksums=config.record_checksums,
            may_write=may_write,
            deferred_sync=config.durability == GROUP,
            on_loop_commit=on_loop_commit,
        )
        self.writer.lead = self.leadership()
        self.folds = FoldCache(
            self.env, self.tables, config.fold_cache_sessions, config.fold_cache_bytes
        )
        self.eraser = Eraser(self.env, self.tables, self.writer, self.folds)

    @property
    def _folds(self) -> OrderedDict[int, fold.SurfaceFold]:
        """The memoized folds by sid (``FoldCache.folds``), for tests that look at the memo."""
        return self.folds.folds

    @property
    def _fold_bytes(self) -> dict[int, int]:
        """The stored bytes each memoized fold has read (``FoldCache.fold_bytes``)."""
        return self.folds.fold_bytes

    def close(self) -> None:
        """Finish queued writes, then close the environment and give up the folder (unless
        the lock was handed in: its owner keeps it)."""
        self.writer.close()
        self.env.close()
        if self._owns_lock:
            self._lock.release()

    # -- writes: each returns a future resolved once durable (or failed with its error) ---------
    # submit_* suit any thread; commit_* are for a caller on the running event loop (the gRPC
    # handlers): the same writes, with a future of that loop (see ``Writer.submit_on_loop``).

    def submit_append(self, batch: AppendBatch) -> Future[AppendResult]:
        """Queue an append (or a create, for a create_only batch)."""
        return self.writer.submit(self._append_command(batch))

    def commit_append(self, batch: AppendBatch) -> asyncio.Future[AppendResult]:
        """``submit_append``, for a caller to await on the running loop."""
        return self.writer.submit_on_loop(self._append_command(batch))

    def _append_command(self, batch: AppendBatch) -> commands.AppendCommand:
        return preparing.append_command(self.tables, batch, self.config.request_id_ttl_seconds)

    def submit_fork(
        self,
        parent_id: str,
        at_seq: int | None,
        child_id: str = "",
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str = "",
        generated_id: bool = False,
    ) -> Future[ForkResult]:
        """Queue a fork of ``parent_id`` at ``at_seq`` (None: the whole log) into ``child_id``
        (generated when empty). A lease already taken on ``child_id`` must be named. A
        ``request_id`` seen before on the parent replays that fork's child; ``generated_id``
        says ``child_id`` was made up by the caller, so a retry need not repeat it."""
        command = self._fork_command(
            parent_id, at_seq, child_id, lease_holder, lease_token, request_id, generated_id
        )
        return self.writer.submit(command)

    def commit_fork(
        self,
        parent_id: str,
        at_seq: int | None,
        child_id: str = "",
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str = "",
        generated_id: bool = False,
    ) -> asyncio.Future[ForkResult]:
        """``submit_fork``, for a caller to await on the running loop."""
        command = self._fork_command(
            parent_id, at_seq, child_id, lease_holder, lease_token, request_id, generated_id
        )
        return self.writer.submit_on_loop(command)

    def _fork_command(
        self,
        parent_id: str,
        at_seq: int | None,
        child_id: str,
        lease_holder: str,
        lease_token: int,
        request_id: str,
        generated_id: bool,
    ) -> commands.ForkCommand:
        return preparing.fork_command(
            self.tables,
            self.config.request_id_ttl_seconds,
            parent_id,
            at_seq,
            child_id,
            lease_holder,
            lease_token,
            request_id,
            generated_id,
        )

    def commit_import(self, batch: imports.ImportBatch) -> asyncio.Future[AppendResult]:
        """Queue one ImportSession chunk (``imports``), for a caller on the running loop."""
        return self.writer.submit_on_loop(imports.ImportCommand(self.tables, batch))

    def submit_import(self, batch: imports.ImportBatch) -> Future[AppendResult]:
        """``commit_import`` for any thread."""
        return self.writer.submit(imports.ImportCommand(self.tables, batch))

    def session_records(self, session_id: str, now_ns: int | None = None) -> imports.SessionRecords:
        """A session's meta, record, request records, lease record and audit, in one
        transaction."""
        now = time.time_ns() if now_ns is None else now_ns
        ttl_ns = self.config.request_id_ttl_seconds * 1_000_000_000
        with self.env.begin() as txn:
            return imports.read_records(txn, self.tables, session_id, now, ttl_ns)

    def submit_lease(
        self, action: str, session_id: str, holder: str, ttl_ns: int = 0, force: bool = False
    ) -> Future[LeaseChange]:
        """Queue a lease change: action is "acquire", "renew" or "release"."""
        return self.writer.submit(self._lease_command(action, session_id, holder, ttl_ns, force))

    def commit_lease(
        self, action: str, session_id: str, holder: str, ttl_ns: int = 0, force: bool = False
    ) -> asyncio.Future[LeaseChange]:
        """``submit_lease``, for a caller to await on the running loop."""
        command = self._lease_command(action, session_id, holder, ttl_ns, force)
        return self.writer.submit_on_loop(command)

    def _lease_command(
        self, action: str, session_id: str, holder: str, ttl_ns: int, force: bool
    ) -> commands.LeaseCommand:
        return preparing.lease_command(self.tables, action, session_id, holder, ttl_ns, force)

    # -- erasure (see ``eraser`` and ``erasure``) ------------------------------------------------

    def delete_command(
        self,
        session_id: str,
        *,
        expected_seq: int | None = None,
        lease_holder: str = "",
        force: bool = False,
        actor: str = "",
        reason: str = "",
    ) -> erasure.DeleteCommand:
        """A delete of ``session_id``, its feed records found in a read transaction (through
        ``feed_index``: call it off the event loop); submit it with ``writer.submit``."""
        return self.eraser.delete_command(
            session_id,
            expected_seq=expected_seq,
            lease_holder=lease_holder,
            force=force,
            actor=actor,
            reason=reason,
        )

    async def commit_delete(self, command: erasure.DeleteCommand) -> erasure.DeleteResult:
        """Run a delete (from ``delete_command``) on the running loop; its fold memo is
        dropped, so no erased content stays in this process's memory."""
        return await self.eraser.commit_delete(command)

    def delete(self, session_id: str, **options: Any) -> erasure.DeleteResult:
        """Erase a session, blocking until durable (see ``delete_command``)."""
        return self.eraser.delete(session_id, **options)

    def redact_command(
        self,
        session_id: str,
        seqs: Sequence[int],
        *,
        reason: str = "",
        lease_holder: str = "",
        actor: str = "",
    ) -> erasure.RedactCommand:
        """A redaction of events ``seqs`` of ``session_id``, its feed records found by a scan
        in a read transaction (through ``feed_index``: call it off the event loop); submit it
        with ``writer.submit``."""
        return self.eraser.redact_command(
            session_id, seqs, reason=reason, lease_holder=lease_holder, actor=actor
        )

    def redact(self, session_id: str, seqs: Sequence[int], **options: Any) -> erasure.RedactResult:
        """Redact events, blocking until durable (see ``redact_command``)."""
        return self.eraser.redact(session_id, seqs, **options)

    def erase_prefix(
        self,
        prefix: str,
        *,
        query: Filter | None = None,
        actor: str = "",
        reason: str = "",
        batch: int = ERASE_BATCH,
    ) -> tuple[int, int, int]:
        """Delete every session whose id starts with ``prefix`` and that matches ``query``
        (``Eraser.erase_prefix``). Blocks; returns (sessions erased, events they held, the last
        erase's position)."""
        return self.eraser.erase_prefix(
            prefix, query=query, actor=actor, reason=reason, batch=batch
        )

    def erase_slot_copies(
        self,
        in_slot: Callable[[str], bool],
        copy_of: Callable[[str], errors.SessionLogError | None],
        *,
        actor: str = "",
        reason: str = "",
        batch: int = ERASE_BATCH,
    ) -> tuple[int, int, int]:
        """Delete every stored session ``in_slot`` accepts that ``copy_of`` finds a copy
        (``Eraser.erase_slot_copies``); returns what ``erase_prefix`` does."""
        return self.eraser.erase_slot_copies(
            in_slot, copy_of, actor=actor, reason=reason, batch=batch
        )

    def delete_batch(
        self,
        ids: Sequence[str],
        *,
        actor: str,
        reason: str,
        copy_of: Callable[[str], errors.SessionLogError | None] | None = None,
        still_due: Callable[[Txn, str, SessionMeta, int], bool] | None = None,
    ) -> tuple[int, int, int]:
        """Delete ``ids`` (force: leases do not stop it), all queued before any is awaited
        (``Eraser.delete_batch``); blocks. Returns (sessions erased, events they held, the last
        erase's position)."""
        return self.eraser.delete_batch(
            ids, actor=actor, reason=reason, copy_of=copy_of, still_due=still_due
        )

    def sweep(
        self,
        policy: Policy,
        *,
        ours: Callable[[str], bool] = lambda _: True,
        batch: int = retention.SWEEP_BATCH,
    ) -> retention.Swept:
        """One retention sweep (``Eraser.sweep``). Blocks; call it where writes are accepted,
        off the event loop."""
        return self.eraser.sweep(policy, ours=ours, batch=batch)

    def purging(self) -> list[purge.Purge]:
        """The long sessions deleted whose rows are still being freed (``purge``)."""
        return self.eraser.purging()

    def purging_count(self) -> int:
        """How many deleted sessions are still being freed (the ``purges`` table's entries)."""
        if self.tables.purges is None:
            return 0
        with self.env.begin() as txn:
            entries: int = txn.stat(self.tables.purges)["entries"]
        return entries

    def purge_next(self) -> purge.Purged | None:
        """The next chunk of a purge (``Eraser.purge_next``); None when none is under way.
        Blocks; call it where writes are accepted, off the event loop."""
        return self.eraser.purge_next()

    def start_purge(self) -> Future[purge.Purged] | None:
        """The oldest purge, handed to the writer whole (``Eraser.start_purge``); None when
        none is under way."""
        return self.eraser.start_purge()

    def purge_all(self) -> int:
        """Run every purge to its end (``Eraser.purge_all``); blocks. The chunks run."""
        return self.eraser.purge_all()

    def forget_fold(self, sid: int) -> None:
        """Drop a session's memoized fold (a redaction or delete made it stale)."""
        self.folds.forget(sid)

    def submit_update(
        self, session_id: str, given: SessionRecord, paths: Sequence[str] | None
    ) -> Future[records.Updated]:
        """Queue an UpdateSession: the fields ``paths`` names (None: those ``given`` fills)."""
        return self.writer.submit(self._update_command(session_id, given, paths))

    def commit_update(
        self, session_id: str, given: SessionRecord, paths: Sequence[str] | None
    ) -> asyncio.Future[records.Updated]:
        """``submit_update``, for a caller to await on the running loop."""
        return self.writer.submit_on_loop(self._update_command(session_id, given, paths))

    def _update_command(
        self, session_id: str, given: SessionRecord, paths: Sequence[str] | None
    ) -> records.UpdateSessionCommand:
        return preparing.update_command(self.tables, session_id, given, paths)

    def submit_apply(self, received: Sequence[ReceivedChange]) -> Future[ApplyResult]:
        """Queue changes a replica received from its primary, applied verbatim in one commit."""
        return self.writer.submit_replicated(ApplyChangesCommand(self.tables, received))

    def append(self, session_id: str, events: Sequence[Event], **options: Any) -> AppendResult:
        """Validate and append, blocking until durable. Convenience for tools and tests."""
        batch = prepare_append(session_id, events, limits=self.config.limits, **options)
        return self.submit_append(batch).result()

    # -- reads ----------------------------------------------------------------------------------

    def log_number(self, session_id: str) -> int:
        """An opaque number for the session's current log (its internal id; 0: not stored): a
        session deleted and written again gets another, so what is bound to it (a page token)
        does not carry over to the new log."""
        meta = self.meta(session_id)
        return 0 if meta is None else meta.sid

    def meta(self, session_id: str) -> SessionMeta | None:
        """The session's metadata, or None if it was never written."""
        with self.env.begin() as txn:
            return load_meta(txn, self.tables, session_id)

    def log_version(self, session_id: str) -> tuple[int, tuple[int, int]]:
        """The session's next seq and an opaque stamp of its stored bytes: equal stamps and
        next seqs mean equal events (the stamp changes when the session is deleted and written
        again, or redacted). What a cache of read events keys on."""
        meta, mark = self.folds.meta_and_mark(session_id)
        if meta is None:
            return 0, (-1, 0)
        return meta.next_seq, (meta.sid, mark)

    def next_seq(self, session_id: str) -> int:
        """The seq the session's next event will get: its event count (0 if never written)."""
        meta = self.meta(session_id)
        return 0 if meta is None else meta.next_seq

    def read_session(
        self, session_id: str, start: int, stop: int | None = None, max_bytes: int = 1 << 62
    ) -> list[bytes]:
        """Stored events of ``session_id`` with start <= seq < stop, as ``read_events`` returns
        them, found by the session's id: the internal id it is stored under never leaves the
        store. The session's record and its events are read in one transaction."""
        with self.env.begin() as txn:
            meta = load_meta(txn, self.tables, session_id)
            if meta is None:
                return []
            end = meta.next_seq if stop is None else min(stop, meta.next_seq)
            return read_range(txn, self.tables, meta.sid, start, end, max_bytes, session_id)

    def read_events(
        self,
        sid: int,
        start: int,
        stop: int | None = None,
        max_bytes: int = 1 << 62,
        session_id: str = "",
    ) -> list[bytes]:
        """Stored events of the session stored under internal id ``sid`` with start <= seq <
        stop, in seq order, as stored (not decoded: see ``decode_events``). Storage's own reads
        and tools that inspect the layout use it; everyone else reads by id (``read_session``).

        Returns the first event whatever its size, then more while their total stays within
        ``max_bytes``. Costs O(events returned): one cursor walk over a contiguous key range.
        ``session_id`` names the session in a DataCorrupted error.
        """
        with self.env.begin() as txn:  # no buffers: values come out as bytes, copied once
            return read_range(txn, self.tables, sid, start, stop, max_bytes, session_id)

    @staticmethod
    def decode_events(raws: Sequence[bytes], first_seq: int, session_id: str) -> list[Event]:
        """Stored events (from ``read_events``) decoded; DataCorrupted names one that is not."""
        return damage.decode_events(raws, first_seq, session_id)

    def read_changes(self, start: int, max_bytes: int = 1 << 62) -> list[bytes]:
        """Change records from position ``start`` on, events included, as the feed sends them."""
        with self.env.begin() as txn:
            return read_changes(txn, self.tables, start, max_bytes)

    def head(self) -> tuple[int, int]:
        """The newest change's (position, commit time in ns); (0, 0) for an empty store."""
        with self.env.begin() as txn:
            return head(txn, self.tables)

    def feed_bounds(self) -> tuple[int, int]:
        """The oldest and the newest stored change's positions; (0, 0) for an empty feed."""
        with self.env.begin() as txn:
            return changes.first(txn, self.tables), head(txn, self.tables)[0]

    def tail(self) -> tuple[int, bytes]:
        """The newest change's (position, fingerprint); (0, b"") for an empty store."""
        with self.env.begin() as txn:
            return changes.tail(txn, self.tables)

    def checksum_at(self, position: int) -> bytes | None:
        """The checksum of the change at ``position`` (what a replica holding it computed too),
        or None when this store has no change there."""
        with self.env.begin() as txn:
            return changes.fingerprint_at(txn, self.tables, position)

    def read_followed(
        self,
        start: int,
        admits: Callable[[str], bool],
        query: Filter,
        *,
        max_records: int,
        max_bytes: int,
    ) -> following.FollowedRead:
        """The changes a FollowSessions stream follows, from position ``start`` on
        (``following.read_followed``)."""
        with self.env.begin() as txn:
            return following.read_followed(
                txn,
                self.tables,
                start,
                admits,
                query,
                max_records=max_records,
                max_bytes=max_bytes,
            )

    def holds_feed_at(self, position: int, checksum: bytes) -> bool:
        """Whether this store's feed is the history whose change at ``position`` has
        ``checksum`` (``changes.holds_after``)."""
        with self.env.begin() as txn:
            return changes.holds_after(txn, self.tables, position, checksum)

    def check_feed_after(self, start: int, checksum: bytes) -> None:
        """HistoryDiverged unless this store's change at ``start - 1`` has ``checksum``."""
        with self.env.begin() as txn:
            changes.check_after(txn, self.tables, start, checksum)

    def changes_from_others(self, after: int) -> tuple[int, set[str]]:
        """The newest change-feed position, and the sessions (with ``changes.FEED_KEY``) that
        changes after position ``after`` wrote, leaving out the commits of this store's own
        writer: what other processes writing this folder have committed since (the workers of
        one server; see ``sessionlog.workers``)."""
        with self.env.begin() as txn:
            return changes.sessions_after(txn, self.tables, after, self.writer.wrote(after))

    def history(self) -> tuple[str, int]:
        """The folder's history id and the position it began after."""
        with self.env.begin() as txn:
            return identity.read(txn, self.tables)

    def submit_adopt_history(self, history_id: str, start: int) -> Future[ApplyResult]:
        """Queue a replica's taking of its primary's history id."""
        command = identity.AdoptHistoryCommand(self.tables, history_id, start)
        return self.writer.submit_replicated(command)

    def leadership(self) -> Leadership:
        """The folder's leadership record as committed now (see ``leadership``)."""
        with self.env.begin() as txn:
            return leadership.read(txn, self.tables)

    def rejoin_note(self) -> str:
        """What the folder's last rejoin discarded, in one sentence; "" when it never did."""
        with self.env.begin() as txn:
            return rebuild.read_note(txn, self.tables)

    def submit_leadership(
        self, change: LeadershipChange, new_history: bool = False, follows: str = ""
    ) -> Future[tuple[Leadership, Leadership]]:
        """Queue a change of the leadership record (see ``identity.LeadershipCommand``); the
        future holds the records (before, after) once durable."""
        command = identity.LeadershipCommand(self.tables, change, new_history, follows)
        done: Future[tuple[Leadership, Leadership]] = Future()

        def settle(applied: Future[ApplyResult]) -> None:
            error = applied.exception()
            if error is not None:
                done.set_exception(error)
            else:
                assert command.outcome is not None
                done.set_result(command.outcome)

        self.writer.submit_replicated(command).add_done_callback(settle)
        return done

    def submit_fence(self, epoch: int, primary: str) -> Future[tuple[Leadership, Leadership]]:
        """Learn of ``epoch`` (led by ``primary``, if known): a primary stops taking writes."""
        return self.submit_leadership(lambda record, _: leadership.fenced(record, epoch, primary))

    def submit_follow(self, epoch: int, primary: str) -> Future[tuple[Leadership, Leadership]]:
        """A replica turns to ``primary``, the primary of ``epoch`` (``leadership.followed``)."""
        return self.submit_leadership(lambda record, _: leadership.followed(record, epoch, primary))

    def submit_promote(self, epoch: int = 0) -> Future[tuple[Leadership, Leadership]]:
        """Take writes in a new epoch (``epoch``, or one above every epoch known), from the next
        position on, with a new history id. AlreadyPrimary on a folder that takes writes."""
        return self.submit_leadership(leadership.promotion(epoch), new_history=True)

    def session(self, session_id: str, now_ns: int | None = None) -> SessionView:
        """A session's metadata, live lease, lease audit and record, read in one transaction."""
        now = time.time_ns() if now_ns is None else now_ns
        with self.env.begin() as txn:
            return views.session(txn, self.tables, session_id, now)

    def lease_audit(
        self,
        after: tuple[str, int] | None = None,
        prefix: str = "",
        limit: int = 100,
        keep: Callable[[str], bool] = lambda session_id: True,
    ) -> tuple[list[AuditEntry], bool]:
        """Up to ``limit`` lease audit records of the sessions whose id starts with ``prefix``
        (and that ``keep`` accepts), in key order, strictly after ``after`` (session id, record
        number), read in one transaction (``views.lease_audit``); and whether more may follow."""
        with self.env.begin() as txn:
            return views.lease_audit(txn, self.tables, after, prefix, limit, keep)

    def list_sessions(
        self, after: str = "", prefix: str = "", limit: int = 100, now_ns: int | None = None
    ) -> tuple[list[SessionView], bool]:
        """Up to ``limit`` sessions in id order, strictly after ``after``, whose id starts with
        ``prefix``, each with its live lease (``views.list_sessions``); and whether more
        follow."""
        now = time.time_ns() if now_ns is None else now_ns
        with self.env.begin() as txn:
            return views.list_sessions(txn, self.tables, after, prefix, limit, now)

    def expiring(self) -> int:
        """How many sessions the ``expiry`` index holds (unpinned, with an expire_time)."""
        if self.tables.expiry is None:
            return 0
        with self.env.begin() as txn:
            entries: int = txn.stat(self.tables.expiry)["entries"]
        return entries

    def record(self, session_id: str) -> SessionRecord | None:
        """The session's person-set fields, or None when it has none."""
        with self.env.begin() as txn:
            return indexes.load_record(txn, self.tables, session_id)

    def unindexed(self) -> bool:
        """Fewer sessions in the update-time index than in the store: some were written by a
        server older than the index (``reindex`` fills it)."""
        with self.env.begin() as txn:
            listed: int = txn.stat(self.tables.recent)["entries"]
            stored: int = txn.stat(self.tables.sessions)["entries"]
        return listed < stored

    def reindex(self) -> int:
        """Index the sessions an older server wrote (``records.ReindexCommand``), a batch per
        commit; the index entries added. Only a primary may run it (its writes are replicated
        like any other); a store that is fully indexed writes nothing."""
        added, after = 0, ""
        while True:
            done: records.Reindexed = self.writer.submit(
                records.ReindexCommand(self.tables, after)
            ).result()
            added += done.added
            if not done.last:
                return added
            after = done.last

    async def reindex_on_loop(self) -> int:
        """``reindex`` for a caller on the running loop (a cluster member once it leads): each
        batch is awaited there, so cancelling it stops between batches."""
        added, after = 0, ""
        while True:
            command = records.ReindexCommand(self.tables, after)
            done: records.Reindexed = await self.writer.submit_on_loop(command)
            added += done.added
            if not done.last:
                return added
            after = done.last

    def descendants(self, session_id: str, limit: int = 10_000) -> list[str]:
        """The sessions below ``session_id`` in its tree, breadth first (``records.descendants``):
        the hook for a tree's usage totals."""
        with self.env.begin() as txn:
            return records.descendants(txn, self.tables, session_id, limit)

    def list_records(
        self,
        after: bytes = b"",
        prefix: str = "",
        query: Filter | None = None,
        order: str = records.BY_ID,
        limit: int = 100,
        now_ns: int | None = None,
    ) -> tuple[list[records.Listed], bool]:
        """A page of sessions with their records, filtered and ordered (``records.list_page``):
        strictly after the cursor ``after``; and whether more may follow. Reads no events."""
        now = time.time_ns() if now_ns is None else now_ns
        with self.env.begin() as txn:
            return records.list_page(
                txn,
                self.tables,
                after=after,
                prefix=prefix,
                query=query or Filter(),
                order=order,
                limit=limit,
                now_ns=now,
            )

    def surface(
        self, session_id: str, at_seq: int | None = None, *, messages: bool = False
    ) -> SurfaceSnapshot:
        """The fold of a session's log, or of its prefix 0..at_seq, as a snapshot of its own
        (``FoldCache.surface``: the full-log fold memoized and extended by what is new)."""
        return self.folds.surface(session_id, at_seq, messages=messages)

    def state(self, session_id: str, at_seq: int | None = None) -> tuple[Struct, int]:
        """A session's state after its whole log or events 0..at_seq, and the number of events
        folded (``FoldCache.state``)."""
        return self.folds.state(session_id, at_seq)

    def usage(
        self,
        session_id: str,
        at_seq: int | None = None,
        *,
        include_descendants: bool = False,
        admits: Callable[[str], bool] | None = None,
    ) -> ledger.SessionUsage:
        """A session's usage totals (``ledger.session_usage``), read in one transaction: from
        the ledger's rows for the whole log, folded from events 0..at_seq for a prefix. With
        ``include_descendants``, its fork descendants' own usage added (``ledger.tree``), those
        ``admits`` refuses (outside a token's prefix) left out."""
        with self.env.begin() as txn:
            if not include_descendants:
                return ledger.session_usage(txn, self.tables, session_id, at_seq)
            descendants = ledger.fork_descendants(txn, self.tables, session_id)
            if admits is not None:
                descendants = [d for d in descendants if admits(d)]
            return ledger.tree(txn, self.tables, session_id, descendants)

    def usage_of(self, session_ids: Sequence[str]) -> dict[str, fold.UsageByModel]:
        """The whole-log usage totals of several sessions, read in one transaction."""
        with self.env.begin() as txn:
            return ledger.many(txn, self.tables, session_ids)

    def derive_tail(
        self, session_id: str, known_count: int, known_generation: int
    ) -> SurfaceSnapshot | None:
        """The messages added since a caller's (event count, replace generation), or None when
        the caller needs the full list (``FoldCache.derive_tail``)."""
        return self.folds.derive_tail(session_id, known_count, known_generation)

    def list_events(
        self,
        session_id: str,
        cursor: int | None,
        limit: int,
        *,
        descending: bool,
        max_bytes: int = 1 << 62,
    ) -> EventsPage:
        """Up to ``limit`` stored events from ``cursor``, oldest or newest first
        (``views.list_events``); the session's record and its events read in one transaction."""
        with self.env.begin() as txn:
            return views.list_events(
                txn, self.tables, session_id, cursor, limit, descending, max_bytes
            )

    def derive_page(
        self,
        session_id: str,
        limit: int,
        *,
        at_seq: int | None = None,
        pinned: int | None = None,
        before: int | None = None,
        resume: Resume | None = None,
        max_bytes: int | None = None,
    ) -> MessagesPage:
        """The last ``limit`` messages of a view, before position ``before`` (None: the end),
        as many of them as fit in ``max_bytes``: from the memo when it holds the view, else
        walked back (``FoldCache.derive_page``)."""
        return self.folds.derive_page(
            session_id,
            limit,
            at_seq=at_seq,
            pinned=pinned,
            before=before,
            resume=resume,
            max_bytes=max_bytes,
        )
