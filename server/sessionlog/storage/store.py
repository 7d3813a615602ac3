"""The LMDB store: sessions, their events, and the memoized fold over them.

Reads run in the caller's thread inside short read transactions; writes go through the single
:class:`~sessionlog.storage.writer.Writer` thread and its group commit. See ``schema`` for the
layout and its invariants.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from sessionlog import errors, fold, wire
from sessionlog.storage import schema
from sessionlog.storage.schema import RequestRecord, SessionMeta
from sessionlog.storage.writer import Writer
from sessionlog.v1.event_pb2 import Event

DEFAULT_MAP_SIZE = 8 << 30
DEFAULT_REQUEST_ID_TTL_SECONDS = 24 * 3600


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


@dataclass
class AppendBatch:
    """An append, checked as far as it can be without the session's state."""

    session_id: str
    events: Sequence[Event]
    prechecked: Sequence[fold.Violation | None]
    bodies: Sequence[bytes]
    """Each event serialized as it will be stored, minus its seq."""
    expected_seq: int | None = None
    request_id: str = ""
    fingerprint: str = ""
    lease_holder: str = ""
    lenient: bool = False


@dataclass
class AppendResult:
    """What an append wrote: the stored events, the session's next seq, lenient drops."""

    events: list[bytes]
    next_seq: int
    drops: list[tuple[int, str, str]] = field(default_factory=list)


def prepare_append(
    session_id: str,
    events: Sequence[Event],
    *,
    limits: fold.Limits = fold.DEFAULT_LIMITS,
    expected_seq: int | None = None,
    request_id: str = "",
    lease_holder: str = "",
    lenient: bool = False,
    now_ns: int | None = None,
) -> AppendBatch:
    """Validate what needs no state, stamp missing times with now, serialize the events.

    Raises InvalidSessionId. Per-event failures are kept for the writer, which decides them in
    SPEC order once it knows the seq each event would get.
    """
    fold.check_session_id(session_id)
    fingerprint = _fingerprint(events, lenient) if request_id else ""
    stamp = time.time_ns() if now_ns is None else now_ns
    prechecked: list[fold.Violation | None] = []
    bodies: list[bytes] = []
    for index, event in enumerate(events):
        if not event.HasField("time"):
            event.time.FromNanoseconds(stamp)
        violation = fold.check_event(event, index, limits)
        prechecked.append(violation)
        bodies.append(b"" if violation else event.SerializeToString())
    return AppendBatch(
        session_id=session_id,
        events=events,
        prechecked=prechecked,
        bodies=bodies,
        expected_seq=expected_seq,
        request_id=request_id,
        fingerprint=fingerprint,
        lease_holder=lease_holder,
        lenient=lenient,
    )


def _fingerprint(events: Sequence[Event], lenient: bool) -> str:
    digest = hashlib.sha256(b"lenient" if lenient else b"strict")
    for event in events:
        body = event.SerializeToString(deterministic=True)
        digest.update(len(body).to_bytes(8, "big"))
        digest.update(body)
    return digest.hexdigest()


