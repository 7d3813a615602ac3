"""The LMDB store: sessions, their events, and the memoized fold over them.

Reads run in the caller's thread inside short read transactions; writes go through the single
:class:`~sessionlog.storage.writer.Writer` thread and its group commit. See ``schema`` for the
layout and its invariants.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import lmdb
from google.protobuf.struct_pb2 import Struct

from sessionlog import errors, fold, wire
from sessionlog.defaults import DEFAULT_MAP_SIZE, DEFAULT_REQUEST_ID_TTL_SECONDS
from sessionlog.records import Filter, SessionRecord
from sessionlog.retention import ACTOR, EXPIRED, IDLE, Policy
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
    integrity,
    leadership,
    ledger,
    rebuild,
    records,
    retention,
    schema,
)
from sessionlog.storage.changes import (
    ApplyChangesCommand,
    ApplyResult,
    ReceivedChange,
    head,
    read_changes,
)
from sessionlog.storage.commands import AppendBatch, AppendResult, ForkResult, LeaseChange
from sessionlog.storage.leadership import Change as LeadershipChange
from sessionlog.storage.leadership import Leadership
from sessionlog.storage.reads import (
    Txn,
    load_lease,
    load_meta,
    read_range,
    read_range_desc,
    walk_desc,
)
from sessionlog.storage.schema import AuditRecord, LeaseRecord, SessionMeta
from sessionlog.storage.tables import Tables
from sessionlog.storage.writer import Writer
from sessionlog.v1.event_pb2 import Event
from sessionlog.v1.message_pb2 import Message

__all__ = [
    "AppendBatch",
    "AppendResult",
    "EventsPage",
    "MessagesPage",
    "Resume",
    "Store",
    "StoreConfig",
    "prepare_append",
]

MAX_REQUEST_ID_BYTES = 256
MIN_LEASE_TTL_NS = 1_000_000
MAX_LEASE_TTL_NS = 24 * 3600 * 1_000_000_000
MAX_HOLDER_BYTES = 256
ERASE_BATCH = 100
"""Sessions an erase by prefix looks up (and scans the feed for) at a time."""


@dataclass(frozen=True)
class StoreConfig:
    """How the store opens LMDB and what it accepts."""

    map_size: int = DEFAULT_MAP_SIZE
    """Largest size the data file may grow to, in bytes (LMDB's map size)."""
    durable: bool = True
    """Sync every commit to disk before acknowledging (off: faster, may lose recent appends)."""
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


def check_request_id(request_id: str) -> None:
    """Refuse a request_id longer than the store keeps (INVALID_REQUEST_ID)."""
    if len(request_id.encode()) > MAX_REQUEST_ID_BYTES:
        raise errors.InvalidRequestId(
            f"a request_id may be at most {MAX_REQUEST_ID_BYTES} bytes; this one has "
            f"{len(request_id.encode())}",
            limit=MAX_REQUEST_ID_BYTES,
        )


def prepare_append(
    session_id: str,
    events: Sequence[Event],
    *,
    limits: fold.Limits = fold.DEFAULT_LIMITS,
    expected_seq: int | None = None,
    request_id: str = "",
    lease_holder: str = "",
    lease_token: int = 0,
    lenient: bool = False,
    create_only: bool = False,
    now_ns: int | None = None,
    indices: Sequence[int] | None = None,
    keep_redacted: bool = False,
) -> AppendBatch:
    """Validate what needs no state, stamp missing times with now, serialize the events.

    Raises InvalidSessionId. Per-event failures are kept for the writer, which decides them in
    SPEC order once it knows the seq each event would get. ``indices`` are the numbers errors
    give the events (by default their positions; a seed uses the positions of its messages).
    The batch's ``bodies`` carry the stamped times; its ``events`` are the caller's events (left
    unchanged, so possibly without a time), which the writer reads only for their surface ops.
    An event's ``redacted`` mark is dropped (only RedactEvents sets it) unless ``keep_redacted``:
    a slot move's copy of stored events keeps them as they are.
    """
    fold.check_session_id(session_id)
    check_request_id(request_id)
    if len(lease_holder.encode()) > MAX_HOLDER_BYTES:
        raise errors.InvalidLease(
            f"a lease holder may be at most {MAX_HOLDER_BYTES} bytes", limit=MAX_HOLDER_BYTES
        )
    fingerprint = (
        _fingerprint(events, lenient, b"create" if create_only else b"") if request_id else ""
    )
    stamp = time.time_ns() if now_ns is None else now_ns
    # The server's time as a serialized `time` field, built once and put in place in the bytes
    # of each event that has none: no copy of the event, no Timestamp per event.
    time_field = wire.event_time_field(stamp)
    prechecked: list[fold.Violation | None] = []
    bodies: list[bytes] = []
    stamped: list[Event] = []
    for index, original in enumerate(events):
        number = index if indices is None else indices[index]
        event = original
        if not keep_redacted and original.HasField("redacted"):
            event = Event()
            event.CopyFrom(original)
            event.ClearField("redacted")
        stamp_it = not event.HasField("time")
        body: bytes | None = None
        if time_field or not stamp_it:
            try:
                body = event.SerializeToString()
            except Exception:  # whatever the runtime refuses to encode is judged the reference way
                body = None
        if body is not None:
            # Checked at the size it is stored with (the time field added when the server adds
            # it), and stamped only once accepted: a refused event costs no copy of its bytes.
            size = len(body) + (len(time_field) if stamp_it else 0)
            violation = fold.check_event(event, number, limits, size=size)
            if not violation and stamp_it:
                body = wire.with_time(body, event.type, time_field) or None
        if body is None:  # the reference path: a copy of the event with its time set
            event = Event()
            event.CopyFrom(original)  # never change the caller's event: a retry must match
            if not event.HasField("time"):
                event.time.FromNanoseconds(stamp)
            violation = fold.check_event(event, number, limits)
            body = b"" if violation else event.SerializeToString()
        stamped.append(event)
        prechecked.append(violation)
        bodies.append(b"" if violation else body)
    return AppendBatch(
        session_id=session_id,
        events=stamped,
        prechecked=prechecked,
        bodies=bodies,
        replaces=[fold.replace_range(event) for event in stamped],
        expected_seq=expected_seq,
        request_id=request_id,
        fingerprint=fingerprint,
        lease_holder=lease_holder,
        lease_token=lease_token,
        lenient=lenient,
        create_only=create_only,
    )


def prepare_seed(
    session_id: str,
    messages: Sequence[Message],
    *,
    limits: fold.Limits = fold.DEFAULT_LIMITS,
    lease_holder: str = "",
    lease_token: int = 0,
    request_id: str = "",
    now_ns: int | None = None,
) -> tuple[AppendBatch, list[int]]:
    """A create-only batch with one surface event per message (SPEC §5 Seed).

    Returns the batch and the indices of messages dropped for an unknown role. The events are
    then checked like any append, so a seed either writes every kept message or nothing.
    """
    events: list[Event] = []
    kept: list[int] = []
    dropped: list[int] = []
    for index, message in enumerate(messages):
        event = fold.event_from_message(message)
        if event is None:
            dropped.append(index)
        else:
            events.append(event)
            kept.append(index)
    batch = prepare_append(
        session_id,
        events,
        limits=limits,
        create_only=True,
        lease_holder=lease_holder,
        lease_token=lease_token,
        request_id=request_id,
        now_ns=now_ns,
        indices=kept,
    )
    if request_id:
        # The dropped messages count too: a retry must send the same messages, not just the
        # same kept ones.
        marker = b"seed:" + ",".join(map(str, kept)).encode() + b"/" + str(len(messages)).encode()
        batch.fingerprint = _fingerprint(events, False, marker)
    return batch, dropped


def _fingerprint(events: Sequence[Event], lenient: bool, kind: bytes = b"") -> str:
    """What a request_id's retries must repeat. ``kind`` sets creates and seeds apart from
    appends (empty, as before, so stored append records keep matching)."""
    parts = [b"lenient" if lenient else b"strict"]
    if kind:
        parts.append(kind)
    for event in events:
        body = event.SerializeToString(deterministic=True)
        parts.append(len(body).to_bytes(8, "big"))
        parts.append(body)
    return hashlib.sha256(b"".join(parts)).hexdigest()


@dataclass(frozen=True)
class SurfaceSnapshot:
    """A fold's result, copied out of the shared memo so later appends cannot change it."""

    count: int
    replace_generation: int
    surface: list[Event]
    seqs: list[int]
    projected: list[bytes]
    """Serialized Messages, one per surface event; empty unless asked for."""


@dataclass(frozen=True)
class EventsPage:
    """One page of ListEvents: stored event bytes, and the session's event count at the read."""

    events: list[bytes]
    first_seq: int
    """The seq of ``events[0]`` (the newest one, newest first)."""
    next_seq: int


@dataclass(frozen=True)
class MessagesPage:
    """The last messages of a pinned view before a position (see ``Store.derive_page``)."""

    count: int
    """The events the view covers (pinned by the first page)."""
    seqs: list[int]
    projected: list[bytes]
    """Serialized Messages, one per seq, in view order."""
    first_position: int
    """The position of the page's first entry: the next page holds the entries before it."""
    more: bool
    """Whether entries before the page exist."""
    from_memo: bool
    replace_generation: int
    """The session's replace generation as read (that of the view when it is the whole log)."""
    walk: Resume | None = None
    """Where the walk behind the page stopped, for the page before (None when served by the
    memo, or when no page comes before)."""


@dataclass(frozen=True)
class Resume:
    """Where a backwards walk stopped (``fold.TailWalk``), its pending entries by seq."""

    next_seq: int
    hidden: tuple[tuple[int, int], ...]
    pending: tuple[int, ...]


@dataclass
class SessionView:
    """Everything GetSession reports about a session."""

    session_id: str
    meta: SessionMeta | None
    lease: LeaseRecord | None
    """The current lease, only while it is live."""
    audit: list[AuditRecord]
    record: SessionRecord | None = None
    """The person-set fields (title, labels, ...), read with the meta so the two agree."""


@dataclass(frozen=True)
class AuditEntry:
    """One lease audit record with the session it belongs to (ListLeaseAudit)."""

    session_id: str
    index: int
    """The record's number in its session's audit, from 0."""
    record: AuditRecord


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
        writer before each write applies and before it is acknowledged (see ``Writer``)."""
        self.path = Path(path)
        self.config = config = config or StoreConfig()
        self._owns_lock = lock is None
        self._lock = folder.acquire(self.path) if lock is None else lock
        try:
            marker = folder.read_marker(self.path)
            folder.check_not_emptied(self.path, marker)
            if not prepared:
                integrity.refuse_damaged(self.path)
            self.env = lmdb.open(
                str(self.path),
                map_size=config.map_size,
                max_dbs=len(schema.ALL_DBS),
                sync=config.durable,
                metasync=config.durable,
                readahead=False,
                max_readers=1024,
            )
            try:
                self.tables = Tables(self.env)
                if prepared:
                    # Reader slots left by a process of this server that died mid-read would
                    # keep old pages from being reused: clear them (LMDB checks their PIDs).
                    self.env.reader_check()
                    self.identity = _identity(self.env, self.tables)
                else:
                    self.identity = _reconcile(self.env, self.tables, self.path, marker, config)
            except BaseException:
                self.env.close()
                raise
        except BaseException:
            if lock is None:
                self._lock.release()
            raise
        self.writer = Writer(
            self.env,
            self.tables,
            on_commit=on_commit,
            on_broken=on_broken,
            checksums=config.record_checksums,
            may_write=may_write,
        )
        self.writer.lead = self.leadership()
        self._folds: OrderedDict[int, fold.SurfaceFold] = OrderedDict()
        self._fold_bytes: dict[int, int] = {}
        self._folds_lock = threading.Lock()
        self._idle_resume = b""
        """Where the next retention sweep's idle walk resumes (``retention.idle``)."""
        self._fold_marks: dict[int, int] = {}
        """Per memoized sid: its redaction count when the memo was made (``_fold`` checks it:
        a redaction by any process of the server leaves the count of events unchanged)."""

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
        ttl_ns = self.config.request_id_ttl_seconds * 1_000_000_000
        return commands.AppendCommand(self.tables, batch, ttl_ns)

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
        fold.check_session_id(parent_id)
        if child_id:
            fold.check_session_id(child_id)
        check_request_id(request_id)
        ttl_ns = self.config.request_id_ttl_seconds * 1_000_000_000
        return commands.ForkCommand(
            self.tables,
            parent_id,
            at_seq,
            child_id,
            lease_holder,
            lease_token,
            request_id=request_id,
            request_id_ttl_ns=ttl_ns,
            generated_id=generated_id,
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
        fold.check_session_id(session_id)
        _check_holder(holder)
        if action != "release" and not MIN_LEASE_TTL_NS <= ttl_ns <= MAX_LEASE_TTL_NS:
            raise errors.InvalidLease(
                f"a lease TTL must be between 1 ms and 24 h; got {ttl_ns / 1e9:g} s",
                ttl_seconds=ttl_ns / 1e9,
            )
        return commands.LeaseCommand(self.tables, action, session_id, holder, ttl_ns, force)

    # -- erasure (see ``erasure``) ----------------------------------------------------------

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
        """A delete of ``session_id``, its feed records found by a scan in a read transaction
        (O(feed): call it off the event loop); submit it with ``writer.submit``."""
        fold.check_session_id(session_id)
        if lease_holder:
            _check_holder(lease_holder)
        with self.env.begin() as txn:
            found = erasure.scan(txn, self.tables, [session_id])
        return erasure.DeleteCommand(
            self.tables,
            session_id,
            found,
            expected_seq=expected_seq,
            lease_holder=lease_holder,
            force=force,
            actor=actor,
            reason=reason,
        )

    async def commit_delete(self, command: erasure.DeleteCommand) -> erasure.DeleteResult:
        """Run a delete (from ``delete_command``) on the running loop; its fold memo is
        dropped, so no erased content stays in this process's memory."""
        result: erasure.DeleteResult = await self.writer.submit_on_loop(command)
        self.forget_fold(result.meta.sid)
        return result

    def delete(self, session_id: str, **options: Any) -> erasure.DeleteResult:
        """Erase a session, blocking until durable (see ``delete_command``)."""
        result: erasure.DeleteResult = self.writer.submit(
            self.delete_command(session_id, **options)
        ).result()
        self.forget_fold(result.meta.sid)
        return result

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
        in a read transaction (O(feed): call it off the event loop); submit it with
        ``writer.submit``."""
        fold.check_session_id(session_id)
        if lease_holder:
            _check_holder(lease_holder)
        if not seqs:
            raise errors.InvalidRedaction(
                f"name at least one seq of session '{session_id}' to redact", session_id=session_id
            )
        with self.env.begin() as txn:
            found = erasure.scan(txn, self.tables, [session_id])
        return erasure.RedactCommand(
            self.tables,
            session_id,
            seqs,
            found,
            reason=reason,
            lease_holder=lease_holder,
            actor=actor,
        )

    def redact(self, session_id: str, seqs: Sequence[int], **options: Any) -> erasure.RedactResult:
        """Redact events, blocking until durable (see ``redact_command``)."""
        command = self.redact_command(session_id, seqs, **options)
        result: erasure.RedactResult = self.writer.submit(command).result()
        return result

    def erase_prefix(
        self,
        prefix: str,
        *,
        query: Filter | None = None,
        actor: str = "",
        reason: str = "",
        batch: int = ERASE_BATCH,
    ) -> tuple[int, int, int]:
        """Delete every session whose id starts with ``prefix`` and that matches ``query`` (a
        ListSessions filter: labels, owner, status...; force: leases do not stop it), ``batch``
        sessions at a time: one feed scan per batch, one record per session. Blocks; returns
        (sessions erased, events they held, the last erase's position)."""
        if not prefix and (query is None or not query.terms):
            raise errors.InvalidRedaction(
                "erasing needs a non-empty prefix or a filter (every session is not an option)"
            )
        sessions = events = position = 0
        after = b""
        while True:
            page, _ = self.list_records(after=after, prefix=prefix, query=query, limit=batch)
            if not page:
                return sessions, events, position
            ids = [listed.session_id for listed in page]
            after = page[-1].cursor  # one skipped below (not this group's) is not listed again
            done = self.delete_batch(ids, actor=actor, reason=reason)
            sessions, events = sessions + done[0], events + done[1]
            position = max(position, done[2])

    def erase_slot_copies(
        self,
        in_slot: Callable[[str], bool],
        copy_of: Callable[[str], errors.SessionLogError | None],
        *,
        actor: str = "",
        reason: str = "",
        batch: int = ERASE_BATCH,
    ) -> tuple[int, int, int]:
        """Delete every stored session ``in_slot`` accepts (a slot's copies, before a move copies
        it afresh), each refused inside its transaction when ``copy_of`` says it is no copy (the
        group owns it now). Reads every session's id; returns what ``erase_prefix`` does."""
        sessions = events = position = 0
        after = b""
        while True:
            page, more = self.list_records(after=after, limit=batch)
            ids = [listed.session_id for listed in page if in_slot(listed.session_id)]
            done = self.delete_batch(ids, actor=actor, reason=reason, copy_of=copy_of)
            sessions, events = sessions + done[0], events + done[1]
            position = max(position, done[2])
            if not page or not more:
                return sessions, events, position
            after = page[-1].cursor

    def delete_batch(
        self,
        ids: Sequence[str],
        *,
        actor: str,
        reason: str,
        copy_of: Callable[[str], errors.SessionLogError | None] | None = None,
        still_due: Callable[[Txn, str, SessionMeta, int], bool] | None = None,
    ) -> tuple[int, int, int]:
        """Delete ``ids`` (force: leases do not stop it), one feed scan for all and one command
        and change record each, all queued before any is awaited; blocks. A session gone
        meanwhile, not this group's (sharded) or no longer due (``still_due``) is skipped.
        Returns (sessions erased, events they held, the last erase's position)."""
        if not ids:
            return 0, 0, 0
        with self.env.begin() as txn:
            found = erasure.scan(txn, self.tables, ids)
        futures = [
            self.writer.submit(
                erasure.DeleteCommand(
                    self.tables,
                    session_id,
                    found,
                    force=True,
                    actor=actor,
                    reason=reason,
                    copy_of=copy_of,
                    still_due=still_due,
                )
            )
            for session_id in ids
        ]
        sessions = events = position = 0
        for future in futures:
            try:
                result: erasure.DeleteResult = future.result()
            except (errors.SessionNotFound, errors.WrongGroup, errors.NotExpired):
                continue
            sessions += 1
            events += result.event_count
            position = max(position, result.position)
            self.forget_fold(result.meta.sid)
        return sessions, events, position

    def sweep(
        self,
        policy: Policy,
        *,
        ours: Callable[[str], bool] = lambda _: True,
        batch: int = retention.SWEEP_BATCH,
    ) -> retention.Swept:
        """One retention sweep (``storage.retention``): delete up to ``batch`` expired and up
        to ``batch`` idle sessions that ``ours`` accepts, each re-checked in its transaction.
        Blocks; call it where writes are accepted, off the event loop."""
        now_ns = time.time_ns()
        with self.env.begin() as txn:
            expired = retention.expired(txn, self.tables, now_ns, batch, ours)
            idle, self._idle_resume = retention.idle(
                txn, self.tables, now_ns, policy, batch, ours, self._idle_resume
            )
        chosen = set(expired)
        idle = [session_id for session_id in idle if session_id not in chosen]
        first = self.delete_batch(
            expired,
            actor=ACTOR,
            reason=EXPIRED,
            still_due=retention.still_due(self.tables, policy, EXPIRED),
        )
        second = self.delete_batch(
            idle,
            actor=ACTOR,
            reason=IDLE,
            still_due=retention.still_due(self.tables, policy, IDLE),
        )
        return retention.Swept(first[0], second[0], first[1] + second[1])

    def forget_fold(self, sid: int) -> None:
        """Drop a session's memoized fold (a redaction or delete made it stale)."""
        with self._folds_lock:
            if self._folds.pop(sid, None) is not None:
                del self._fold_bytes[sid]
            self._fold_marks.pop(sid, None)

    def _meta_and_mark(self, session_id: str) -> tuple[SessionMeta | None, int]:
        """The session's metadata and its redaction count (what its fold memo keys on
        besides the event count), read in one transaction."""
        with self.env.begin() as txn:
            meta = load_meta(txn, self.tables, session_id)
            if meta is None:
                return None, 0
            return meta, self._redaction_mark(txn, meta.sid)

    def _redaction_mark(self, txn: lmdb.Transaction, sid: int) -> int:
        """How many RedactEvents calls changed the session ``sid`` (0 on a read-only store from
        before the redactions table)."""
        if self.tables.redactions is None:
            return 0
        raw = txn.get(schema.u64(sid), db=self.tables.redactions)
        return 0 if raw is None else schema.read_u64(raw)

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
        fold.check_session_id(session_id)
        return records.UpdateSessionCommand(self.tables, session_id, given, paths)

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
        meta, mark = self._meta_and_mark(session_id)
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

        def promote(record: Leadership, next_position: int) -> Leadership:
            if record.may_write:
                raise errors.AlreadyPrimary(
                    f"this server already takes writes (epoch {record.epoch}): nothing to promote",
                    epoch=record.epoch,
                )
            return leadership.promoted(record, next_position, epoch)

        return self.submit_leadership(promote, new_history=True)

    def session(self, session_id: str, now_ns: int | None = None) -> SessionView:
        """A session's metadata, live lease, lease audit and record, read in one transaction."""
        now = time.time_ns() if now_ns is None else now_ns
        with self.env.begin() as txn:
            meta = load_meta(txn, self.tables, session_id)
            lease = load_lease(txn, self.tables, session_id)
            audit = self._audit(txn, session_id)
            record = indexes.load_record(txn, self.tables, session_id)
        live = lease if lease is not None and lease.live(now) else None
        return SessionView(session_id, meta, live, audit, record)

    def _audit(self, txn: lmdb.Transaction, session_id: str) -> list[AuditRecord]:
        audit = []
        prefix = schema.audit_prefix(session_id)
        with damage.reading(f"the lease audit of session '{session_id}'", session_id=session_id):
            cursor = txn.cursor(db=self.tables.audit)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not bytes(key).startswith(prefix):
                        break
                    audit.append(AuditRecord.decode(value))
        return audit

    def lease_audit(
        self,
        after: tuple[str, int] | None = None,
        prefix: str = "",
        limit: int = 100,
        keep: Callable[[str], bool] = lambda session_id: True,
    ) -> tuple[list[AuditEntry], bool]:
        """Up to ``limit`` lease audit records of the sessions whose id starts with ``prefix``
        (and that ``keep`` accepts), in key order: session id (UTF-8 bytes), then record number.
        Strictly after ``after`` (session id, record number). Returns them and whether more may
        follow. One cursor range in one read transaction: the cost is the records walked."""
        want = prefix.encode()
        start = want if after is None else max(schema.audit_key(*after), want)
        skip = None if after is None else schema.audit_key(*after)
        out: list[AuditEntry] = []
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self.tables.audit)
            with damage.reading("the lease audit"):
                if not cursor.set_range(start):
                    return out, False
            for key, value in _walk(cursor, "the lease audit"):
                if not key.startswith(want):
                    return out, False
                if key == skip:
                    continue
                with damage.reading("a key of the lease audit"):
                    session_id, index = schema.split_audit_key(key)
                if not keep(session_id):
                    continue
                if len(out) == limit:
                    return out, True
                with damage.reading(f"the lease audit of session '{session_id}'"):
                    record = AuditRecord.decode(value)
                out.append(AuditEntry(session_id, index, record))
        return out, False

    def list_sessions(
        self, after: str = "", prefix: str = "", limit: int = 100, now_ns: int | None = None
    ) -> tuple[list[SessionView], bool]:
        """Up to ``limit`` sessions in id order (UTF-8 bytes), strictly after ``after``, whose id
        starts with ``prefix``, each with its live lease (no audit). Returns them and whether more
        follow. A cursor range: the cost is the page, whatever the number of sessions."""
        now = time.time_ns() if now_ns is None else now_ns
        out: list[SessionView] = []
        want = prefix.encode()
        start = max(after.encode(), want)
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self.tables.sessions)
            with damage.reading(f"the session list after '{after or prefix}'"):
                if not cursor.set_range(start):
                    return out, False
            for key, value in _walk(cursor, f"the session list after '{after or prefix}'"):
                if not key.startswith(want):
                    return out, False
                if after and key == after.encode():
                    continue
                if len(out) == limit:
                    return out, True
                with damage.reading("a session id in the session list"):
                    session_id = key.decode()
                lease = load_lease(txn, self.tables, session_id)
                live = lease if lease is not None and lease.live(now) else None
                with damage.reading(f"the record of session '{session_id}'"):
                    meta = SessionMeta.decode(value)
                out.append(SessionView(session_id, meta, live, []))
        return out, False

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
        """The fold of a session's log, or of its prefix 0..at_seq, as a snapshot of its own.

        The full-log fold is memoized per session and extended by the events appended since it
        was last read (O(new)); a prefix other than the whole log is folded afresh. With
        ``messages`` the snapshot also carries each surface entry's serialized Message (projected
        once per entry, then memoized).
        """
        meta, target, mark = self._fold_target(session_id, at_seq)
        if meta is None:
            return SurfaceSnapshot(0, 0, [], [], [])
        with self._folds_lock:
            folded = self._fold(session_id, meta, target, mark)
            return SurfaceSnapshot(
                count=folded.count,
                replace_generation=folded.replace_generation,
                surface=folded.surface,
                seqs=folded.seqs,
                projected=folded.projected() if messages else [],
            )

    def state(self, session_id: str, at_seq: int | None = None) -> tuple[Struct, int]:
        """A session's state (fold.fold_state) after its whole log or events 0..at_seq, and
        the number of events folded. Memoized with the surface: the same per-session fold,
        extended by the events appended since (O(new)); a prefix is folded afresh."""
        meta, target, mark = self._fold_target(session_id, at_seq)
        if meta is None:
            return Struct(), 0
        with self._folds_lock:
            folded = self._fold(session_id, meta, target, mark)
            return fold.state_struct(folded.state), folded.count

    def _fold_target(
        self, session_id: str, at_seq: int | None
    ) -> tuple[SessionMeta | None, int, int]:
        """The session's record, how many events a fold through ``at_seq`` (None: the whole
        log) covers, and its redaction count (the memo's mark); BOUNDARY_OUT_OF_RANGE when
        at_seq is past the end."""
        meta, mark = self._meta_and_mark(session_id)
        count = 0 if meta is None else meta.next_seq
        if at_seq is not None and at_seq >= count:
            raise errors.BoundaryOutOfRange(
                f"at_seq {at_seq} is past the end of session '{session_id}' ({count} events)",
                at_seq=at_seq,
                next_seq=count,
            )
        return meta, count if at_seq is None else at_seq + 1, mark

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
        a replace happened since (or the caller's numbers are not this session's): then the
        caller needs the full list. The snapshot's ``projected``/``seqs`` hold only the tail,
        and the cost is O(new): no copy of the whole surface."""
        meta, mark = self._meta_and_mark(session_id)
        if meta is None or mark:
            # A redacted session always gets the full list: a caller's copy may predate it.
            return None
        with self._folds_lock:
            folded = self._fold(session_id, meta, meta.next_seq, mark)
            if folded.replace_generation != known_generation or not (
                0 <= known_count <= folded.count
            ):
                return None
            seqs, projected = folded.tail(known_count)
            return SurfaceSnapshot(folded.count, folded.replace_generation, [], seqs, projected)

    def list_events(
        self,
        session_id: str,
        cursor: int | None,
        limit: int,
        *,
        descending: bool,
        max_bytes: int = 1 << 62,
    ) -> EventsPage:
        """Up to ``limit`` stored events: oldest first from seq ``cursor`` (None: 0), or newest
        first from seq ``cursor - 1`` down (None: the last event). Within ``max_bytes`` but at
        least one event; the session's record and its events are read in one transaction, and
        the cost is the events returned."""
        with self.env.begin() as txn:
            meta = load_meta(txn, self.tables, session_id)
            count = 0 if meta is None else meta.next_seq
            if meta is None:
                return EventsPage([], 0, count)
            if descending:
                if cursor is not None and cursor > count:
                    raise errors.InvalidPageToken(
                        f"page_token goes back from seq {cursor} of session '{session_id}', "
                        f"which has {count} events here; list again without a page_token",
                        field="page_token",
                    )
                stop = count if cursor is None else cursor
                raws = read_range_desc(
                    txn, self.tables, meta.sid, stop, limit, max_bytes, session_id
                )
                return EventsPage(raws, stop - 1, count)
            start = cursor or 0
            raws = read_range(
                txn, self.tables, meta.sid, start, min(start + limit, count), max_bytes, session_id
            )
            return EventsPage(raws, start, count)

    def derive_page(
        self,
        session_id: str,
        limit: int,
        *,
        at_seq: int | None = None,
        pinned: int | None = None,
        before: int | None = None,
        resume: Resume | None = None,
    ) -> MessagesPage:
        """The last ``limit`` messages of a view, before position ``before`` (None: the end).

        The view is the fold of events 0..pinned-1; without ``pinned`` (a first page), of
        0..at_seq, or of the whole log. The memo serves it when it holds exactly that view;
        otherwise ``fold.walk_back`` walks the log backwards, from where the page after it
        stopped (``resume``, the page's ``walk``) or from the view's end, never folding the
        whole of it, and nothing is memoized. A ``pinned`` past the end of the log (a token of
        another server's copy, a replica behind), or a ``resume`` whose pending entries are not
        surface events below ``before``, is InvalidPageToken.
        """
        with self.env.begin() as txn:
            meta = load_meta(txn, self.tables, session_id)
            count = 0 if meta is None else meta.next_seq
            if pinned is None:
                if at_seq is not None and at_seq >= count:
                    raise errors.BoundaryOutOfRange(
                        f"at_seq {at_seq} is past the end of session '{session_id}' "
                        f"({count} events)",
                        at_seq=at_seq,
                        next_seq=count,
                    )
                pinned = count if at_seq is None else at_seq + 1
            elif pinned > count:
                raise errors.InvalidPageToken(
                    f"page_token is for {pinned} events of session '{session_id}', which has "
                    f"{count} here; derive again without a page_token",
                    field="page_token",
                )
            generation = 0 if meta is None else meta.replace_generation
            if meta is None or pinned == 0:
                return MessagesPage(pinned, [], [], 0, False, False, generation)
            mark = self._redaction_mark(txn, meta.sid)
            with self._folds_lock:
                cached = self._folds.get(meta.sid)
                if cached is not None and self._fold_marks.get(meta.sid, 0) != mark:
                    cached = None  # made before a redaction: the walk reads what is stored now
                served = (
                    cached.page(limit + 1, before) if cached and cached.count == pinned else None
                )
            walked: Resume | None = None
            if served is not None:
                entries, projected = served
            else:
                entries, walked = self._walk_back(
                    txn, meta.sid, session_id, pinned, limit, before, resume
                )
                projected = [fold.project(e).SerializeToString(deterministic=True) for e in entries]
        more = len(entries) > limit
        if more:
            if walked is not None:  # the entry that showed there is more belongs to the next page
                walked = Resume(walked.next_seq, walked.hidden, (*walked.pending, entries[0].seq))
            entries, projected = entries[1:], projected[1:]
        first = fold.position(entries[0]) if entries else 0
        seqs = [e.seq for e in entries]
        page = MessagesPage(pinned, seqs, projected, first, more, served is not None, generation)
        return replace(page, walk=walked) if more else page

    def _walk_back(
        self,
        txn: lmdb.Transaction,
        sid: int,
        session_id: str,
        pinned: int,
        limit: int,
        before: int | None,
        resume: Resume | None,
    ) -> tuple[list[Event], Resume]:
        """``fold.walk_back`` over the stored events, for limit + 1 entries."""
        what = f"events before seq {pinned} of session '{session_id}'"
        with damage.reading(what, session_id=session_id, seq=pinned):
            start = pinned
            state = None
            if resume is not None:
                start = resume.next_seq
                pending = tuple(self._pending(txn, sid, session_id, resume, before))
                state = fold.TailWalk(resume.next_seq, resume.hidden, pending)
            walk = (
                damage.decode_event(raw, seq, session_id)
                for seq, raw in walk_desc(txn, self.tables, sid, start, session_id)
            )
            entries, stopped = fold.walk_back(walk, limit + 1, before, state)
        pending_seqs = tuple(e.seq for e in stopped.pending)
        return entries, Resume(stopped.next_seq, stopped.hidden, pending_seqs)

    def _pending(
        self, txn: lmdb.Transaction, sid: int, session_id: str, resume: Resume, before: int | None
    ) -> Iterator[Event]:
        for seq in resume.pending:
            raw = txn.get(schema.event_key(sid, seq), db=self.tables.events)
            event = None if raw is None else damage.decode_event(bytes(raw), seq, session_id)
            if (
                event is None
                or event.type not in fold.SURFACE_TYPES
                or (before is not None and fold.position(event) >= before)
            ):
                raise errors.InvalidPageToken(
                    f"page_token names seq {seq} of session '{session_id}' as a message left "
                    "for the next page, which it is not; derive again without a page_token",
                    field="page_token",
                )
            yield event

    def _fold(self, session_id: str, meta: SessionMeta, target: int, mark: int) -> fold.SurfaceFold:
        """The fold of events 0..target-1: the session's memo, brought up to date (O(new)),
        when target is the whole log; a fresh fold otherwise. ``mark`` is the session's
        redaction count read with ``meta``: a memo made under another one is dropped. Call with
        ``_folds_lock`` held. A damaged event raises DataCorrupted and leaves the memo as it
        was."""
        cached = self._folds.get(meta.sid)
        if cached is not None and self._fold_marks.get(meta.sid, 0) != mark:
            self._folds.pop(meta.sid)
            del self._fold_bytes[meta.sid]
            cached = None
        if cached is None or cached.count > target:
            cached = fold.SurfaceFold()
            if target == meta.next_seq:
                self._remember(meta.sid, cached)
                self._fold_marks[meta.sid] = mark
        else:
            self._folds.move_to_end(meta.sid)
        if cached.count < target:
            new = self.read_events(meta.sid, cached.count, target, session_id=session_id)
            if len(new) != target - cached.count:
                raise damage.missing_events(session_id, cached.count + len(new), target)
            cached.extend(damage.decode_events(new, cached.count, session_id))
            if meta.sid in self._folds:
                self._fold_bytes[meta.sid] += sum(map(len, new))
                self._evict()
        return cached

    def _remember(self, sid: int, surface: fold.SurfaceFold) -> None:
        self._folds[sid] = surface
        self._fold_bytes[sid] = 0

    def _evict(self) -> None:
        """Drop least recently read folds past the session count or the byte budget (counted
        as the stored bytes each fold has read; the most recent fold always stays)."""
        config = self.config
        while len(self._folds) > 1 and (
            len(self._folds) > config.fold_cache_sessions
            or sum(self._fold_bytes.values()) > config.fold_cache_bytes
        ):
            sid, _ = self._folds.popitem(last=False)
            del self._fold_bytes[sid]
            self._fold_marks.pop(sid, None)


def _walk(cursor: lmdb.Cursor, what: str) -> Iterator[tuple[bytes, bytes]]:
    """A cursor's (key, value) pairs, in a transaction without buffers; LMDB meeting a
    damaged page raises DataCorrupted."""
    items = iter(cursor)
    while True:
        with damage.reading(what):
            item = next(items, None)
        if item is None:
            return
        key, value = item
        yield bytes(key), bytes(value)


def _identity(env: lmdb.Environment, tables: Tables) -> identity.Identity:
    """The identity a prepared folder already has (see ``Store``): read, never written."""
    with env.begin() as txn:
        history_id, start = identity.read(txn, tables)
    return identity.Identity(history_id, start, identity.OPENED)


def _reconcile(
    env: lmdb.Environment,
    tables: Tables,
    path: Path,
    marker: folder.Marker | None,
    config: StoreConfig,
) -> identity.Identity:
    """``identity.reconcile``, with a full disk (it writes the marker and one transaction)
    turned into one line that says what to do."""
    try:
        return identity.reconcile(env, tables, path, marker, config.replica_of, config.elected)
    except (OSError, lmdb.Error) as exc:
        if not _disk_full(exc):
            raise
        raise folder.FolderUnwritable(
            f"cannot start on {str(path)!r}: the disk holding it is full ({exc}); free space "
            "there and start again (nothing was changed)"
        ) from None


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, lmdb.DiskError) or "No space left on device" in str(exc)


def _check_holder(holder: str) -> None:
    size = len(holder.encode())
    if not 1 <= size <= MAX_HOLDER_BYTES:
        raise errors.InvalidLease(
            f"a lease holder must be 1 to {MAX_HOLDER_BYTES} bytes; this one has {size}",
            length=size,
        )
