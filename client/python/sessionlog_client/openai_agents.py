"""A sessionlog session for the OpenAI Agents SDK: ``Runner.run(agent, input, session=...)``.

    from agents import Agent, Runner
    from sessionlog_client.openai_agents import SessionlogSession

    session = SessionlogSession("chat-42", "127.0.0.1:50051")
    result = await Runner.run(Agent(name="helper"), "What is LMDB?", session=session)

Install with ``pip install 'sessionlog-client[openai-agents]'``.

How items become events (the README's "Framework backends" has the table). Every item is one
event, and the item itself is kept verbatim in the event's data, as its JSON text in
``item_json``, so :meth:`SessionlogSession.get_items` returns exactly what was added (key order
and number types included), item types this module has never heard of too. Beside it the
event carries the fields the derived view projects, so ``DeriveMessages``, ``sessionlog messages``
and the web console show the same conversation:

- a message (``type`` "message" or absent, with a ``role``) is a system (``system`` and
  ``developer``), user or assistant message whose ``content`` is its text (the text parts joined);
- a function or custom tool call is an assistant message whose ``tool_calls`` holds the call;
- its output is a tool result naming the call (``tool_call_id``) with the output's text;
- every other item (reasoning, hosted tool calls, compaction, references, unknown types) is a
  bookkeeping event: ``TOOL_CALL`` when its type names a call or a tool, ``STEP_END`` otherwise.
  It keeps its place in the log and never reaches the derived view.

Events other writers append show too: a surface event storing no item (a summary that replaces
a range, a seeded message, a tool result) reads as the items its message amounts to (a role
message, function calls, a function call output), so ``get_items`` and ``DeriveMessages`` show
one conversation however it was written.

Removal is non-destructive: :meth:`~SessionlogSession.pop_item` and
:meth:`~SessionlogSession.clear_session` append an ``EVENT_TYPE_HIDE``. A hide shadows every
earlier event whose position lies in its range, the rule the server's fold applies to surface
events; this module applies the same rule to the bookkeeping items, so a popped reasoning item is
gone from ``get_items`` (the server's view never showed it) while the log keeps it for audit and
fork.

Compaction: wrapped in the SDK's ``OpenAIResponsesCompactionSession``, a compaction replaces the
items it compacted with one summary event (a replace over their positions, holding the output
items in ``items_json``) rather than clearing the session and adding the output back, so an
item another writer appends meanwhile stays in view, after the summary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

from sessionlog_client._aio import AsyncClient
from sessionlog_client._items import (
    TAIL_PAGE_MAX,
    TAIL_PAGE_MIN,
    get_exact,
    in_view,
    latest,
    loads,
    newest,
    position,
    put_exact,
    tail_page_size,
    text_of,
)
from sessionlog_client.convert import struct_to_dict
from sessionlog_client.errors import SeqConflict, SessionUidMismatch
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'sessionlog-client[openai-agents]'"
    ) from exc

try:  # the SDK's private compaction hook (0.24): without it the SDK clears and adds instead
    from agents.memory.session import _CompactionSnapshot
except ImportError:  # pragma: no cover - depends on the installed SDK
    _CompactionSnapshot = None  # type: ignore[assignment,misc]

__all__ = [
    "SessionItem",
    "SessionlogSession",
    "event_items",
    "item_to_event",
    "plain_items",
    "visible_items",
]

ITEM_KEY = "item"
"""The item's JSON text is in the data key ``item_json``."""
ITEM_TYPE_KEY = "item_type"
"""The data key naming the item's type ("message" for role messages without one)."""
_ITEM_JSON = f"{ITEM_KEY}_json"
SUMMARY_KEY = "items"
"""A compaction's summary event keeps the items it stands for as JSON text in ``items_json``."""
SUMMARY_TYPE = "compaction_summary"
"""The ``item_type`` of a compaction's summary event."""

_ROLE_TYPES = {
    "user": EventType.EVENT_TYPE_USER_MESSAGE,
    "system": EventType.EVENT_TYPE_SYSTEM_MESSAGE,
    "developer": EventType.EVENT_TYPE_SYSTEM_MESSAGE,
    "assistant": EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
}
_ROLE_OF_TYPE = {
    EventType.EVENT_TYPE_USER_MESSAGE: "user",
    EventType.EVENT_TYPE_SYSTEM_MESSAGE: "system",
    EventType.EVENT_TYPE_ASSISTANT_MESSAGE: "assistant",
}
_TOOL_CALLS = frozenset({"function_call", "custom_tool_call"})
_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


