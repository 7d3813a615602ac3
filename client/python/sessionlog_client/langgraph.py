"""A LangGraph checkpointer stored in sessionlog: ``graph.compile(checkpointer=...)``.

    from sessionlog_client.langgraph import SessionlogSaver

    with SessionlogSaver("127.0.0.1:50051") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"question": "What is LMDB?"}, {"configurable": {"thread_id": "t-1"}})

Install with ``pip install 'sessionlog-client[langgraph]'``.

One thread is one session, ``<prefix><thread id>`` (the prefix is ``langgraph.`` unless given;
a character a session id cannot hold is written ``-`` and its UTF-8 bytes in hex, and ``-``
itself as ``-2d``, so the thread id reads back from the session id). Every record is one
bookkeeping event (``EVENT_TYPE_STEP_END``, so it never reaches the derived messages) whose
data key ``langgraph`` names its kind:

- ``checkpoint``: ``ns`` (checkpoint_ns), ``id``, ``parent`` (the parent checkpoint's id, absent
  for a first one), the checkpoint without its channel values and its metadata as the saver's
  serde typed them (``[type, base64]``), and ``blobs``: the values of the channels this step
  changed (``new_versions``), ``[version, type, base64]`` each, as LangGraph's own savers keep
  them (a DeltaChannel stores a value only at its snapshots);
- ``writes``: one ``put_writes`` call: ``ns``, ``id`` (the checkpoint they are pending on),
  ``task``, ``path`` and ``writes`` (``[idx, channel, type, base64]`` each);
- ``drop``: the checkpoints ``prune`` and ``delete_for_runs`` removed (``ids``: ``[ns, id]``
  pairs). The log keeps them for audit; the saver no longer shows them or their writes.

Reads go newest first (``ListEvents`` "seq desc", in growing pages) and stop as soon as they
can: at the checkpoint wanted, then back to the checkpoints holding the channel values it did
not change and to its parent (its writes lie after the parent; see ``_Log``). The latest
checkpoint costs the last steps, not the thread's history; ``list`` with a ``limit`` stops once
it has that many. Checkpoint ids grow with the log (uuid6), so log order is id order.

Two workers on one thread (LangGraph issue 8796): a ``put`` names, as ``expected_seq``, the
log's length as this saver last saw it (a read, or its own write). When another writer appended
meanwhile, the saver reads what was added: pending writes and other namespaces are fine (it
retries past them), but a checkpoint in the same namespace means this worker's view is stale,
and ``put`` raises :class:`StaleThreadError` instead of forking the thread silently. A saver
that never read a thread writes its first checkpoint without the check.

``delete_thread`` and ``prune(strategy="delete")`` delete the session (DeleteSession);
``copy_thread`` forks it (ForkSession), so the copy shares nothing it could change later.

The async methods are native asyncio on an :class:`~sessionlog_client.AsyncClient` (one per
event loop when the saver was given an address): no thread hops. Both paths share the pure
parts: records are built and decoded by the same functions, and every read is a generator
(``_Log`` and the saver's ``_*_steps``) that yields ``NEED`` when it wants the next page of the
log; a sync or an async driver fetches that page and resumes it. With a blocking ``Client``
given, the async methods run the sync ones in a worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import datetime as dt
import functools
import random
import re
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, NamedTuple, Self, TypeVar

from google.protobuf.struct_pb2 import Value

from sessionlog_client._aio import AsyncClient
from sessionlog_client._sync import Client
from sessionlog_client.convert import WHOLE_LIMIT
from sessionlog_client.errors import SeqConflict, SessionNotFound
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.langgraph needs LangGraph: pip install 'sessionlog-client[langgraph]'"
    ) from exc

__all__ = ["SessionlogSaver", "StaleThreadError", "session_id_of", "thread_id_of"]

KIND = "langgraph"
"""The data key naming a record's kind: ``checkpoint``, ``writes`` or ``drop``."""
RECORD_TYPE = EventType.EVENT_TYPE_STEP_END
PAGE_SIZES = (16, 128, 1000)
"""The page sizes of a newest-first read, growing: most reads want the latest checkpoint."""
DROP_CHUNK = 2000
"""The most checkpoint ids one drop event names (an event is at most 1 MiB)."""
PUT_TRIES = 50
"""How often a put retries past other writers' pending writes before giving up."""
_KEEP = re.compile(r"[A-Za-z0-9_.]")
_Ids = list[list[str]]
"""[ns, id] pairs of checkpoints (a name of its own: the saver's ``list`` shadows the builtin)."""
EMPTY = ["empty", ""]
"""The stored value of a channel its step emptied (a version with no value)."""
CLOCK_SKEW = dt.timedelta(seconds=2)
"""How far the server's clock may run behind a worker's: see ``_Log``."""
WRITES_WAIT = 30.0
"""The most seconds a ``put_writes`` waits for this saver's puts to the thread to finish."""


