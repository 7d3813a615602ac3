"""A sessionlog ``SessionStore`` for the Claude Agent SDK (``ClaudeAgentOptions(session_store=)``).

    from claude_agent_sdk import ClaudeAgentOptions
    from sessionlog_client.claude_agent_sdk import SessionlogSessionStore

    store = SessionlogSessionStore("127.0.0.1:50051")
    options = ClaudeAgentOptions(session_store=store)

Install with ``pip install 'sessionlog-client[claude-agent-sdk]'``.

How transcripts live in sessionlog (also in client/python/README.md, "Claude Agent SDK"):

- A main transcript (project key, session id) is the session ``{prefix}{project}.{session}``;
  a subagent transcript (same key plus a ``subpath``) is the sub-agent child session
  ``{prefix}{project}.{session}.{subpath}`` of it (CreateSession with ``parent_session_id``), its
  subpath kept verbatim as the child's title (``list_subkeys`` reads the titles). Each part is
  escaped (:func:`escape`) so no part holds a ``.``: a project's sessions are one ListSessions
  prefix, and the session id reads back from the id (:func:`unescape`). A project key or subpath
  escaped past 64 bytes is named by a hash of it; a session id that still does not fit
  sessionlog's 235 bytes is refused with ``ValueError`` before anything is written.
- Each transcript entry is one event holding the entry's JSON verbatim, as text, in
  ``entry_json``; user and assistant text, tool calls and tool results also project to the
  derived view. An append carries a request id made from the uuids of its entries, so the SDK's
  retry of a batch (the same entries) is stored once.
- The summary the SDK folds (``fold_session_summary``) is kept in the main session's record, as
  its title: ``{"n": EVENTS_COVERED, "data": {...}}``, written by the Append of the entries
  (``AppendRequest.title``): one call, one synced commit. The append names the log it folded
  onto (``expected_seq``, and ``expected_uid`` for a session deleted and made again to the same
  length); a refused one reads the title (GetSession) and folds again. A store's first append
  to a session folds onto nothing and names ``expected_seq`` 0: one call for a new session; a
  session that already holds events (resumed by another process) refuses it, and is read then.
  ``list_session_summaries`` and ``list_sessions`` are one ListSessions walk over the project's
  prefix: no event is read. A summary covering fewer events than the log holds (another writer
  appended without a title, or a session written by an older store, which updated the title in
  a second call) is reported one millisecond older than the session, which makes the SDK re-fold
  that session from its entries.
- ``delete`` of a main transcript deletes its children first (ListSessions ``parent = ID``),
  then the session itself: DeleteSession, a real erasure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

from sessionlog_client._aio import AsyncClient
from sessionlog_client._items import escape, get_exact, loads, put_exact, text_of, unescape
from sessionlog_client.errors import (
    RequestIdReused,
    SeqConflict,
    SessionAlreadyExists,
    SessionNotFound,
    SessionUidMismatch,
)
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from claude_agent_sdk._internal.session_summary import fold_session_summary
    from claude_agent_sdk.types import (
        SessionKey,
        SessionListSubkeysKey,
        SessionStore,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.claude_agent_sdk needs the Claude Agent SDK: "
        "pip install 'sessionlog-client[claude-agent-sdk]'"
    ) from exc

__all__ = [
    "SessionlogSessionStore",
    "entries_of",
    "entry_of",
    "escape",
    "event_of_entry",
    "request_id_of",
    "unescape",
]

ENTRY_KEY = "entry"
"""The entry's JSON text is in the data key ``entry_json``."""
_ENTRY_JSON = f"{ENTRY_KEY}_json"
MAX_ID_BYTES = 235
"""sessionlog's longest session id (SPEC §7)."""
MAX_TITLE_BYTES = 1024
"""The longest session title; a summary whose JSON is longer is not kept (the SDK re-folds)."""
_MAX_PART_BYTES = 64
"""A project key or subpath escaped past this many bytes is named by its hash instead."""


# -- ids (pure) ---------------------------------------------------------------------------------