class SessionItem(NamedTuple):
    """One item of the session as the log holds it: the seq of its event and the item."""

    seq: int
    item: dict[str, Any]


TAIL_KEPT = 2000
"""The most events of a log's end a session remembers between calls (see ``_Tail``)."""


class _Tail(NamedTuple):
    """The end of the log as this session last read or wrote it: ``events``, every event from
    the lowest seq among them to ``length - 1`` (newest first), and whether they start at seq 0.

    Only a guess at the log: a write made on it names ``expected_seq=length`` and
    ``expected_uid=uid``, so a log another writer changed meanwhile (or deleted and wrote again
    to the same length) refuses it (SEQ_CONFLICT, SESSION_UID_MISMATCH) and the session reads
    again. ``uid`` is the session's Session.uid, empty when the read that made the tail did not
    report it (Since): such a tail is not trusted for a write.
    """

    events: list[Event]
    length: int
    complete: bool
    uid: str = ""

    def extended(self, reply: pb.AppendResponse) -> _Tail | None:
        """This tail with an append's stored events after it; None when they do not follow
        on (another writer appended in between: the tail is no longer known)."""
        if not reply.events or reply.events[0].seq != self.length:
            return None
        if self.uid and reply.session_uid != self.uid:
            return None  # another incarnation of the session (deleted and written again)
        events = [*reversed(reply.events), *self.events]
        if len(events) > TAIL_KEPT:
            return _Tail(events[:TAIL_KEPT], int(reply.next_seq), False, self.uid)
        return _Tail(events, int(reply.next_seq), self.complete, self.uid)


# -- items -> events (pure) ---------------------------------------------------------------------


def item_type(item: dict[str, Any]) -> str:
    """The item's type; a role message without one (EasyInputMessage) is a "message"."""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else "unknown"


def item_to_event(item: dict[str, Any]) -> Event:
    """The event that stores ``item``: verbatim, plus the fields the derived view shows."""
    kind = item_type(item)
    data: dict[str, Any] = {ITEM_TYPE_KEY: kind}
    put_exact(data, ITEM_KEY, item)
    role = item.get("role")
    if kind == "message" and isinstance(role, str) and role in _ROLE_TYPES:
        type_ = _ROLE_TYPES[role]
        text = text_of(item.get("content"), _TEXT_PARTS)
        if text is not None:
            data["content"] = text
    elif kind in _TOOL_CALLS:
        type_ = EventType.EVENT_TYPE_ASSISTANT_MESSAGE
        data["tool_calls"] = [_tool_call(kind, item)]
    elif kind in _TOOL_OUTPUTS:
        type_ = EventType.EVENT_TYPE_TOOL_RESULT
        if isinstance(item.get("call_id"), str):
            data["tool_call_id"] = item["call_id"]
        text = text_of(item.get("output"), _TEXT_PARTS)
        if text is not None:
            data["content"] = text
    elif "call" in kind or "tool" in kind or kind.startswith("mcp_"):
        type_ = EventType.EVENT_TYPE_TOOL_CALL
    else:
        type_ = EventType.EVENT_TYPE_STEP_END
    made = Event(type=type_)
    made.data.update(data)
    return made


def _tool_call(kind: str, item: dict[str, Any]) -> dict[str, Any]:
    """The chat-format tool call of a function (or custom tool) call item."""
    if kind == "function_call":
        detail = {"name": item.get("name"), "arguments": item.get("arguments")}
        return {"id": item.get("call_id"), "type": "function", "function": detail}
    custom = {"name": item.get("name"), "input": item.get("input")}
    return {"id": item.get("call_id"), "type": "custom", "custom": custom}


def summary_event(items: list[dict[str, Any]], start: int, stop: int) -> Event:
    """The event a compaction appends: it replaces the positions [start, stop] and stands for
    ``items`` (what the compaction returned, kept verbatim, in order). The derived view shows it
    as one user message whose content is the text of the items' messages (none for an opaque
    ``compaction`` item alone)."""
    data: dict[str, Any] = {ITEM_TYPE_KEY: SUMMARY_TYPE}
    put_exact(data, SUMMARY_KEY, items)
    texts = [text_of(i.get("content"), _TEXT_PARTS) for i in items if item_type(i) == "message"]
    text = "\n".join(t for t in texts if t)
    if text:
        data["content"] = text
    made = Event(type=EventType.EVENT_TYPE_USER_MESSAGE)
    made.data.update(data)
    made.surface_op.replace.start_seq = start
    made.surface_op.replace.stop_seq = stop
    return made


