"""A sessionlog session service for Google ADK: ``Runner(..., session_service=...)``.

    from google.adk.runners import Runner
    from sessionlog_client.google_adk import SessionlogSessionService

    service = SessionlogSessionService("127.0.0.1:50051")
    session = await service.create_session(app_name="helper", user_id="ann")
    runner = Runner(app_name="helper", agent=agent, session_service=service)

Install with ``pip install 'sessionlog-client[google-adk]'``.

How ADK sessions live in sessionlog (the README's "Framework backends" has the tables):

- An ADK session is the sessionlog session ``{prefix}s.{app}.{user}.{session}``; its user state
  is ``{prefix}u.{app}.{user}`` and its app state ``{prefix}a.{app}``. Each part is escaped (see
  :func:`escape`) so no part holds a ``.``: listing an app's or a user's sessions is a
  ListSessions prefix, and the id reads back as its three parts. An id longer than sessionlog's
  235 bytes is refused with ``ValueError`` before anything is written.
- Each ADK event is one sessionlog event with ADK's JSON form of it (``model_dump(mode="json",
  exclude_none=True)``, as ADK's database service stores it) verbatim, as text, in ``event_json``,
  and the event's timestamp as its time. Beside it the event carries what the derived view
  projects: user text is a user message, model text an assistant message (thoughts as its
  reasoning, function calls as its ``tool_calls``), a function response a tool result; any other
  event (no text, no call) is a bookkeeping ``STEP_END``.
- State is the server's fold (``GetState``): a session-scoped delta rides on its event as the
  event's ``state_delta``; ``app:`` and ``user:`` keys (without their prefix) go to the app's and
  the user's state sessions as state-only events; ``temp:`` keys are never written. The service
  keeps two keys of its own in the session's state, ``sessionlog:update_time`` and
  ``sessionlog:deleted``, and never shows them.
- A session's ``_storage_update_marker`` is its log's length: an append names it as
  ``expected_seq``, so a session another writer moved on since it was read fails with ADK's
  ``StaleSessionError`` and writes nothing. The ADK event's id is the append's request id, so
  an equal event delivered again is stored once.

Delete is :func:`_erase`: the server's DeleteSession, a real erasure (see the README's Erasure
section); creating the same id again starts a new session.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sessionlog_client._aio import AsyncClient
from sessionlog_client._items import escape, get_exact, in_view, put_exact, unescape
from sessionlog_client.convert import struct_to_dict
from sessionlog_client.errors import (
    RequestIdReused,
    SeqConflict,
    SessionAlreadyExists,
    SessionNotFound,
)
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event as AdkEvent
    from google.adk.sessions import _session_util
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.google_adk needs Google ADK: pip install 'sessionlog-client[google-adk]'"
    ) from exc

__all__ = [
    "SessionlogSessionService",
    "adk_event_of",
    "escape",
    "event_of_adk",
    "unescape",
]

EVENT_KEY = "event"
"""The ADK event's JSON text is in the data key ``event_json``."""
UPDATE_TIME = "sessionlog:update_time"
"""The session's ``last_update_time`` (the last event's timestamp), kept in its state."""
DELETED = "sessionlog:deleted"
"""True in the state of a session :func:`_erase` removed."""
_OWN_KEYS = frozenset({UPDATE_TIME, DELETED})
MAX_ID_BYTES = 235
"""sessionlog's longest session id (SPEC §7)."""
_PAGE = 100
_LIST_PAGE = 1000
"""ListSessions' largest page: a listing is a few calls, each session's state in its reply."""