class StaleThreadError(RuntimeError):
    """Another worker stored a checkpoint in this thread and namespace since this saver last
    read it: writing now would fork the thread silently. Read the thread again (``get_tuple``)
    and decide; the checkpoint was not stored."""


class _Found(NamedTuple):
    """A checkpoint record as stored."""

    seq: int
    ns: str
    id: str
    parent: str | None
    data: dict[str, Any]


# -- ids ------------------------------------------------------------------------------------------


def session_id_of(prefix: str, thread_id: str) -> str:
    """The session holding ``thread_id``: reversible (see :func:`thread_id_of`)."""
    kept = "".join(
        ch if _KEEP.match(ch) else "".join(f"-{b:02x}" for b in ch.encode()) for ch in thread_id
    )
    return prefix + kept


def thread_id_of(prefix: str, session_id: str) -> str:
    """The thread a session of this saver holds."""
    text = session_id[len(prefix) :]
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "-":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(text[i].encode())
            i += 1
    return out.decode()


# -- folding records read newest first (pure) ----------------------------------------------------


def _plain(value: Value) -> Any:
    """A Struct Value as a plain JSON value, whole numbers below 2^53 as ints (as
    ``struct_to_dict`` gives them): walked directly, a few times faster than protobuf's JSON
    mapping, and a read decodes every record it reaches."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "struct_value":
        return {k: _plain(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) < WHOLE_LIMIT else number
    if kind == "bool_value":
        return value.bool_value
    return None


def _data(event: Event) -> dict[str, Any]:
    """An event's data as plain values (see :func:`_plain`)."""
    return {k: _plain(v) for k, v in event.data.fields.items()}


class _Scan:
    """Which checkpoints the events after a point dropped. Fed events newest first."""

    def __init__(self) -> None:
        self.dropped: set[tuple[str, str]] = set()

    def see(self, event: Event, data: dict[str, Any] | None = None) -> _Found | None:
        """Take in one (older) event (``data``: its data, when already decoded); the checkpoint
        it stores when it is one still shown."""
        if event.type != RECORD_TYPE:
            return None
        if data is None:
            data = _data(event)
        kind = data.get(KIND)
        if kind == "drop":
            self.dropped.update((ns, cid) for ns, cid in data.get("ids", []))
        elif kind == "checkpoint":
            key = (data["ns"], data["id"])
            if key not in self.dropped:
                parent = data.get("parent")
                return _Found(event.seq, data["ns"], data["id"], parent, data)
        return None


class _Need:
    """What a read yields when it wants the next page of the log (see ``_Log``)."""


NEED = _Need()
_R = TypeVar("_R")
_Steps = Generator[_Need, None, _R]
"""A read that may ask for pages (``yield NEED``) and ends with its result."""