def _part(value: str, limit: int) -> str:
    """``value`` escaped, or ``_h`` and a hash of it when that is longer than ``limit`` bytes:
    ``_h`` is never the start of an escaped string (``_`` is always followed by hex there)."""
    escaped = escape(value)
    if len(escaped.encode("utf-8")) <= limit:
        return escaped
    return "_h" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def request_id_of(entries: list[SessionStoreEntry]) -> str | None:
    """The append's request id: a hash of the entries' uuids, so a batch sent again is stored
    once; None when no entry has a uuid (those are appended without dedup, as the SDK asks)."""
    uuids = [str(e["uuid"]) for e in entries if isinstance(e.get("uuid"), str)]
    if not uuids:
        return None
    return "claude." + hashlib.sha256("\n".join(uuids).encode()).hexdigest()[:48]


# -- entries <-> events (pure) ------------------------------------------------------------------


def event_of_entry(entry: SessionStoreEntry) -> Event:
    """The event storing ``entry``: its JSON verbatim, plus what the derived view shows."""
    data: dict[str, Any] = {"entry_type": entry.get("type", "")}
    put_exact(data, ENTRY_KEY, entry)
    made = Event(type=_project(cast("dict[str, Any]", entry), data))
    made.data.update(data)
    return made


def _project(entry: dict[str, Any], data: dict[str, Any]) -> EventType:
    """Put the fields the derived view projects in ``data`` and say which type shows them."""
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if entry.get("type") == "user":
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if results:
            first = results[0]
            if isinstance(first.get("tool_use_id"), str):
                data["tool_call_id"] = first["tool_use_id"]
            shown = text_of(first.get("content"), {"text": "text"})
            data["content"] = shown if shown is not None else json.dumps(first.get("content"))
            return EventType.EVENT_TYPE_TOOL_RESULT
        text = text_of(content, {"text": "text"})
        if text is None:
            return EventType.EVENT_TYPE_STEP_END
        data["content"] = text
        return EventType.EVENT_TYPE_USER_MESSAGE
    if entry.get("type") == "assistant":
        text = text_of(content, {"text": "text"})
        calls = [
            {
                "id": str(b.get("id", "")),
                "type": "function",
                "function": {
                    "name": str(b.get("name", "")),
                    "arguments": json.dumps(b.get("input")),
                },
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        if text is None and not calls:
            return EventType.EVENT_TYPE_STEP_END
        if text is not None:
            data["content"] = text
        if calls:
            data["tool_calls"] = calls
        return EventType.EVENT_TYPE_ASSISTANT_MESSAGE
    return EventType.EVENT_TYPE_STEP_END


def entry_of(event: Event) -> SessionStoreEntry | None:
    """The entry an event stores, or None for an event another writer appended."""
    found, stored = get_exact(event, ENTRY_KEY)
    return cast("SessionStoreEntry", stored) if found and isinstance(stored, dict) else None


def entries_of(events: Sequence[Event]) -> list[SessionStoreEntry]:
    """The entries ``events`` store, in order (:func:`entry_of` of each, the ones that store
    none left out): a resume reads every entry of a transcript, so a batch of events that all
    store an entry (what this store writes) takes a few passes over it, not a call per event."""
    held = [e.data.fields.get(_ENTRY_JSON) for e in events]
    texts = ["" if stored is None else stored.string_value for stored in held]
    if all(texts):
        parsed = [loads(text) for text in texts]
        if all(type(stored) is dict for stored in parsed):
            return cast("list[SessionStoreEntry]", parsed)
    found: list[SessionStoreEntry] = []
    for event in events:
        value = event.data.fields.get(_ENTRY_JSON)
        text = "" if value is None else value.string_value  # "": no text there (or not a string)
        if text:
            stored = loads(text)
            if isinstance(stored, dict):
                found.append(cast("SessionStoreEntry", stored))
        elif value is not None and (entry := entry_of(event)) is not None:
            found.append(entry)  # an empty text: entry_of decides (it raises, as it always did)
    return found


def _summary_title(covered: int, data: Mapping[str, Any]) -> str:
    """The title holding a summary that covers the first ``covered`` events; without the data
    when its JSON does not fit a title (the SDK then folds that session from its entries)."""
    text = json.dumps({"n": covered, "data": data}, ensure_ascii=True, separators=(",", ":"))
    if len(text) <= MAX_TITLE_BYTES:
        return text
    return json.dumps({"n": covered})


def _read_summary(title: str) -> tuple[int, dict[str, Any] | None] | None:
    """``(events covered, data or None)`` of a title :func:`_summary_title` wrote, else None."""
    try:
        held = json.loads(title)
    except ValueError:
        return None
    if not isinstance(held, dict) or not isinstance(held.get("n"), int):
        return None
    data = held.get("data")
    return held["n"], data if isinstance(data, dict) else None


_Known = tuple[str, int, "dict[str, Any] | None"]
"""A main session as the store knows it: (uid, event count, summary data over its entries)."""
_NEW: _Known = ("", 0, None)
"""What a store's first append to a session assumes: none there yet (or an empty one). Its
``expected_seq`` 0 makes that a checked guess: a log holding events refuses it (SEQ_CONFLICT)
and the store reads the title then, so a new session costs one call, not a GetSession too."""


def _ms(session: pb.Session) -> int:
    return int(session.update_time.ToMilliseconds())


# -- the store ----------------------------------------------------------------------------------


class SessionlogSessionStore(SessionStore):
    """The Claude Agent SDK's ``SessionStore`` on a sessionlog server.

    ``client`` is an :class:`AsyncClient` (kept open by its owner) or an address, for which the
    store opens its own client on first use (close it with :meth:`close`). ``prefix`` starts
    every session id the store writes (a tenant token's prefix, or one per test).
    """

    def __init__(self, client: AsyncClient | str, *, prefix: str = "claude.") -> None:
        self._given = client if isinstance(client, AsyncClient) else None
        self._address = client if isinstance(client, str) else ""
        self._own: AsyncClient | None = None
        self.prefix = prefix
        self._children: set[str] = set()
        """Child sessions this store has made or seen made: no CreateSession for them again."""
        self._written: dict[str, _Known] = {}
        """What this store's last append left in each session: its uid, its length and the
        summary data the title holds: the next append folds its entries in without reading the
        title back (and names the uid and length, so a log changed meanwhile refuses it)."""

    async def close(self) -> None:
        """Close the client the store opened (not one it was given)."""
        if self._own is not None:
            await self._own.close()
            self._own = None

    @property
    def _client(self) -> AsyncClient:
        if self._given is not None:
            return self._given
        if self._own is None:
            self._own = AsyncClient(self._address)
        return self._own

    # -- ids --

    def _project_prefix(self, project_key: str) -> str:
        return f"{self.prefix}{_part(project_key, _MAX_PART_BYTES)}."

    def main_id(self, key: SessionKey | SessionListSubkeysKey) -> str:
        """The sessionlog session of the main transcript of ``key``. ``ValueError`` when it
        would be longer than a session id may be (SDK session ids are UUIDs: 36 bytes)."""
        log_id = self._project_prefix(key["project_key"]) + escape(key["session_id"])
        if len(log_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES - _MAX_PART_BYTES - 1:
            raise ValueError(
                f"the session id {key['session_id']!r} is too long for a sessionlog session id "
                f"(at most {MAX_ID_BYTES} bytes, with the prefix, project and subpath)"
            )
        return log_id

    def session_log_id(self, key: SessionKey) -> str:
        """The sessionlog session holding ``key``'s transcript (a child for a subpath)."""
        subpath = key.get("subpath")
        if not subpath:
            return self.main_id(key)
        return f"{self.main_id(key)}.{_part(subpath, _MAX_PART_BYTES)}"

    # -- required --

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        if not entries:
            return
        log_id = self.session_log_id(key)
        events = [event_of_entry(e) for e in entries]
        rid = request_id_of(entries)
        if key.get("subpath"):
            await self._ensure_child(key, log_id)
            with contextlib.suppress(RequestIdReused):  # the same uuids were stored before
                await self._client.append(log_id, events, request_id=rid)
            return
        await self._append_main(key, log_id, entries, events, rid)

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        loaded: list[SessionStoreEntry] = []
        async with self._client.since(self.session_log_id(key)) as stream:
            async for batch in stream.batches():
                loaded.extend(entries_of(batch))
        return loaded or None

    # -- optional --

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        prefix = self._project_prefix(project_key)
        return [
            {"session_id": unescape(session.session_id[len(prefix) :]), "mtime": _ms(session)}
            async for session, _ in self._mains(project_key)
        ]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        return [summary async for _, summary in self._mains(project_key) if summary is not None]

    async def delete(self, key: SessionKey) -> None:
        log_id = self.session_log_id(key)
        if not key.get("subpath"):
            for child in await self._client.children(log_id):
                await self._erase(child.session_id)
        await self._erase(log_id)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        return [child.title for child in await self._client.children(self.main_id(key))]

    # -- helpers --

    async def _erase(self, log_id: str) -> None:
        self._children.discard(log_id)
        self._written.pop(log_id, None)
        with contextlib.suppress(SessionNotFound):
            await self._client.delete_session(log_id, reason="claude-agent-sdk delete")

    async def _ensure_child(self, key: SessionKey, log_id: str) -> None:
        """Make the child session of a subagent transcript (and an empty main session when the
        subagent's transcript comes first: a child needs its parent)."""
        if log_id in self._children:
            return
        parent = self.main_id(key)
        subpath = key.get("subpath", "")
        try:
            await self._make(log_id, title=subpath, parent_session_id=parent)
        except SessionNotFound:  # no main session yet: an empty one, then the child
            await self._make(parent)
            await self._make(log_id, title=subpath, parent_session_id=parent)
        self._children.add(log_id)

    async def _make(self, log_id: str, **record: Any) -> None:
        """CreateSession with no events; one that exists already is as good."""
        with contextlib.suppress(SessionAlreadyExists):
            await self._client.create_session(log_id, request_id="", **record)

    async def _append_main(
        self,
        key: SessionKey,
        log_id: str,
        entries: list[SessionStoreEntry],
        events: list[Event],
        rid: str | None,
    ) -> None:
        """One Append: the entries, and the summary folded over them as the session's title, in
        one synced commit. It names the log the summary was folded onto (``expected_seq`` and
        ``expected_uid``): after another writer's append, or a delete and a new session of the
        same length, it is refused, and the store reads the title again and folds anew. The
        first append to a session this store has not written folds onto nothing (``_NEW``)."""
        known = self._written.get(log_id, _NEW)
        while True:
            uid, covered, data = known
            prev: SessionSummaryEntry | None = None
            if data is not None:
                prev = {"session_id": key["session_id"], "mtime": 0, "data": data}
            folded = fold_session_summary(prev, key, entries)
            title = _summary_title(covered + len(entries), folded["data"])
            try:
                reply = await self._client.append(
                    log_id,
                    events,
                    request_id=rid,
                    expected_seq=covered,
                    expected_uid=uid,
                    title=title,
                )
            except RequestIdReused:
                return  # the same uuids were stored by an earlier batch: ignore the duplicate
            except (SeqConflict, SessionUidMismatch):
                self._written.pop(log_id, None)
                known = await self._summary_now(key, log_id)
                continue
            if reply.events and reply.events[0].seq == covered:
                self._written[log_id] = (reply.session_uid, int(reply.next_seq), folded["data"])
            else:  # a replayed batch (stored before): what the title holds is not known here
                self._written.pop(log_id, None)
            return

    async def _summary_now(self, key: SessionKey, log_id: str) -> _Known:
        """The session's uid, length, and the summary data over its entries (None: none yet),
        read from its title; folded from its entries when the title does not cover them all."""
        session = (await self._client.get_session(log_id)).session
        if not session.exists:
            return "", 0, None
        length = int(session.event_count)
        held = _read_summary(session.title)
        if held is not None and held[0] == length and held[1] is not None:
            return session.uid, length, held[1]
        whole = await self._entries_upto(log_id, length)
        data = fold_session_summary(None, key, whole)["data"] if whole else None
        return session.uid, length, data

    async def _entries_upto(self, log_id: str, stop: int) -> list[SessionStoreEntry]:
        found: list[SessionStoreEntry] = []
        async for event in self._client.since(log_id):
            if event.seq >= stop:
                break
            entry = entry_of(event)
            if entry is not None:
                found.append(entry)
        return found

    async def _mains(
        self, project_key: str
    ) -> AsyncIterator[tuple[pb.Session, SessionSummaryEntry | None]]:
        """The project's main sessions that hold entries, each with its summary (None when
        its title holds none), from ListSessions alone: no event is read."""
        prefix = self._project_prefix(project_key)
        async for page in self._client.list_sessions(prefix=prefix):
            for session in page.sessions:
                if session.parent_session_id or session.event_count == 0:
                    continue
                session_id = unescape(session.session_id[len(prefix) :])
                held = _read_summary(session.title)
                covered, data = held if held is not None else (0, None)
                if data is None:
                    yield session, None
                    continue
                fresh = covered == session.event_count
                summary: SessionSummaryEntry = {
                    "session_id": session_id,
                    "mtime": _ms(session) if fresh else _ms(session) - 1,
                    "data": data,
                }
                yield session, summary
