"""Running erasures: deletes and redactions one at a time, by prefix or filter, a slot's copies,
and the retention sweep.

The commands themselves and the feed rule are ``erasure``'s; this module finds what to erase
(its records, looked up through ``feed_index`` in a read transaction: callers run it off the
event loop), queues the commands on the single writer thread, and drops the fold memo of every
session it erased once the erase is durable, so no erased content stays in this process's
memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import lmdb

from sessionlog import errors, fold
from sessionlog.records import Filter
from sessionlog.retention import ACTOR, EXPIRED, IDLE, Policy
from sessionlog.storage import erasure, purge, records, retention
from sessionlog.storage.fold_cache import FoldCache
from sessionlog.storage.preparing import check_holder
from sessionlog.storage.reads import Txn, load_meta
from sessionlog.storage.schema import SessionMeta
from sessionlog.storage.tables import Tables
from sessionlog.storage.writer import Writer

ERASE_BATCH = 100
"""Sessions an erase by prefix looks up (and scans the feed for) at a time."""


class Eraser:
    """The erasures of one store, written through its writer, forgetting through its fold cache."""

    def __init__(
        self, env: lmdb.Environment, tables: Tables, writer: Writer, folds: FoldCache
    ) -> None:
        self.env = env
        self.tables = tables
        self.writer = writer
        self.folds = folds
        self.idle_resume = b""
        """Where the next retention sweep's idle walk resumes (``retention.idle``)."""

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
        fold.check_session_id(session_id)
        if lease_holder:
            check_holder(lease_holder)
        with self.env.begin() as txn:
            found = self._scan(txn, [session_id])
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
        self.folds.forget(result.meta.sid)
        return result

    def delete(self, session_id: str, **options: Any) -> erasure.DeleteResult:
        """Erase a session, blocking until durable (see ``delete_command``)."""
        result: erasure.DeleteResult = self.writer.submit(
            self.delete_command(session_id, **options)
        ).result()
        self.folds.forget(result.meta.sid)
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
        in a read transaction (through ``feed_index``: call it off the event loop); submit it
        with ``writer.submit``."""
        fold.check_session_id(session_id)
        if lease_holder:
            check_holder(lease_holder)
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
            page, _ = self._page(after=after, prefix=prefix, query=query, limit=batch)
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
            page, more = self._page(after=after, limit=batch)
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
            found = self._scan(txn, ids)
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
            self.folds.forget(result.meta.sid)
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
            idle, self.idle_resume = retention.idle(
                txn, self.tables, now_ns, policy, batch, ours, self.idle_resume
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

    def purging(self) -> list[purge.Purge]:
        """The long sessions deleted whose rows are still being freed (``purge``)."""
        with self.env.begin() as txn:
            return purge.pending(txn, self.tables)

    def purge_next(self) -> purge.Purged | None:
        """Run the next chunk of the oldest purge (``purge``) and no more; None when no session
        is being purged. Blocks; call it where writes are accepted (tests step through a purge
        with it; the server hands a purge to the writer whole, ``start_purge``)."""
        with self.env.begin() as txn:
            marks = purge.pending(txn, self.tables, limit=1)
        if not marks:
            return None
        command = purge.PurgeCommand(self.tables, marks[0].sid)
        done: purge.Purged = self.writer.submit_background(command).result()
        done.session_id = marks[0].session_id
        return done

    def start_purge(self) -> Future[purge.Purged] | None:
        """Hand the oldest purge to the writer whole: one background command that it runs
        again, chunk after chunk, until the session is freed (``Writer.submit_background``
        with ``repeat``); its future holds the last chunk's result. None when no session is
        being purged. While writes flow, its chunks ride one group per ``purge.PACE_SECONDS``
        at most."""
        with self.env.begin() as txn:
            marks = purge.pending(txn, self.tables, limit=1)
        if not marks:
            return None
        command = purge.PurgeCommand(self.tables, marks[0].sid)
        return self.writer.submit_background(command, repeat=True, pace=purge.PACE_SECONDS)

    def purge_all(self) -> int:
        """Free every purged session to the end (``start_purge``, one after another); blocks.
        How many chunks ran."""
        chunks = 0
        while (started := self.start_purge()) is not None:
            done = started.result()
            chunks += done.chunks
            if not done.done:  # the writer stopped first
                return chunks
        return chunks

    def _scan(self, txn: Txn, ids: Sequence[str]) -> erasure.Scan:
        """The feed records of ``ids`` (``erasure.scan``), but of none that is long: its delete
        is a tombstone whose chunks find its records themselves (``purge``)."""
        short = []
        for session_id in ids:
            meta = load_meta(txn, self.tables, session_id)
            if meta is None or meta.next_seq < purge.PURGE_FROM:
                short.append(session_id)
        return erasure.scan(txn, self.tables, short) if short else erasure.Scan()

    def _page(
        self, after: bytes, prefix: str = "", query: Filter | None = None, *, limit: int
    ) -> tuple[list[records.Listed], bool]:
        """A page of sessions in id order (``records.list_page``), as the store lists them."""
        with self.env.begin() as txn:
            return records.list_page(
                txn,
                self.tables,
                after=after,
                prefix=prefix,
                query=query or Filter(),
                order=records.BY_ID,
                limit=limit,
                now_ns=time.time_ns(),
            )