def _prefixed(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    """A scope's state as a session's state holds it: each key with the scope's prefix."""
    return {prefix + key: value for key, value in state.items()}


# -- ids (pure) ---------------------------------------------------------------------------------


def _fits(log_id: str, what: str) -> str:
    size = len(log_id.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        raise ValueError(
            f"{what} makes a sessionlog session id of {size} bytes, past the {MAX_ID_BYTES} a "
            "session id may have: use a shorter app name, user id or session id (characters "
            "other than letters, numbers and '-' take 3 bytes per UTF-8 byte once escaped)"
        )
    return log_id


# -- ADK events <-> sessionlog events (pure) ----------------------------------------------------


def event_of_adk(event: AdkEvent, state_delta: dict[str, Any] | None = None) -> Event:
    """The sessionlog event storing ``event``: its JSON verbatim, what the derived view shows,
    its timestamp as the time, and ``state_delta`` (the session-scoped part) as the delta."""
    data: dict[str, Any] = {"author": event.author, "adk_event_id": event.id}
    put_exact(data, EVENT_KEY, event.model_dump(mode="json", exclude_none=True))
    type_ = _project(event, data)
    made = Event(type=type_)
    made.data.update(data)
    made.time.FromNanoseconds(round(event.timestamp * 1_000_000) * 1000)
    if state_delta:
        made.state_delta.update(state_delta)
    return made


def _project(event: AdkEvent, data: dict[str, Any]) -> EventType:
    """Put the fields the derived view projects in ``data`` and say which type shows them."""
    parts = list(event.content.parts or []) if event.content is not None else []
    responses = [p.function_response for p in parts if p.function_response is not None]
    if responses:
        first = responses[0]
        if first.id is not None:
            data["tool_call_id"] = first.id
        if first.name is not None:
            data["name"] = first.name
        shown = [r.response for r in responses]
        data["content"] = json.dumps(shown[0] if len(shown) == 1 else shown, default=str)
        if len(responses) > 1:
            data["metadata"] = {"tool_call_ids": [r.id for r in responses]}
        return EventType.EVENT_TYPE_TOOL_RESULT
    texts = [p.text for p in parts if p.text is not None and not p.thought]
    thoughts = [p.text for p in parts if p.text is not None and p.thought]
    calls = [p.function_call for p in parts if p.function_call is not None]
    role = event.content.role if event.content is not None else None
    if role == "user" or (role is None and event.author == "user"):
        if not texts:
            return EventType.EVENT_TYPE_STEP_END
        data["content"] = "\n".join(texts)
        return EventType.EVENT_TYPE_USER_MESSAGE
    if not texts and not calls:
        return EventType.EVENT_TYPE_STEP_END
    if texts:
        data["content"] = "\n".join(texts)
    if thoughts:
        data["reasoning_content"] = "\n".join(thoughts)
    if calls:
        data["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.args or {})},
            }
            for call in calls
        ]
    return EventType.EVENT_TYPE_ASSISTANT_MESSAGE


def adk_event_of(event: Event) -> AdkEvent | None:
    """The ADK event a sessionlog event stores, or None for one that stores none."""
    found, stored = get_exact(event, EVENT_KEY)
    if not found or not isinstance(stored, dict):
        return None
    return AdkEvent.model_validate(stored)


def _state_only(delta: dict[str, Any], what: str) -> Event:
    """A bookkeeping event whose only effect is ``delta`` on its session's state."""
    made = Event(type=EventType.EVENT_TYPE_STEP_END)
    made.data["adk"] = what
    made.state_delta.update(delta)
    return made


def _session_state(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in _OWN_KEYS}


# -- the service --------------------------------------------------------------------------------


class SessionlogSessionService(BaseSessionService):
    """ADK's ``BaseSessionService``, stored in sessionlog (see the module docstring).

    ``client`` is an :class:`~sessionlog_client.AsyncClient`, or the address(es) of the server:
    then the service opens one client per event loop it is used from and :meth:`close` closes
    it. ``prefix`` starts every session id the service writes (a tenant token's prefix, say);
    ``client_options`` (``token=``, TLS, ...) go to the clients it opens.
    """

    def __init__(
        self,
        client: AsyncClient | str | Sequence[str],
        *,
        prefix: str = "adk.",
        **client_options: Any,
    ) -> None:
        self.prefix = prefix
        self._given = client if isinstance(client, AsyncClient) else None
        self._target = None if isinstance(client, AsyncClient) else client
        self._options = client_options
        self._opened: dict[asyncio.AbstractEventLoop, AsyncClient] = {}

    def _client(self) -> AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._opened if lp.is_closed()]:
            del self._opened[old]
        if loop not in self._opened:
            self._opened[loop] = AsyncClient(self._target, **self._options)
        return self._opened[loop]

    async def close(self) -> None:
        """Close the client this service opened for the running loop (none if one was given)."""
        opened = self._opened.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened.close()

    # -- ids --

    def session_log_id(self, app_name: str, user_id: str, session_id: str) -> str:
        """The sessionlog session holding an ADK session's events and session state."""
        parts = ".".join(escape(p) for p in (app_name, user_id, session_id))
        return _fits(f"{self.prefix}s.{parts}", f"session {session_id!r}")

    def user_log_id(self, app_name: str, user_id: str) -> str:
        """The sessionlog session holding the user state of ``user_id`` in ``app_name``."""
        return _fits(f"{self.prefix}u.{escape(app_name)}.{escape(user_id)}", "the user id")

    def app_log_id(self, app_name: str) -> str:
        """The sessionlog session holding the app state of ``app_name``."""
        return _fits(f"{self.prefix}a.{escape(app_name)}", "the app name")

    # -- state --

    async def _scoped_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """The app and user state with their prefixes, as ADK merges them into a session's."""
        client = self._client()
        app, user = await asyncio.gather(
            client.get_state(self.app_log_id(app_name)),
            client.get_state(self.user_log_id(app_name, user_id)),
        )
        return {**_prefixed(State.APP_PREFIX, app), **_prefixed(State.USER_PREFIX, user)}

    async def _write_scoped(
        self, app_name: str, user_id: str, deltas: dict[str, dict[str, Any]]
    ) -> None:
        client = self._client()
        writes = []
        if deltas["app"]:
            writes.append(
                client.append(self.app_log_id(app_name), [_state_only(deltas["app"], "app_state")])
            )
        if deltas["user"]:
            user_log = self.user_log_id(app_name, user_id)
            writes.append(client.append(user_log, [_state_only(deltas["user"], "user_state")]))
        await asyncio.gather(*writes)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user-scoped state of ``user_id`` in ``app_name``, keys without ``user:``."""
        return await self._client().get_state(self.user_log_id(app_name, user_id))

    # -- sessions --

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session (``AlreadyExistsError`` for an id in use), its app and user keys
        written to their scopes; the id is a UUID when not given."""
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        log_id = self.session_log_id(app_name, user_id, session_id)
        self.user_log_id(app_name, user_id)  # refuse an id too long before writing anything
        self.app_log_id(app_name)
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        now = time.time()
        first = _state_only({**deltas["session"], UPDATE_TIME: now}, "create_session")
        client = self._client()
        try:
            reply = await client.create_session(log_id, [first])
            count = int(reply.session.event_count)
        except SessionAlreadyExists:
            count = await self._start_over(log_id, session_id, deltas["session"], now)
        await self._write_scoped(app_name, user_id, deltas)
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state={**deltas["session"], **await self._scoped_state(app_name, user_id)},
            last_update_time=now,
        )
        session._storage_update_marker = str(count)
        return session

    async def _start_over(
        self, log_id: str, session_id: str, state: dict[str, Any], now: float
    ) -> int:
        """Create again a session :func:`_erase` removed: clear its old state keys, set the new
        ones; the length of its log after. ``AlreadyExistsError`` when it was not removed."""
        client = self._client()
        while True:
            old, count = await client.get_state_with_count(log_id)
            if count and not old.get(DELETED):
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            delta: dict[str, Any] = dict.fromkeys(old)
            delta.update(state)
            delta[UPDATE_TIME] = now
            try:
                reply = await client.append(
                    log_id, [_state_only(delta, "create_session")], expected_seq=count
                )
            except SeqConflict:
                continue
            return int(reply.next_seq)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events in view (the latest ``num_recent_events``, those from
        ``after_timestamp`` on, as ADK filters them), or None when there is none."""
        session_id = session_id.strip() if session_id else session_id
        log_id = self.session_log_id(app_name, user_id, session_id)
        client = self._client()
        (state, count), scoped = await asyncio.gather(  # one round trip for the three states
            client.get_state_with_count(log_id), self._scoped_state(app_name, user_id)
        )
        if count == 0 or state.get(DELETED):
            return None
        recent = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        if recent is None and after is None:
            held = [e for e in in_view([e async for e in client.since(log_id)]) if e.seq < count]
            events = [a for a in map(adk_event_of, held) if a is not None]
        else:
            events = await self._tail(log_id, count, recent, after)
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state={**_session_state(state), **scoped},
            events=events,
            last_update_time=float(state.get(UPDATE_TIME, 0.0)),
        )
        session._storage_update_marker = str(count)
        return session

    async def _tail(
        self, log_id: str, count: int, recent: int | None, after: float | None
    ) -> list[AdkEvent]:
        """The events in view at the end of the log, read newest first and only as far back as
        ``recent`` (the latest N) and ``after`` (stop at the first older event) need.

        Only this service's events are read as ADK events; a hide seen on the way takes out
        what it covers below it (every hide is newer than what the walk reads after it).
        """
        if recent == 0:
            return []
        client = self._client()
        newest: list[AdkEvent] = []
        hidden: list[tuple[int, int]] = []
        token = ""
        size = min(recent, 1000) if recent is not None else _PAGE
        while True:
            page = await client.list_events(
                log_id, page_size=size, page_token=token, order_by="seq desc"
            )
            for stored in page.events:
                if stored.seq >= count:
                    continue
                if stored.surface_op.WhichOneof("kind") == "replace":
                    rng = stored.surface_op.replace
                    hidden.append((int(rng.start_seq), int(rng.stop_seq)))
                    if rng.start_seq == 0 and rng.stop_seq >= stored.seq - 1:
                        return newest[::-1]  # everything below is hidden
                    continue
                if any(a <= stored.seq <= b for a, b in hidden):
                    continue
                found = adk_event_of(stored)
                if found is None:
                    continue
                if after is not None and found.timestamp < after:
                    return newest[::-1]
                newest.append(found)
                if recent is not None and len(newest) >= recent:
                    return newest[::-1]
            token = page.next_page_token
            if not token:
                return newest[::-1]

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions of ``app_name`` (of ``user_id`` only, when given), without events,
        with their merged state, oldest update first: ListSessions pages that carry each
        session's state (SESSION_VIEW_FULL), so no GetState per session. The app and user
        state are read beside the listing, not after it: for one user, its two GetState calls
        at once with the pages; for every user, the app's state once and each user's from
        listed pages of the user state logs."""
        listed, (app_state, user_states) = await asyncio.gather(
            self._listed(app_name, user_id), self._scopes(app_name, user_id)
        )
        found: list[Session] = []
        for owner, sid, state in listed:
            if not state or state.get(DELETED):
                continue
            found.append(
                Session(
                    id=sid,
                    app_name=app_name,
                    user_id=owner,
                    state={**_session_state(state), **app_state, **user_states.get(owner, {})},
                    last_update_time=float(state.get(UPDATE_TIME, 0.0)),
                )
            )
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    async def _listed(
        self, app_name: str, user_id: str | None
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """(user id, session id, its sessionlog state) of every listed session of the app (of
        ``user_id``'s alone, when given)."""
        of_app = f"{self.prefix}s.{escape(app_name)}."
        under = of_app if user_id is None else f"{of_app}{escape(user_id)}."
        listed: list[tuple[str, str, dict[str, Any]]] = []
        pages = self._client().list_sessions(prefix=under, page_size=_LIST_PAGE, with_state=True)
        async for page in pages:
            for held in page.sessions:
                owner, dot, sid = held.session_id.removeprefix(of_app).partition(".")
                if dot and "." not in sid:  # skip what this service did not name
                    listed.append((unescape(owner), unescape(sid), struct_to_dict(held.state)))
        return listed

    async def _scopes(
        self, app_name: str, user_id: str | None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The app state and each user's (``user_id``'s alone, when given), with their
        prefixes, as ADK merges them into a session's state; a user with no state log is not
        in the map (its state is empty)."""
        client = self._client()
        if user_id is not None:
            app, user = await asyncio.gather(
                client.get_state(self.app_log_id(app_name)),
                client.get_state(self.user_log_id(app_name, user_id)),
            )
            return _prefixed(State.APP_PREFIX, app), {user_id: _prefixed(State.USER_PREFIX, user)}
        of_users = f"{self.prefix}u.{escape(app_name)}."

        async def each_user() -> dict[str, dict[str, Any]]:
            users: dict[str, dict[str, Any]] = {}
            pages = client.list_sessions(prefix=of_users, page_size=_LIST_PAGE, with_state=True)
            async for page in pages:
                for held in page.sessions:
                    owner = held.session_id.removeprefix(of_users)
                    if "." not in owner:  # skip what this service did not name
                        state = struct_to_dict(held.state)
                        users[unescape(owner)] = _prefixed(State.USER_PREFIX, state)
            return users

        app, users = await asyncio.gather(client.get_state(self.app_log_id(app_name)), each_user())
        return _prefixed(State.APP_PREFIX, app), users

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Erase the session (a no-op for one that is not there; see :func:`_erase`)."""
        session_id = session_id.strip() if session_id else session_id
        await _erase(self._client(), self.session_log_id(app_name, user_id, session_id))

    async def append_event(self, session: Session, event: AdkEvent) -> AdkEvent:
        """Store ``event`` and apply its state delta: session keys on the event itself, app and
        user keys in their scopes, temp keys only on the ``session`` object given.

        ``StaleSessionError`` when the session's log moved on since ``session`` was read,
        ``SessionNotFoundError`` when it is not there (or was deleted); either writes nothing.
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        deltas = _session_util.extract_json_safe_state_delta(event.actions.state_delta or {})
        log_id = self.session_log_id(session.app_name, session.user_id, session.id)
        client = self._client()
        marker = session._storage_update_marker
        if marker is None:
            state, count = await client.get_state_with_count(log_id)
            if count == 0 or state.get(DELETED):
                raise SessionNotFoundError(f"Session {session.id} not found.")
        else:
            count = int(marker)
        stored = event_of_adk(event, {**deltas["session"], UPDATE_TIME: event.timestamp})
        try:
            reply = await _append_once(client, log_id, stored, event.id, count)
        except SeqConflict as exc:
            state, now = await client.get_state_with_count(log_id)
            if now == 0 or state.get(DELETED):
                raise SessionNotFoundError(f"Session {session.id} not found.") from exc
            raise StaleSessionError(
                "The session has been modified in storage since it was loaded. "
                "Please reload the session before appending more events."
            ) from exc
        if reply.events and reply.events[0].seq < count:
            return event  # delivered again: stored the first time, its deltas applied then
        await self._write_scoped(session.app_name, session.user_id, deltas)
        session.last_update_time = event.timestamp
        session._storage_update_marker = str(reply.next_seq)
        return self._commit_event_to_session(session, event)


async def _append_once(
    client: AsyncClient, log_id: str, stored: Event, event_id: str, count: int
) -> pb.AppendResponse:
    """Append ``stored`` with the ADK event's id as the request id, so an equal event delivered
    again is not stored twice (the reply is the first one's, an earlier seq). Another event
    that merely shares the id is kept, as ADK keeps it: appended without a request id."""
    try:
        return await client.append(
            log_id, [stored], expected_seq=count, request_id=f"adk-event.{event_id}"
        )
    except RequestIdReused:
        return await client.append(log_id, [stored], expected_seq=count)


async def _erase(client: AsyncClient, log_id: str) -> None:
    """Erase a session for good (the server's DeleteSession: events, state, records, on every
    replica; an audit record without content stays). A session that is not there is a no-op,
    as ADK's services treat it. A log an older version of this service marked deleted (a hide
    and the ``sessionlog:deleted`` key) is erased the same way."""
    try:
        await client.delete_session(log_id)
    except SessionNotFound:
        return