class Tables:
    """The open handles of every named database."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.sessions = env.open_db(schema.SESSIONS)
        self.ids = env.open_db(schema.IDS)
        self.events = env.open_db(schema.EVENTS)
        self.requests = env.open_db(schema.REQUESTS)
        self.counters = env.open_db(schema.COUNTERS)


class Store:
    """One LMDB environment holding every session."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: StoreConfig | None = None,
        on_commit: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.config = config = config or StoreConfig()
        self.path.mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(
            str(self.path),
            map_size=config.map_size,
            max_dbs=len(schema.ALL_DBS),
            sync=config.durable,
            metasync=config.durable,
            readahead=False,
            max_readers=1024,
        )
        self.tables = Tables(self.env)
        self._subscribers: list[Callable[[set[str]], None]] = []
        if on_commit is not None:
            self._subscribers.append(on_commit)
        self.writer = Writer(self.env, on_commit=self._committed)
        self._folds: OrderedDict[int, fold.SurfaceFold] = OrderedDict()
        self._folds_lock = threading.Lock()

    def close(self) -> None:
        """Finish queued writes, then close the environment."""
        self.writer.close()
        self.env.close()

    def subscribe(self, callback: Callable[[set[str]], None]) -> None:
        """Call ``callback(session_ids)`` from the writer thread after every commit."""
        self._subscribers.append(callback)

    def _committed(self, session_ids: set[str]) -> None:
        for callback in self._subscribers:
            callback(session_ids)

    # -- writes ---------------------------------------------------------------------------------

    def submit_append(self, batch: AppendBatch) -> Future[AppendResult]:
        """Queue an append; the future resolves once it is durable (or fails with its error)."""
        return self.writer.submit(_AppendCommand(self, batch))

    def append(self, session_id: str, events: Sequence[Event], **options: Any) -> AppendResult:
        """Validate and append, blocking until durable. Convenience for tools and tests."""
        batch = prepare_append(session_id, events, limits=self.config.limits, **options)
        return self.submit_append(batch).result()

    # -- reads ----------------------------------------------------------------------------------

    def meta(self, session_id: str, txn: lmdb.Transaction | None = None) -> SessionMeta | None:
        """The session's metadata, or None if it was never written."""
        if txn is None:
            with self.env.begin() as own:
                return self.meta(session_id, own)
        raw = txn.get(session_id.encode(), db=self.tables.sessions)
        return None if raw is None else SessionMeta.decode(raw)

    def read_events(
        self, sid: int, start: int, stop: int | None = None, max_bytes: int = 1 << 62
    ) -> list[bytes]:
        """Stored events of session ``sid`` with start <= seq < stop, in seq order.

        Stops early once ``max_bytes`` are gathered, but always returns at least one event when
        there is one. Costs O(events returned): one cursor walk over a contiguous key range.
        """
        out: list[bytes] = []
        total = 0
        end_key = schema.event_key(sid, stop) if stop is not None else schema.event_key(sid + 1, 0)
        with self.env.begin(buffers=True) as txn:
            cursor = txn.cursor(db=self.tables.events)
            if not cursor.set_range(schema.event_key(sid, start)):
                return out
            for key, value in cursor:
                if bytes(key) >= end_key:
                    break
                out.append(bytes(value))
                total += len(value)
                if total >= max_bytes:
                    break
        return out

    def surface(self, session_id: str, at_seq: int | None = None) -> fold.SurfaceFold:
        """The fold of a session's log, or of its prefix 0..at_seq.

        The full-log fold is memoized per session and extended by the events appended since it
        was last read (O(new)); a prefix other than the whole log is folded afresh.
        """
        meta = self.meta(session_id)
        count = 0 if meta is None else meta.next_seq
        if at_seq is not None and at_seq >= count:
            raise errors.BoundaryOutOfRange(
                f"at_seq {at_seq} is past the end of session '{session_id}' ({count} events)",
                at_seq=at_seq,
                next_seq=count,
            )
        if meta is None:
            return fold.SurfaceFold()
        target = count if at_seq is None else at_seq + 1
        with self._folds_lock:
            cached = self._folds.get(meta.sid)
            if cached is None or cached.count > target:
                cached = fold.SurfaceFold()
                if target == count:
                    self._remember(meta.sid, cached)
            else:
                self._folds.move_to_end(meta.sid)
            if cached.count < target:
                new = self.read_events(meta.sid, cached.count, target)
                cached.extend(Event.FromString(raw) for raw in new)
            return cached

    def _remember(self, sid: int, surface: fold.SurfaceFold) -> None:
        self._folds[sid] = surface
        while len(self._folds) > self.config.fold_cache_sessions:
            self._folds.popitem(last=False)