# -- events -> items (pure) ---------------------------------------------------------------------


def event_item(event: Event) -> dict[str, Any] | None:
    """The item an event of this module stores, or None for an event that stores none."""
    found, item = get_exact(event, ITEM_KEY)
    return item if found and isinstance(item, dict) else None


def event_items(event: Event) -> list[dict[str, Any]]:
    """The items an event shows: the one it stores, or for a surface event some other writer
    appended (a summary replacing a range, a seeded message), the items its message reads as."""
    item = event_item(event)
    if item is not None:
        return [item]
    found, summary = get_exact(event, SUMMARY_KEY)
    if found and isinstance(summary, list):
        return [i for i in summary if isinstance(i, dict)]
    if event.type == EventType.EVENT_TYPE_TOOL_RESULT:
        fields = struct_to_dict(event.data)
        call_id = fields.get("tool_call_id")
        if not isinstance(call_id, str):
            return []
        return [{"type": "function_call_output", "call_id": call_id, "output": _text(fields)}]
    role = _ROLE_OF_TYPE.get(event.type)
    if role is None:
        return []  # a hide, a turn marker: no message to read items from, data not decoded
    fields = struct_to_dict(event.data)
    text = _text(fields)
    shown: list[dict[str, Any]] = []
    if text or role != "assistant" or not fields.get("tool_calls"):
        shown.append({"role": role, "content": text})
    for call in fields.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            shown.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return shown


def _text(fields: dict[str, Any]) -> str:
    content = fields.get("content")
    return content if isinstance(content, str) else ""


def plain_items(events: Sequence[Event]) -> list[dict[str, Any]] | None:
    """The items of a log whose every event stores one item and none replaces or hides (what
    this module writes until a pop, a clear or a compaction), in order: ``visible_items``
    without the seqs, in a few passes over the log instead of one call per event; None for
    any other log (then ``visible_items`` reads it).
    """
    if any(e.HasField("surface_op") for e in events):
        return None
    held = [e.data.fields.get(_ITEM_JSON) for e in events]
    texts = ["" if stored is None else stored.string_value for stored in held]
    if not all(texts):
        return None
    found = [loads(text) for text in texts]
    return found if all(type(item) is dict for item in found) else None


def visible_items(events: Iterable[Event], start: int = 0) -> list[SessionItem]:
    """The items of a log still in view, in position order; from position ``start`` on when
    ``events`` is a tail of the log (see ``known_from``).

    An event is out of view when a later replace or hide covers its position: the server's
    shadowing rule, here applied to every item event, the bookkeeping ones included. A surface
    event another writer appended shows as the items its message reads as (see
    :func:`event_items`), so ``get_items`` shows what ``DeriveMessages`` shows; other events
    storing no item (a turn marker) are passed over.
    """
    shown: list[SessionItem] = []
    for event in in_view(events):
        if start and position(event) < start:
            continue
        shown.extend(entries_of(event))
    return shown


def entries_of(event: Event) -> list[SessionItem]:
    """The items an event in view shows, each with its seq (:func:`event_items`)."""
    # event_items inlined for the common event, an item's JSON text: "" when the key holds no
    # text (or is absent), which event_items then reads as get_exact always did
    stored = event.data.fields.get(_ITEM_JSON)
    text = "" if stored is None else stored.string_value
    if text:
        item = loads(text)
        if isinstance(item, dict):
            return [SessionItem(event.seq, item)]
    return [SessionItem(event.seq, item) for item in event_items(event)]


def latest_items(tail: Sequence[Event], more: bool, limit: int) -> list[SessionItem] | None:
    """The latest ``limit`` items in view from ``tail``, the log's newest events read newest
    first (``more`` when older ones are unread); None when only an older page can tell. Only the
    events that decide them are decoded (``_items.newest``), else ``_items.latest``."""
    found = newest(tail, more, limit, entries_of)
    return found if found is not None else latest(tail, more, limit, visible_items)


# -- the session --------------------------------------------------------------------------------


