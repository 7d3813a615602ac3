"""The fold cache: each session's memoized fold, and the reads served from it.

A session's fold (``fold.SurfaceFold``: its surface, state and projected messages) is kept in
memory after a read and extended by the events appended since (O(new)) on the next one; a
prefix of the log, or a page of a pinned view the memo does not hold, is folded afresh or walked
backwards (``fold.walk_back``) and memoizes nothing.

Invariants:

- A memo covers events 0..count-1 of the log stored under its sid, as stored when it was made:
  it is keyed by the session's internal id (a session deleted and written again gets another)
  and by the session's redaction count (``tables.redactions``), read with the session's record.
  A redaction, by any process of the server, changes the count, and the memo made under the old
  one is dropped at its next read; a delete or redaction in this process drops it at once
  (``forget``), so no erased content stays in memory.
- At most ``sessions`` memos, and about ``max_bytes`` of stored events folded into them; the
  least recently read go first, the most recent always stays.
- Everything read out is a copy (``SurfaceSnapshot``): later appends never change it. The memo
  is only touched under ``lock``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace

import lmdb
from google.protobuf.struct_pb2 import Struct

from sessionlog import errors, fold
from sessionlog.storage import damage, schema
from sessionlog.storage.reads import load_meta, read_range, walk_desc
from sessionlog.storage.schema import SessionMeta
from sessionlog.storage.tables import Tables
from sessionlog.v1.event_pb2 import Event


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
class MessagesPage:
    """The last messages of a pinned view before a position (see ``FoldCache.derive_page``)."""

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


class FoldCache:
    """The memoized folds of one store's sessions (see the module docstring)."""

    def __init__(
        self, env: lmdb.Environment, tables: Tables, sessions: int, max_bytes: int
    ) -> None:
        self.env = env
        self.tables = tables
        self.sessions = sessions
        """How many sessions keep a memo."""
        self.max_bytes = max_bytes
        """About how much stored data the memos may cover in all."""
        self.folds: OrderedDict[int, fold.SurfaceFold] = OrderedDict()
        """The memos by sid, least recently read first."""
        self.fold_bytes: dict[int, int] = {}
        """Per memoized sid: the stored bytes its fold has read."""
        self.held_bytes = 0
        """The sum of ``fold_bytes``, kept as it changes: a listing with each session's state
        folds many sessions in a row, and summing every memo's bytes at each would cost a step
        per memo per session."""
        self.marks: dict[int, int] = {}
        """Per memoized sid: its redaction count when the memo was made (``_fold`` checks it:
        a redaction by any process of the server leaves the count of events unchanged)."""
        self.lock = threading.Lock()

    def forget(self, sid: int) -> None:
        """Drop a session's memoized fold (a redaction or delete made it stale)."""
        with self.lock:
            if self.folds.pop(sid, None) is not None:
                self.held_bytes -= self.fold_bytes.pop(sid)
            self.marks.pop(sid, None)

    def meta_and_mark(self, session_id: str) -> tuple[SessionMeta | None, int]:
        """The session's metadata and its redaction count (what its fold memo keys on
        besides the event count), read in one transaction."""
        with self.env.begin() as txn:
            meta = load_meta(txn, self.tables, session_id)
            if meta is None:
                return None, 0
            return meta, self.redaction_mark(txn, meta.sid)

    def redaction_mark(self, txn: lmdb.Transaction, sid: int) -> int:
        """How many RedactEvents calls changed the session ``sid`` (0 on a read-only store from
        before the redactions table)."""
        if self.tables.redactions is None:
            return 0
        raw = txn.get(schema.u64(sid), db=self.tables.redactions)
        return 0 if raw is None else schema.read_u64(raw)

    def surface(
        self, session_id: str, at_seq: int | None = None, *, messages: bool = False
    ) -> SurfaceSnapshot:
        """The fold of a session's log, or of its prefix 0..at_seq, as a snapshot of its own.

        The full-log fold is memoized per session and extended by the events appended since it
        was last read (O(new)); a prefix other than the whole log is folded afresh. With
        ``messages`` the snapshot also carries each surface entry's serialized Message (projected
        once per entry, then memoized).
        """
        meta, target, mark = self.fold_target(session_id, at_seq)
        if meta is None:
            return SurfaceSnapshot(0, 0, [], [], [])
        with self.lock:
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
        meta, target, mark = self.fold_target(session_id, at_seq)
        if meta is None:
            return Struct(), 0
        with self.lock:
            folded = self._fold(session_id, meta, target, mark)
            return fold.state_struct(folded.state), folded.count

    def fold_target(
        self, session_id: str, at_seq: int | None
    ) -> tuple[SessionMeta | None, int, int]:
        """The session's record, how many events a fold through ``at_seq`` (None: the whole
        log) covers, and its redaction count (the memo's mark); BOUNDARY_OUT_OF_RANGE when
        at_seq is past the end."""
        meta, mark = self.meta_and_mark(session_id)
        count = 0 if meta is None else meta.next_seq
        if at_seq is not None and at_seq >= count:
            raise errors.BoundaryOutOfRange(
                f"at_seq {at_seq} is past the end of session '{session_id}' ({count} events)",
                at_seq=at_seq,
                next_seq=count,
            )
        return meta, count if at_seq is None else at_seq + 1, mark

    def derive_tail(
        self, session_id: str, known_count: int, known_generation: int
    ) -> SurfaceSnapshot | None:
        """The messages added since a caller's (event count, replace generation), or None when
        a replace happened since (or the caller's numbers are not this session's): then the
        caller needs the full list. The snapshot's ``projected``/``seqs`` hold only the tail,
        and the cost is O(new): no copy of the whole surface."""
        meta, mark = self.meta_and_mark(session_id)
        if meta is None or mark:
            # A redacted session always gets the full list: a caller's copy may predate it.
            return None
        with self.lock:
            folded = self._fold(session_id, meta, meta.next_seq, mark)
            if folded.replace_generation != known_generation or not (
                0 <= known_count <= folded.count
            ):
                return None
            seqs, projected = folded.tail(known_count)
            return SurfaceSnapshot(folded.count, folded.replace_generation, [], seqs, projected)

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
        """The last ``limit`` messages of a view, before position ``before`` (None: the end);
        with ``max_bytes``, only the last of them whose serialized bytes, each with
        ``MESSAGE_OVERHEAD``, fit in it (at least one: the caller answers one that alone does
        not fit with ResponseTooLarge). The ones left out belong to the pages before.

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
            mark = self.redaction_mark(txn, meta.sid)
            with self.lock:
                cached = self.folds.get(meta.sid)
                if cached is not None and self.marks.get(meta.sid, 0) != mark:
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
        cut = len(entries) - limit if len(entries) > limit else 0
        if max_bytes is not None:
            cut = max(cut, _overflow(projected, max_bytes))
        more = cut > 0
        if more:
            if walked is not None:  # the entries left out belong to the pages before
                left = tuple(e.seq for e in entries[:cut])
                walked = Resume(walked.next_seq, walked.hidden, (*walked.pending, *left))
            entries, projected = entries[cut:], projected[cut:]
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
        ``lock`` held. A damaged event raises DataCorrupted and leaves the memo as it
        was."""
        cached = self.folds.get(meta.sid)
        if cached is not None and self.marks.get(meta.sid, 0) != mark:
            self.folds.pop(meta.sid)
            self.held_bytes -= self.fold_bytes.pop(meta.sid)
            cached = None
        if cached is None or cached.count > target:
            cached = fold.SurfaceFold()
            if target == meta.next_seq:
                self._remember(meta.sid, cached)
                self.marks[meta.sid] = mark
        else:
            self.folds.move_to_end(meta.sid)
        if cached.count < target:
            with self.env.begin() as txn:
                new = read_range(
                    txn, self.tables, meta.sid, cached.count, target, session_id=session_id
                )
            if len(new) != target - cached.count:
                raise damage.missing_events(session_id, cached.count + len(new), target)
            cached.extend(damage.decode_events(new, cached.count, session_id))
            if meta.sid in self.folds:
                read = sum(map(len, new))
                self.fold_bytes[meta.sid] += read
                self.held_bytes += read
                self._evict()
        return cached

    def _remember(self, sid: int, surface: fold.SurfaceFold) -> None:
        self.folds[sid] = surface
        self.held_bytes -= self.fold_bytes.get(sid, 0)
        self.fold_bytes[sid] = 0

    def _evict(self) -> None:
        """Drop least recently read folds past the session count or the byte budget (counted
        as the stored bytes each fold has read; the most recent fold always stays)."""
        while len(self.folds) > 1 and (
            len(self.folds) > self.sessions or self.held_bytes > self.max_bytes
        ):
            sid, _ = self.folds.popitem(last=False)
            self.held_bytes -= self.fold_bytes.pop(sid)
            self.marks.pop(sid, None)


MESSAGE_OVERHEAD = 16
"""Bytes a message may add to a DeriveMessages reply besides its own: its tag and length, and
its seq in the packed ``seqs``."""


def _overflow(projected: list[bytes], max_bytes: int) -> int:
    """How many of the first ``projected`` messages to leave out so that the rest, each with
    ``MESSAGE_OVERHEAD``, fit in ``max_bytes``; never all of them."""
    used = 0
    for kept, message in enumerate(reversed(projected)):
        used += len(message) + MESSAGE_OVERHEAD
        if used > max_bytes:
            return len(projected) - max(kept, 1)
    return 0