class _Log:
    """A log read newest first, on demand, indexed as it is read.

    It does no I/O: its reads are generators that yield ``NEED`` when they want an older
    event than those added so far; the driver reading the session (sync or async) fetches the
    next page, hands it to :meth:`add` and resumes them.

    A checkpoint stores only the channels its step changed (``new_versions``): the value of
    a channel at a version lies in the checkpoint that set that version, an older one, and
    :meth:`blob` reads back to it. A checkpoint's pending writes may come before it in the
    log: with ``durability="async"`` LangGraph stores a step's checkpoint and the next step's
    writes from background threads, the puts one after another but the writes whenever they
    are ready. The saver holds a ``put_writes`` back while one of its puts to the thread is
    under way, so the writes land after their checkpoint's parent at least (after the
    checkpoint itself unless its put had not started yet), and :meth:`pending` reads back to
    that parent; for a first checkpoint, to the events the server stamped ``CLOCK_SKEW``
    before the checkpoint's ``ts`` (the worker's clock).
    """

    def __init__(self) -> None:
        self._read: list[Event] = []
        self._unread: collections.deque[Event] = collections.deque()
        self._ended = False
        self._blobs: dict[tuple[str, str, str], list[str]] = {}
        self._stored: dict[tuple[str, str], _Found] = {}
        self._writes: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
        self.decoded: dict[int, dict[str, Any]] = {}
        """The data of each record read (by seq), decoded once for every read that looks."""

    def add(self, events: Sequence[Event], last: bool) -> None:
        """Take in the next (older) page of events; ``last`` when the log has no more. They
        are indexed one at a time as reads reach them: a read that stops early decodes only
        what it looked at."""
        self._unread.extend(events)
        self._ended = last

    def event(self, i: int) -> _Steps[Event | None]:
        """The i-th newest event, None past the log's start."""
        while len(self._read) <= i:
            if self._unread:
                self._index(self._unread.popleft())
            elif self._ended:
                return None
            else:
                yield NEED
        return self._read[i]

    def _index(self, event: Event) -> None:
        self._read.append(event)
        fields = event.data.fields
        if event.type != RECORD_TYPE or KIND not in fields:
            return
        kind = fields[KIND].string_value
        if kind == "checkpoint":
            data = self.decoded[event.seq] = _data(event)
            found = _Found(event.seq, data["ns"], data["id"], data.get("parent"), data)
            self._stored[(data["ns"], data["id"])] = found
            for channel, stored in data.get("blobs", {}).items():
                self._blobs.setdefault((data["ns"], channel, stored[0]), stored[1:])
        elif kind == "writes":
            data = self.decoded[event.seq] = _data(event)
            self._writes.setdefault((data["ns"], data["id"]), []).append((event.seq, data))

    def _back_to(self, done: Callable[[], bool]) -> _Steps[None]:
        while not done():
            if (yield from self.event(len(self._read))) is None:
                return

    def checkpoint(self, ns: str, checkpoint_id: str) -> _Steps[_Found | None]:
        """The checkpoint stored with that id, dropped or not (the log keeps it)."""
        key = (ns, checkpoint_id)
        yield from self._back_to(lambda: key in self._stored)
        return self._stored.get(key)

    def blob(self, ns: str, channel: str, version: str) -> _Steps[list[str] | None]:
        """``[type, base64]`` of the channel's value at ``version``, None when no checkpoint
        stored it."""
        key = (ns, channel, version)
        yield from self._back_to(lambda: key in self._blobs)
        return self._blobs.get(key)

    def pending(
        self, found: _Found, made: dt.datetime
    ) -> _Steps[list[tuple[tuple[str, str, int], str, str, str, Any]]]:
        """The writes pending on ``found`` (made at ``made``), in ``writes_sort_key`` order
        (task_path, task_id, idx), the order a super-step applies them in."""
        if found.parent:
            parent = (found.ns, found.parent)
            yield from self._back_to(lambda: parent in self._stored)
        else:
            oldest = made - CLOCK_SKEW
            yield from self._back_to(lambda: self._read[-1].time.ToDatetime(dt.UTC) < oldest)
        held: dict[tuple[str, int], tuple[str, str, str, Any]] = {}
        for _, data in sorted(self._writes.get((found.ns, found.id), []), key=lambda w: w[0]):
            for idx, channel, type_, blob in data["writes"]:
                slot = (data["task"], int(idx))
                # the first write of a (task, idx) wins, but the last of a special channel
                # (idx < 0: an error, an interrupt, a resume)
                if slot[1] < 0 or slot not in held:
                    held[slot] = (data.get("path", ""), channel, type_, blob)
        rows = [
            ((path, task, idx), task, channel, type_, blob)
            for (task, idx), (path, channel, type_, blob) in held.items()
        ]
        return sorted(rows, key=lambda row: row[0])


def _encode(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode()]


def _decode(stored: Sequence[str]) -> tuple[str, bytes]:
    return stored[0], base64.b64decode(stored[1])


def _made(checkpoint: Checkpoint) -> dt.datetime:
    """When the checkpoint was made (its ``ts``)."""
    made = dt.datetime.fromisoformat(checkpoint["ts"])
    return made if made.tzinfo else made.replace(tzinfo=dt.UTC)


def _record(data: dict[str, Any]) -> Event:
    made = Event(type=RECORD_TYPE)
    made.data.update(data)
    return made


# -- the saver ------------------------------------------------------------------------------------


class _LoopState:
    """What the async path keeps per event loop: its client (when the saver opened it), and
    its puts under way per session with the condition an ``aput_writes`` waits on. (The sync
    methods keep theirs apart: an ``aput_writes`` does not wait for a sync ``put`` running in
    another thread, nor the reverse; LangGraph uses one kind per run.)"""

    def __init__(self) -> None:
        self.client: AsyncClient | None = None
        self.putting: dict[str, int] = {}
        self.put_done = asyncio.Condition()


