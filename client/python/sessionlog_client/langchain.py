"""A sessionlog ``BaseChatMessageHistory`` for LangChain (``langchain_core.chat_history``).

    from sessionlog_client.langchain import SessionlogChatMessageHistory

    history = SessionlogChatMessageHistory("chat-42", "127.0.0.1:50051")
    history.add_user_message("What is LMDB?")
    history.messages  # [HumanMessage(content='What is LMDB?', ...)]

Install with ``pip install 'sessionlog-client[langchain]'``.

How messages live in sessionlog (also in client/python/README.md, "LangChain"):

- One history is one session; two history objects on the same session id share it.
- Each message is one event holding LangChain's own dict of it (``message_to_dict``) as JSON
  text in ``message_json``, so ``messages`` returns equal messages of the same classes (ids,
  tool calls, ``additional_kwargs``, ``response_metadata`` and chunks included). Beside it the
  event carries what the derived view shows: a system, human or AI message is a system, user or
  assistant message with its text (an AI message's tool calls as OpenAI ``tool_calls``), a tool
  message a tool result naming its call; any other type (function, chat, ...) is a bookkeeping
  ``STEP_END`` event that the view does not show.
- With ``history_size=N`` (as langchain-mongodb's history has it), ``messages`` is the latest N
  messages in view, read from the end of the log a page at a time (ListEvents newest first),
  so a long history costs what its last N messages cost, not its length.
- ``add_messages`` is one atomic append, so a batch is never half stored.
- ``clear`` hides every message so far (one ``EVENT_TYPE_HIDE``, the server's ``clear``) rather
  than deleting the session: the log keeps them for audit and fork, and a message another writer
  appends during the clear is not lost with them (DeleteSession would erase it too).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from sessionlog_client._aio import AsyncClient
from sessionlog_client._items import (
    get_exact,
    in_view,
    latest,
    position,
    put_exact,
    tail_page_size,
    text_of,
)
from sessionlog_client._sync import Client
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.langchain needs langchain-core: "
        "pip install 'sessionlog-client[langchain]'"
    ) from exc

__all__ = ["SessionlogChatMessageHistory", "event_of_message", "message_of_event"]

MESSAGE_KEY = "message"
"""LangChain's dict of the message is kept as JSON text in the data key ``message_json``."""

_TYPES = {
    "system": EventType.EVENT_TYPE_SYSTEM_MESSAGE,
    "human": EventType.EVENT_TYPE_USER_MESSAGE,
    "ai": EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
    "AIMessageChunk": EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
    "tool": EventType.EVENT_TYPE_TOOL_RESULT,
}
"""The LangChain message types the derived view shows, and as what."""


# -- messages <-> events (pure) -----------------------------------------------------------------


def event_of_message(message: BaseMessage) -> Event:
    """The event storing ``message``: LangChain's dict of it verbatim, plus what the derived
    view shows."""
    stored = message_to_dict(message)
    data: dict[str, Any] = {"message_type": message.type}
    put_exact(data, MESSAGE_KEY, stored)
    kind = _TYPES.get(message.type, EventType.EVENT_TYPE_STEP_END)
    text = text_of(message.content, {"text": "text"})
    if kind == EventType.EVENT_TYPE_TOOL_RESULT:
        data["tool_call_id"] = str(getattr(message, "tool_call_id", ""))
        data["content"] = text if text is not None else json.dumps(message.content)
    elif kind != EventType.EVENT_TYPE_STEP_END:
        calls = [
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
            }
            for call in getattr(message, "tool_calls", None) or []
        ]
        if calls:
            data["tool_calls"] = calls
        if text is not None or not calls:
            data["content"] = text or ""
    made = Event(type=kind)
    made.data.update(data)
    return made


def message_of_event(event: Event) -> BaseMessage | None:
    """The message an event stores, or None for an event that stores none (another writer's)."""
    found, stored = get_exact(event, MESSAGE_KEY)
    if not found or not isinstance(stored, dict):
        return None
    return messages_from_dict([stored])[0]