class _AppendCommand:
    """An append as the writer applies it: checks in SPEC order, then the puts."""

    def __init__(self, store: Store, batch: AppendBatch) -> None:
        self._store = store
        self._batch = batch
        self._touched: list[str] = []

    def size(self) -> int:
        return sum(len(b) for b in self._batch.bodies)

    def touched(self) -> Sequence[str]:
        return self._touched

    def apply(self, txn: lmdb.Transaction, now_ns: int) -> AppendResult:
        batch, tables = self._batch, self._store.tables
        meta = self._store.meta(batch.session_id, txn)
        if batch.request_id and meta is not None:
            replay = self._replay(txn, meta, now_ns)
            if replay is not None:
                return replay
        next_seq = 0 if meta is None else meta.next_seq
        if batch.expected_seq is not None and batch.expected_seq != next_seq:
            raise errors.SeqConflict(
                f"session '{batch.session_id}' expected seq {batch.expected_seq} but the log is at "
                f"{next_seq}; re-read and retry with expected_seq {next_seq}",
                expected_seq=batch.expected_seq,
                next_seq=next_seq,
            )
        kept, dropped = fold.admit(batch.events, batch.prechecked, next_seq, lenient=batch.lenient)
        drops = [(i, e.reason, e.message) for i, e in dropped]
        if not kept:
            return AppendResult([], next_seq, drops)
        if meta is None:
            meta = self._create(txn, now_ns)
        stored: list[bytes] = []
        for index in kept:
            seq = meta.next_seq
            raw = wire.with_seq(seq, batch.bodies[index])
            if not txn.put(schema.event_key(meta.sid, seq), raw, db=tables.events, overwrite=False):
                raise RuntimeError(f"event key {meta.sid}/{seq} already exists: log is corrupt")
            stored.append(raw)
            meta.next_seq += 1
            if fold.replace_range(batch.events[index]) is not None:
                meta.replace_generation += 1
        meta.last_append_time_ns = now_ns
        txn.put(batch.session_id.encode(), meta.encode(), db=tables.sessions)
        if batch.request_id:
            record = RequestRecord(
                fingerprint=batch.fingerprint,
                first_seq=next_seq,
                count=len(stored),
                next_seq=meta.next_seq,
                drops=drops,
                time_ns=now_ns,
            )
            key = schema.request_key(meta.sid, batch.request_id)
            txn.put(key, record.encode(), db=tables.requests)
        self._touched.append(batch.session_id)
        return AppendResult(stored, meta.next_seq, drops)

    def _replay(self, txn: lmdb.Transaction, meta: SessionMeta, now_ns: int) -> AppendResult | None:
        batch = self._batch
        key = schema.request_key(meta.sid, batch.request_id)
        raw = txn.get(key, db=self._store.tables.requests)
        if raw is None:
            return None
        record = RequestRecord.decode(raw)
        if now_ns - record.time_ns > self._store.config.request_id_ttl_seconds * 1_000_000_000:
            return None
        if record.fingerprint != batch.fingerprint:
            raise errors.RequestIdReused(
                f"request_id '{batch.request_id}' was already used on session "
                f"'{batch.session_id}' with different events; use a new request_id",
                request_id=batch.request_id,
            )
        events = []
        cursor = txn.cursor(db=self._store.tables.events)
        for seq in range(record.first_seq, record.first_seq + record.count):
            raw_event = cursor.get(schema.event_key(meta.sid, seq))
            if raw_event is None:
                raise RuntimeError(f"request record points at missing event {meta.sid}/{seq}")
            events.append(bytes(raw_event))
        return AppendResult(events, record.next_seq, list(record.drops))

    def _create(self, txn: lmdb.Transaction, now_ns: int) -> SessionMeta:
        tables = self._store.tables
        raw = txn.get(schema.NEXT_SID, db=tables.counters)
        sid = 0 if raw is None else schema.read_u64(raw)
        txn.put(schema.NEXT_SID, schema.u64(sid + 1), db=tables.counters)
        txn.put(schema.u64(sid), self._batch.session_id.encode(), db=tables.ids)
        return SessionMeta(sid=sid, create_time_ns=now_ns)