class SessionlogSession:
    """The OpenAI Agents SDK ``Session`` protocol, stored in a sessionlog session.

    ``client`` is an :class:`~sessionlog_client.AsyncClient`, or the address(es) of the server:
    then the session opens one client per event loop it is used from (``Runner.run_sync`` runs
    its own loop) and :meth:`close` closes them. A client passed in is the caller's to close.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        client: AsyncClient | str | Sequence[str],
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        **client_options: Any,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._given = client if isinstance(client, AsyncClient) else None
        self._target = None if isinstance(client, AsyncClient) else client
        self._options = client_options
        self._opened: dict[asyncio.AbstractEventLoop, AsyncClient] = {}
        self._tail: _Tail | None = None

    def _client(self) -> AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._opened if lp.is_closed()]:
            del self._opened[old]  # its loop is gone, and its channel with it
        if loop not in self._opened:
            self._opened[loop] = AsyncClient(self._target, **self._options)
        return self._opened[loop]

    async def close(self) -> None:
        """Close the client this session opened for the running loop (none if one was given)."""
        opened = self._opened.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened.close()

    async def _read(
        self, limit: int | None, page_size: int = 0
    ) -> tuple[list[SessionItem], list[Event], int]:
        """The items in view (with ``limit``, the latest ``limit`` of them), the events read,
        and the log's length as read.

        Without a limit the whole log; with one, pages of ListEvents "seq desc" (pinned to the
        log as the first page saw it; ``page_size`` events each, 0: ``tail_page_size(limit)``)
        until the latest ``limit`` items are known: a hide near the end may cover items further
        back, so a page can add fewer items than it holds (``_items.latest`` tells when the
        pages read so far decide them).
        """
        client = self._client()
        if limit is None:
            events = await self._read_all()
            return visible_items(events), events, len(events)
        tail: list[Event] = []
        token, length = "", -1
        while True:
            page = await client.list_events(
                self.session_id,
                page_size=min(page_size or tail_page_size(limit), TAIL_PAGE_MAX),
                page_token=token,
                order_by="seq desc",
            )
            length = page.event_count if length < 0 else length
            tail.extend(page.events)
            token = page.next_page_token
            entries = latest_items(tail, bool(token), limit)
            if entries is not None:
                complete = not token and len(tail) <= TAIL_KEPT
                self._tail = _Tail(tail[:TAIL_KEPT], length, complete, page.session_uid)
                return entries, tail, length

    async def _read_all(self) -> list[Event]:
        """Every event of the log, from one Since stream read a response at a time; the end
        of it is remembered (``_Tail``)."""
        events: list[Event] = []
        async with self._client().since(self.session_id) as stream:
            async for batch in stream.batches():
                events.extend(batch)
        kept = events[-TAIL_KEPT:][::-1]
        self._tail = _Tail(kept, len(events), len(kept) == len(events))
        return events

    def _limit(self, limit: int | None) -> int | None:
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit < 0:
            return None  # as the SDK's SQLiteSession: a negative limit is no limit
        return limit

    async def get_entries(self, limit: int | None = None) -> list[SessionItem]:
        """The items in view with the seq of the event storing each (the latest ``limit``)."""
        limit = self._limit(limit)
        if limit == 0:
            return []
        entries, _, _ = await self._read(limit)
        return entries

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first; with ``limit``, the latest ``limit`` items in order."""
        limit = self._limit(limit)
        if limit is None:
            events = await self._read_all()
            found = plain_items(events)
            if found is None:
                found = [e.item for e in visible_items(events)]
            return cast("list[TResponseInputItem]", found)
        if limit == 0:
            return []
        entries, _, _ = await self._read(limit)
        return [cast("TResponseInputItem", e.item) for e in entries]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append one event per item, all in one atomic append."""
        if not items:
            return
        events = [item_to_event(cast("dict[str, Any]", item)) for item in items]
        known = self._tail
        reply = await self._client().append(self.session_id, events)
        self._tail = known.extended(reply) if known is not None else None

    async def pop_item(self) -> TResponseInputItem | None:
        """Hide the newest item in view and return it; None when nothing is in view.

        It hides the event that item came from: for a message of another writer that reads as
        several items (an assistant message with tool calls), all of them. One call (the hide)
        when the end of the log this session last read or wrote still decides the newest item
        (``_Tail``): the hide names ``expected_seq``, so a log another writer changed refuses
        it and the session reads the log again; otherwise a read, then the hide.
        """
        client = self._client()
        while True:
            known = self._tail
            entries = None
            if known is not None and known.uid:
                entries = latest_items(known.events, not known.complete, 1)
            if entries:  # an empty view is only believed when read now
                events, length = known.events, known.length  # type: ignore[union-attr]
            else:
                # hides at the end (pops) cover as many items before them: read past what the
                # tail held, so that a run of pops reads again once per doubling, not per page
                deeper = 0 if known is None else len(known.events) + TAIL_PAGE_MIN
                entries, events, length = await self._read(1, deeper)
                known = self._tail
            if not entries:
                return None
            newest = entries[-1]
            where = next(position(e) for e in events if e.seq == newest.seq)
            try:
                reply = await client.hide(
                    self.session_id,
                    where,
                    where,
                    reason="pop_item",
                    expected_seq=length,
                    expected_uid=known.uid if known is not None else "",
                )
            except (SeqConflict, SessionUidMismatch):
                self._tail = None
                continue
            self._tail = known.extended(reply) if known is not None else None
            return cast("TResponseInputItem", newest.item)

    async def clear_session(self) -> None:
        """Hide every item so far; the log keeps them."""
        self._tail = None
        await self._client().clear(self.session_id, reason="clear_session")

    # -- compaction (the SDK's OpenAIResponsesCompactionSession) --

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The latest ``limit`` items and a ``replace_suffix`` that puts the compaction's output
        in place of a suffix of them: the hook the SDK's ``OpenAIResponsesCompactionSession``
        uses after a turn instead of clearing the session and adding the output back.

        The replacement is one replace event over the suffix's positions, so what another
        writer appended after the snapshot stays in view after the summary; it is appended only
        while the items in view in that range are still the ones read (``expected_seq``,
        re-checked on ``SEQ_CONFLICT``), else it writes nothing and returns False. None (the
        SDK falls back to its own path) for a subclass, which may transform items, and for a
        wrapper that prunes expired items first (``EncryptedSession``).
        """
        if (
            type(self) is not SessionlogSession
            or prune_prefix is not None
            or _CompactionSnapshot is None
        ):
            return None
        entries, events, _ = await self._read(limit + 1)
        complete = len(entries) <= limit
        entries = entries[-limit:] if limit > 0 else []
        where = {e.seq: position(e) for e in events}
        items = [cast("TResponseInputItem", e.item) for e in entries]

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            expected = entries[start:]
            if not expected or (start > 0 and entries[start - 1].seq == expected[0].seq):
                return False  # nothing to replace, or it would split one event's items
            low, high = where[expected[0].seq], max(where[e.seq] for e in expected)
            summary = summary_event([cast("dict[str, Any]", i) for i in output], low, high)
            return await self._replace_range(expected, low, high, summary)

        return _CompactionSnapshot(items, complete, replace_suffix)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK's whole-history replacement (a manual ``run_compaction``): one summary event
        replacing every position up to the newest item in view, so the session is never empty
        in between (a clear, then an add) and the log keeps what it replaced. What another
        writer appends after this read stays in view after the summary. False (the SDK clears
        and adds) for a subclass, which may transform items."""
        if type(self) is not SessionlogSession:
            return False
        entries, events, _ = await self._read(1)
        output = [cast("dict[str, Any]", i) for i in items]
        if not entries:
            await self.add_items(items)
            return True
        high = next(position(e) for e in events if e.seq == entries[-1].seq)
        self._tail = None
        await self._client().append(self.session_id, [summary_event(output, 0, high)])
        return True

    async def _replace_range(
        self, expected: list[SessionItem], low: int, high: int, summary: Event
    ) -> bool:
        """Append ``summary`` (a replace of [low, high]) while the items in view at those
        positions are ``expected``; False, writing nothing, once they are not.

        The events from seq ``low`` on decide the view of every position from ``low`` on: an
        older event sits below ``low`` and cannot shadow a newer one.
        """
        client = self._client()
        while True:
            events = [e async for e in client.since(self.session_id, low)]
            length = events[-1].seq + 1 if events else low
            where = {e.seq: position(e) for e in events}
            now = [x for x in visible_items(events, low) if where[x.seq] <= high]
            if now != expected:
                return False
            self._tail = None
            try:
                await client.append(self.session_id, [summary], expected_seq=length)
            except SeqConflict:
                continue  # another writer appended: check the range again
            return True