class SessionlogSaver(BaseCheckpointSaver[str]):
    """LangGraph's ``BaseCheckpointSaver`` over a sessionlog server (sync and async).

    ``client`` is the server's address(es), for clients this saver opens (a blocking one, and
    an :class:`~sessionlog_client.AsyncClient` per event loop that uses the async methods), or a
    client the caller keeps and closes: a :class:`~sessionlog_client.Client` (the async methods
    then run it in a worker thread) or an :class:`~sessionlog_client.AsyncClient` (async
    methods only). ``prefix`` starts every session id this saver uses (a letter or digit
    first); ``list(None)`` and ``delete_for_runs`` look at the sessions under it.
    """

    def __init__(
        self,
        client: Client | AsyncClient | str | Sequence[str],
        *,
        prefix: str = "langgraph.",
        serde: SerializerProtocol | None = None,
        **client_options: Any,
    ) -> None:
        super().__init__(serde=serde)
        if not prefix or not (prefix[0].isalnum() or prefix[0] == "_"):
            raise ValueError("prefix must start with a letter, a digit or '_'")
        self.prefix = prefix
        self._target = None if isinstance(client, Client | AsyncClient) else client
        self._options = client_options
        self._given_async = client if isinstance(client, AsyncClient) else None
        self._sync: Client | None = None
        if isinstance(client, Client):
            self._sync = client
        elif self._target is not None:
            self._sync = Client(self._target, **client_options)
        self._owned = self._target is not None
        self._loops: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._putting: dict[str, int] = {}
        self._put_done = threading.Condition()

    @property
    def client(self) -> Client:
        """The blocking client of the sync methods (none when given an AsyncClient)."""
        if self._sync is None:
            raise TypeError(
                "this SessionlogSaver was given an AsyncClient: use its async methods "
                "(aget_tuple, aput, ...), or give it an address or a Client"
            )
        return self._sync

    def close(self) -> None:
        """Close the blocking client this saver opened (none when one was given)."""
        if self._owned and self._sync is not None:
            self._sync.close()

    async def aclose(self) -> None:
        """Close the async client this saver opened for the running loop, and the blocking one
        it opened."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None and state.client is not None:
            await state.client.close()
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._loops if lp.is_closed()]:
            del self._loops[old]  # its loop is gone, and its channel with it
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
        return state

    def _aclient(self) -> AsyncClient | None:
        """The async client for the running loop; None when only a blocking Client was given
        (the async methods then run the sync ones in a worker thread)."""
        if self._given_async is not None:
            return self._given_async
        if self._target is None:
            return None
        state = self._loop_state()
        if state.client is None:
            state.client = AsyncClient(self._target, **self._options)
        return state.client

    # -- what this saver has seen of each log -----------------------------------------------------

    def _saw(self, session_id: str, length: int) -> None:
        with self._lock:
            self._seen[session_id] = max(self._seen.get(session_id, 0), length)

    def _wrote(self, session_id: str, first_seq: int, next_seq: int) -> None:
        """An append of ours landed at ``first_seq``: the view moves on only when nothing
        another writer appended lies between it and what this saver had seen."""
        with self._lock:
            if self._seen.get(session_id) == first_seq:
                self._seen[session_id] = next_seq

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._seen.pop(session_id, None)

    def _session(self, config: RunnableConfig) -> tuple[str, str, str]:
        """(thread id, session id, checkpoint_ns) of a config."""
        thread_id = str(config["configurable"]["thread_id"])
        ns = str(config["configurable"].get("checkpoint_ns", ""))
        return thread_id, session_id_of(self.prefix, thread_id), ns

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version that grows and is unique across branches (as InMemorySaver's): a value
        is stored once per (namespace, channel, version), and two branches forked from one
        checkpoint both step a channel from the same version."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- reading: the pure steps ------------------------------------------------------------------

    def _tuple_steps(self, thread_id: str, found: _Found, log: _Log) -> _Steps[CheckpointTuple]:
        checkpoint: Checkpoint = self.serde.loads_typed(_decode(found.data["checkpoint"]))
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            stored = yield from log.blob(found.ns, channel, str(version))
            if stored is not None and stored[0] != "empty":
                values[channel] = self.serde.loads_typed(_decode(stored))
        checkpoint["channel_values"] = values
        made = _made(checkpoint)
        metadata: CheckpointMetadata = self.serde.loads_typed(_decode(found.data["metadata"]))
        pending: list[PendingWrite] = [
            (task, channel, self.serde.loads_typed((type_, base64.b64decode(blob))))
            for _, task, channel, type_, blob in (yield from log.pending(found, made))
        ]
        parent: RunnableConfig | None = None
        if found.parent:
            parent = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": found.ns,
                    "checkpoint_id": found.parent,
                }
            }
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": found.ns,
                "checkpoint_id": found.id,
            }
        }
        return CheckpointTuple(config, checkpoint, metadata, parent, pending)

    @staticmethod
    def _checkpoint_steps(log: _Log) -> Generator[_Need | _Found, None, None]:
        """Every checkpoint still shown, newest first."""
        scan, i = _Scan(), 0
        while (event := (yield from log.event(i))) is not None:
            i += 1
            found = scan.see(event, log.decoded.get(event.seq))
            if found is not None:
                yield found

    def _find_steps(self, config: RunnableConfig, log: _Log) -> _Steps[_Found | None]:
        """The checkpoint ``config`` names, or the latest of its namespace."""
        _, _, ns = self._session(config)
        wanted = get_checkpoint_id(config)
        for found in self._checkpoint_steps(log):
            if not isinstance(found, _Found):
                yield NEED
            elif found.ns == ns and (wanted is None or found.id == wanted):
                return found
        return None

    def _get_steps(self, config: RunnableConfig, log: _Log) -> _Steps[CheckpointTuple | None]:
        found = yield from self._find_steps(config, log)
        if found is None:
            return None
        return (yield from self._tuple_steps(str(config["configurable"]["thread_id"]), found, log))

    def _list_steps(
        self,
        thread_id: str,
        ns: str | None,
        wanted: dict[str, Any],
        before_id: str | None,
        log: _Log,
    ) -> Generator[_Need | CheckpointTuple, None, None]:
        for found in self._checkpoint_steps(log):
            if not isinstance(found, _Found):
                yield NEED
                continue
            if ns is not None and found.ns != ns:
                continue
            if before_id is not None and found.id >= before_id:
                continue
            tup = yield from self._tuple_steps(thread_id, found, log)
            if all(tup.metadata.get(k) == v for k, v in wanted.items()):
                yield tup

    def _delta_steps(
        self, config: RunnableConfig, channels: Sequence[str], log: _Log
    ) -> _Steps[Mapping[str, DeltaChannelHistory]]:
        _, _, ns = self._session(config)
        target = yield from self._find_steps(config, log)
        writes: dict[str, list[PendingWrite]] = {channel: [] for channel in channels}
        seeds: dict[str, Any] = {}
        left = set(channels)
        cursor = target.parent if target else None
        while cursor and left:
            found = yield from log.checkpoint(ns, cursor)
            if found is None:
                break
            checkpoint = self.serde.loads_typed(_decode(found.data["checkpoint"]))
            rows = yield from log.pending(found, _made(checkpoint))
            for _, task, channel, type_, blob in reversed(rows):
                if channel in left:
                    value = self.serde.loads_typed((type_, base64.b64decode(blob)))
                    writes[channel].append((task, channel, value))
            for channel in list(left):
                version = checkpoint["channel_versions"].get(channel)
                stored = None
                if version is not None:
                    stored = yield from log.blob(ns, channel, str(version))
                if stored is not None and stored[0] != "empty":
                    seeds[channel] = self.serde.loads_typed(_decode(stored))
                    left.discard(channel)
            cursor = found.parent
        history: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            entry: DeltaChannelHistory = {"writes": writes[channel][::-1]}
            if channel in seeds:
                entry["seed"] = seeds[channel]
            history[channel] = entry
        return history

    def _list_args(
        self,
        config: RunnableConfig | None,
        before: RunnableConfig | None,
    ) -> tuple[str | None, str | None]:
        """(checkpoint_ns or None for every one, the id to list before) of a ``list``."""
        ns = None if config is None else config["configurable"].get("checkpoint_ns")
        return ns, get_checkpoint_id(before) if before else None

    # -- reading: the sync driver -----------------------------------------------------------------

    def _pages(self, session_id: str) -> Iterator[Any]:
        """The session's pages of events, newest first, growing, pinned to the log as the first
        page saw it; records its length as seen."""
        token, step = "", 0
        while True:
            size = PAGE_SIZES[min(step, len(PAGE_SIZES) - 1)]
            page = self.client.list_events(
                session_id, page_size=size, page_token=token, order_by="seq desc"
            )
            if step == 0:
                self._saw(session_id, page.event_count)
            yield page
            token, step = page.next_page_token, step + 1
            if not token:
                return

    def _run(self, session_id: str, steps: Callable[[_Log], _Steps[_R]]) -> _R:
        """A read's result, fetching the pages it asks for."""
        log, pages = _Log(), self._pages(session_id)
        return self._drain(log, pages, steps(log))

    @staticmethod
    def _drain(log: _Log, pages: Iterator[Any], steps: _Steps[_R]) -> _R:
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            page = next(pages)
            log.add(page.events, not page.next_page_token)

    def _each(
        self, session_id: str, steps: Callable[[_Log], Generator[Any, None, None]]
    ) -> Iterator[Any]:
        """What a read yields besides its page requests, fetching those pages."""
        log, pages = _Log(), self._pages(session_id)
        for item in steps(log):
            if item is NEED:
                page = next(pages)
                log.add(page.events, not page.next_page_token)
            else:
                yield item

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the thread's latest in its
        namespace; None when there is none. Reads back from the end to that checkpoint."""
        _, session_id, _ = self._session(config)
        return self._run(session_id, lambda log: self._get_steps(config, log))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of a thread (of every thread under the prefix when ``config`` is
        None), newest first: those whose metadata has every ``filter`` item, older than
        ``before``'s checkpoint, at most ``limit``. Reads back from the end and stops at
        ``limit``; without ``checkpoint_ns`` in the config, every namespace."""
        if limit is not None and limit <= 0:
            return
        if config is None:
            threads = [
                thread_id_of(self.prefix, s.session_id)
                for page in self.client.list_sessions(prefix=self.prefix)
                for s in page.sessions
            ]
        else:
            threads = [str(config["configurable"]["thread_id"])]
        ns, before_id = self._list_args(config, before)
        left = limit
        for thread_id in threads:
            for tup in self._each(
                session_id_of(self.prefix, thread_id),
                functools.partial(self._list_steps, thread_id, ns, filter or {}, before_id),
            ):
                yield tup
                if left is not None:
                    left -= 1
                    if left == 0:
                        return

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The writes of each channel along the checkpoint's ancestors, back to the nearest one
        that stored its value (the seed), in one newest-first read. Ancestors that ``prune``
        or ``delete_for_runs`` dropped still count: the log keeps them, so a DeltaChannel
        still rebuilds after ``prune(strategy="keep_latest")``."""
        if not channels:
            return {}
        _, session_id, _ = self._session(config)
        return self._run(session_id, lambda log: self._delta_steps(config, channels, log))

    # -- writing: the pure records ----------------------------------------------------------------

    def _checkpoint_record(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[Event, RunnableConfig]:
        """A put's event, and the config it returns."""
        thread_id, _, ns = self._session(config)
        values = checkpoint["channel_values"]
        blobs = {
            channel: [
                str(version),
                *(_encode(self.serde.dumps_typed(values[channel])) if channel in values else EMPTY),
            ]
            for channel, version in new_versions.items()
        }
        data: dict[str, Any] = {
            KIND: "checkpoint",
            "ns": ns,
            "id": checkpoint["id"],
            "checkpoint": _encode(self.serde.dumps_typed({**checkpoint, "channel_values": {}})),
            "blobs": blobs,
            "metadata": _encode(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
        }
        parent = config["configurable"].get("checkpoint_id")
        if parent:
            data["parent"] = parent
        stored: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        return _record(data), stored

    def _writes_record(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Event:
        """A put_writes' event."""
        _, _, ns = self._session(config)
        rows = [
            [WRITES_IDX_MAP.get(channel, idx), channel, *_encode(self.serde.dumps_typed(value))]
            for idx, (channel, value) in enumerate(writes)
        ]
        return _record(
            {
                KIND: "writes",
                "ns": ns,
                "id": config["configurable"]["checkpoint_id"],
                "task": task_id,
                "path": task_path,
                "writes": rows,
            }
        )

    def _after_conflict(
        self, session_id: str, ns: str, expected: int, added: Sequence[Event]
    ) -> int:
        """What another writer appended since ``expected``: the new expected seq when it is
        no checkpoint of ``ns``, else :class:`StaleThreadError`."""
        scan = _Scan()
        for event in reversed(added):
            found = scan.see(event)
            if found is not None and found.ns == ns:
                raise StaleThreadError(
                    f"thread session {session_id!r}: checkpoint {found.id!r} (seq "
                    f"{found.seq}) was stored in namespace {ns!r} since this saver "
                    "read the thread; read it again before writing"
                )
        self._saw(session_id, expected + len(added))
        return expected + len(added)

    def _drops(self, found: Iterator[_Found], runs: set[str] | None) -> _Ids:
        """The checkpoints to drop of one thread's, newest first: those of ``runs``, or (None)
        all but the latest of each namespace."""
        kept: set[str] = set()
        drop: _Ids = []
        for one in found:
            if runs is not None:
                meta = self.serde.loads_typed(_decode(one.data["metadata"]))
                if meta.get("run_id") in runs:
                    drop.append([one.ns, one.id])
            elif one.ns in kept:
                drop.append([one.ns, one.id])
            kept.add(one.ns)
        return drop

    @staticmethod
    def _drop_records(ids: _Ids) -> Iterator[Event]:
        for start in range(0, len(ids), DROP_CHUNK):
            yield _record({KIND: "drop", "ids": ids[start : start + DROP_CHUNK]})

    @staticmethod
    def _check_prune(strategy: str) -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")

    # -- writing: sync ----------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint as one event, refusing to fork the thread behind another worker's
        back (:class:`StaleThreadError`, see the module docstring)."""
        _, session_id, ns = self._session(config)
        record, stored = self._checkpoint_record(config, checkpoint, metadata, new_versions)
        with self._put_done:
            self._putting[session_id] = self._putting.get(session_id, 0) + 1
        try:
            self._append_checked(session_id, ns, record)
        finally:
            with self._put_done:
                self._putting[session_id] -= 1
                if not self._putting[session_id]:
                    del self._putting[session_id]
                self._put_done.notify_all()
        return stored

    def _append_checked(self, session_id: str, ns: str, record: Event) -> None:
        with self._lock:
            expected = self._seen.get(session_id)
        for _ in range(PUT_TRIES):
            try:
                reply = self.client.append(session_id, [record], expected_seq=expected)
            except SeqConflict as exc:
                assert expected is not None
                added = list(self.client.since(session_id, expected))
                try:
                    expected = self._after_conflict(session_id, ns, expected, added)
                except StaleThreadError as stale:
                    raise stale from exc
                continue
            self._saw(session_id, reply.next_seq)
            return
        raise StaleThreadError(f"thread session {session_id!r}: too many concurrent writers")

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store one task's writes pending on a checkpoint as one event."""
        _, session_id, _ = self._session(config)
        record = self._writes_record(config, writes, task_id, task_path)
        with self._put_done:  # after the checkpoint they name (see _Log)
            self._put_done.wait_for(lambda: session_id not in self._putting, WRITES_WAIT)
        reply = self.client.append(session_id, [record])
        self._wrote(session_id, reply.events[0].seq, reply.next_seq)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's session (nothing happens for a thread never written)."""
        session_id = session_id_of(self.prefix, thread_id)
        with contextlib.suppress(SessionNotFound):
            self.client.delete_session(session_id, reason="langgraph delete_thread")
        self._forget(session_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Fork the source thread's session, whole, into the target's (which must not exist).
        Nothing happens for a source never written."""
        source = session_id_of(self.prefix, source_thread_id)
        if not self.client.get_session(source).session.event_count:
            return
        self.client.fork_session(source, session_id=session_id_of(self.prefix, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: drop every checkpoint but the latest of each namespace (its writes
        stay); ``delete``: delete the threads."""
        self._check_prune(strategy)
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            session_id = session_id_of(self.prefix, thread_id)
            self._drop(session_id, self._drops(self._checkpoints(session_id), None))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Drop the checkpoints whose metadata ``run_id`` is one of ``run_ids``, in every thread
        under the prefix (and their writes)."""
        runs = set(run_ids)
        if not runs:
            return
        for page in self.client.list_sessions(prefix=self.prefix):
            for session in page.sessions:
                found = self._checkpoints(session.session_id)
                self._drop(session.session_id, self._drops(found, runs))

    def _checkpoints(self, session_id: str) -> Iterator[_Found]:
        return self._each(session_id, self._checkpoint_steps)

    def _drop(self, session_id: str, ids: _Ids) -> None:
        for record in self._drop_records(ids):
            reply = self.client.append(session_id, [record])
            self._wrote(session_id, reply.events[0].seq, reply.next_seq)

    # -- async: the same steps on an AsyncClient, in the running loop -----------------------------

    async def _apages(self, client: AsyncClient, session_id: str) -> AsyncGenerator[Any, None]:
        """:meth:`_pages` on the async client."""
        token, step = "", 0
        while True:
            size = PAGE_SIZES[min(step, len(PAGE_SIZES) - 1)]
            page = await client.list_events(
                session_id, page_size=size, page_token=token, order_by="seq desc"
            )
            if step == 0:
                self._saw(session_id, page.event_count)
            yield page
            token, step = page.next_page_token, step + 1
            if not token:
                return

    async def _arun(
        self, client: AsyncClient, session_id: str, steps: Callable[[_Log], _Steps[_R]]
    ) -> _R:
        """:meth:`_run` on the async client."""
        log, pages = _Log(), self._apages(client, session_id)
        running = steps(log)
        try:
            while True:
                try:
                    next(running)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                page = await anext(pages)
                log.add(page.events, not page.next_page_token)
        finally:
            await pages.aclose()

    async def _aeach(
        self,
        client: AsyncClient,
        session_id: str,
        steps: Callable[[_Log], Generator[Any, None, None]],
    ) -> AsyncGenerator[Any, None]:
        """:meth:`_each` on the async client."""
        log, pages = _Log(), self._apages(client, session_id)
        try:
            for item in steps(log):
                if item is NEED:
                    page = await anext(pages)
                    log.add(page.events, not page.next_page_token)
                else:
                    yield item
        finally:
            await pages.aclose()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.get_tuple, config)
        _, session_id, _ = self._session(config)
        return await self._arun(client, session_id, lambda log: self._get_steps(config, log))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(
                lambda: self.get_delta_channel_history(config=config, channels=channels)
            )
        if not channels:
            return {}
        _, session_id, _ = self._session(config)
        return await self._arun(
            client, session_id, lambda log: self._delta_steps(config, channels, log)
        )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        client = self._aclient()
        if client is None:
            found = await asyncio.to_thread(
                lambda: [*self.list(config, filter=filter, before=before, limit=limit)]
            )
            for tup in found:
                yield tup
            return
        if limit is not None and limit <= 0:
            return
        if config is None:
            threads = [
                thread_id_of(self.prefix, s.session_id)
                async for page in client.list_sessions(prefix=self.prefix)
                for s in page.sessions
            ]
        else:
            threads = [str(config["configurable"]["thread_id"])]
        ns, before_id = self._list_args(config, before)
        left = limit
        for thread_id in threads:
            tuples = self._aeach(
                client,
                session_id_of(self.prefix, thread_id),
                functools.partial(self._list_steps, thread_id, ns, filter or {}, before_id),
            )
            try:
                async for tup in tuples:
                    yield tup
                    if left is not None:
                        left -= 1
                        if left == 0:
                            return
            finally:
                await tuples.aclose()

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)
        _, session_id, ns = self._session(config)
        record, stored = self._checkpoint_record(config, checkpoint, metadata, new_versions)
        state = self._loop_state()
        state.putting[session_id] = state.putting.get(session_id, 0) + 1
        try:
            await self._aappend_checked(client, session_id, ns, record)
        finally:
            state.putting[session_id] -= 1
            if not state.putting[session_id]:
                del state.putting[session_id]
            async with state.put_done:
                state.put_done.notify_all()
        return stored

    async def _aappend_checked(
        self, client: AsyncClient, session_id: str, ns: str, record: Event
    ) -> None:
        with self._lock:
            expected = self._seen.get(session_id)
        for _ in range(PUT_TRIES):
            try:
                reply = await client.append(session_id, [record], expected_seq=expected)
            except SeqConflict as exc:
                assert expected is not None
                added = [event async for event in client.since(session_id, expected)]
                try:
                    expected = self._after_conflict(session_id, ns, expected, added)
                except StaleThreadError as stale:
                    raise stale from exc
                continue
            self._saw(session_id, reply.next_seq)
            return
        raise StaleThreadError(f"thread session {session_id!r}: too many concurrent writers")

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        client = self._aclient()
        if client is None:
            await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)
            return
        _, session_id, _ = self._session(config)
        record = self._writes_record(config, writes, task_id, task_path)
        state = self._loop_state()
        async with state.put_done:  # after the checkpoint they name (see _Log)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    state.put_done.wait_for(lambda: session_id not in state.putting),
                    WRITES_WAIT,
                )
        reply = await client.append(session_id, [record])
        self._wrote(session_id, reply.events[0].seq, reply.next_seq)

    async def adelete_thread(self, thread_id: str) -> None:
        client = self._aclient()
        if client is None:
            await asyncio.to_thread(self.delete_thread, thread_id)
            return
        session_id = session_id_of(self.prefix, thread_id)
        with contextlib.suppress(SessionNotFound):
            await client.delete_session(session_id, reason="langgraph delete_thread")
        self._forget(session_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        client = self._aclient()
        if client is None:
            await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)
            return
        source = session_id_of(self.prefix, source_thread_id)
        if not (await client.get_session(source)).session.event_count:
            return
        await client.fork_session(source, session_id=session_id_of(self.prefix, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        client = self._aclient()
        if client is None:
            await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)
            return
        self._check_prune(strategy)
        for thread_id in thread_ids:
            if strategy == "delete":
                await self.adelete_thread(thread_id)
                continue
            session_id = session_id_of(self.prefix, thread_id)
            found = [f async for f in self._aeach(client, session_id, self._checkpoint_steps)]
            await self._adrop(client, session_id, self._drops(iter(found), None))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        client = self._aclient()
        if client is None:
            await asyncio.to_thread(self.delete_for_runs, run_ids)
            return
        runs = set(run_ids)
        if not runs:
            return
        sessions = [
            s.session_id
            async for page in client.list_sessions(prefix=self.prefix)
            for s in page.sessions
        ]
        for session_id in sessions:
            found = [f async for f in self._aeach(client, session_id, self._checkpoint_steps)]
            await self._adrop(client, session_id, self._drops(iter(found), runs))

    async def _adrop(self, client: AsyncClient, session_id: str, ids: _Ids) -> None:
        for record in self._drop_records(ids):
            reply = await client.append(session_id, [record])
            self._wrote(session_id, reply.events[0].seq, reply.next_seq)