def _visible(events: Sequence[Event], start: int = 0) -> list[BaseMessage]:
    """The stored messages no later hide or replace covers, in order; from position ``start``
    on when ``events`` is a tail of the log."""
    shown = (message_of_event(e) for e in in_view(events) if position(e) >= start)
    return [m for m in shown if m is not None]


# -- the history --------------------------------------------------------------------------------


class SessionlogChatMessageHistory(BaseChatMessageHistory):
    """LangChain's chat message history, stored in the sessionlog session ``session_id``.

    ``client`` is a :class:`~sessionlog_client.Client` (the caller's to close), or the address of
    the server: then the history opens a client for the sync methods and one per event loop for
    the async ones (``aget_messages``, ``aadd_messages``, ``aclear``); :meth:`close` closes them.
    With a ``Client`` given, the async methods run the sync ones in an executor, as LangChain's
    defaults do. ``history_size``: how many of the latest messages ``messages`` returns (all
    when None).
    """

    def __init__(
        self,
        session_id: str,
        client: Client | str,
        *,
        history_size: int | None = None,
        **client_options: Any,
    ) -> None:
        if history_size is not None and history_size < 0:
            raise ValueError(f"history_size must be 0 or more, not {history_size}")
        self.session_id = session_id
        self.history_size = history_size
        self._given = client if isinstance(client, Client) else None
        self._address = client if isinstance(client, str) else ""
        self._options = client_options
        self._sync: Client | None = None
        self._opened: dict[asyncio.AbstractEventLoop, AsyncClient] = {}

    def _client(self) -> Client:
        if self._given is not None:
            return self._given
        if self._sync is None:
            self._sync = Client(self._address, **self._options)
        return self._sync

    def _aclient(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._opened if lp.is_closed()]:
            del self._opened[old]  # its loop is gone, and its channel with it
        if loop not in self._opened:
            self._opened[loop] = AsyncClient(self._address, **self._options)
        return self._opened[loop]

    def close(self) -> None:
        """Close the sync client this history opened (none if one was given)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close the async client this history opened for the running loop."""
        opened = self._opened.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened.close()

    # -- sync --

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The messages in view, oldest first (the latest ``history_size`` of them)."""
        client, size = self._client(), self.history_size
        if size is None:
            return _visible(list(client.since(self.session_id)))
        tail: list[Event] = []
        token = ""
        while True:
            page = client.list_events(
                self.session_id,
                page_size=tail_page_size(size),
                page_token=token,
                order_by="seq desc",
            )
            tail.extend(page.events)
            token = page.next_page_token
            found = latest(tail, bool(token), size, _visible)
            if found is not None:
                return found

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append one event per message, all in one atomic append."""
        if messages:
            self._client().append(self.session_id, [event_of_message(m) for m in messages])

    def clear(self) -> None:
        """Hide every message so far; the log keeps them."""
        self._client().clear(self.session_id, reason="langchain clear")

    # -- async --

    async def aget_messages(self) -> list[BaseMessage]:
        if self._given is not None:
            return await super().aget_messages()
        client, size = self._aclient(), self.history_size
        if size is None:
            return _visible([e async for e in client.since(self.session_id)])
        tail: list[Event] = []
        token = ""
        while True:
            page = await client.list_events(
                self.session_id,
                page_size=tail_page_size(size),
                page_token=token,
                order_by="seq desc",
            )
            tail.extend(page.events)
            token = page.next_page_token
            found = latest(tail, bool(token), size, _visible)
            if found is not None:
                return found

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self._given is not None:
            await super().aadd_messages(messages)
        elif messages:
            await self._aclient().append(self.session_id, [event_of_message(m) for m in messages])

    async def aclear(self) -> None:
        if self._given is not None:
            await super().aclear()
        else:
            await self._aclient().clear(self.session_id, reason="langchain clear")
