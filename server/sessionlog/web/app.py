"""The web console and the metrics endpoint: small aiohttp apps in the server's event loop.

    --http-listen HOST:PORT      GET /                 the console (static/index.html, app.js)
                                 GET /api/status       role, counts, map usage, replication
                                                       (a prefix-scoped token: role only)
                                 GET /api/sessions     ?prefix= &after= &limit= &filter=
                                                       &order=update_time (newest first)
                                 GET /api/sessions/ID  one session's metadata
                                 GET /api/sessions/ID/events      ?from= &limit= raw events
                                 GET /api/sessions/ID/transcript  derived messages, calls paired
                                 GET /api/sessions/ID/state       GetState's state, as JSON
                                 GET /api/sessions/ID/follow      ?from= live events (SSE)
                                 GET /healthz          200 while the server serves, else 503
                                 GET /primary          200 while it takes writes, else 503
    --metrics-listen HOST:PORT   GET /metrics          Prometheus text format

Read-only: nothing here writes. When the server has auth on, every /api call needs the same
bearer token a gRPC call would (``Authorization: Bearer <token>``), checked by the same
Authorizer as the gRPC method it mirrors (ListSessions, Since, DeriveMessages, ...), session
prefixes included. The static files, /metrics, /healthz and /primary carry no session data
and are open: /healthz and /primary are what a proxy health-checks (``sessionlog cluster
haproxy`` writes HAProxy's checks against them), with a small JSON body (role, epoch).

Live follows run Since's own loop (``service.follow``: register, read, then wait; paced; ended
by shutdown with the seq to resume from), count against the stream limits, and end when the
server stops.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from sessionlog import errors, fold
from sessionlog.service import ledger
from sessionlog.service.auth import Authorizer, Principal
from sessionlog.service.errors import refusal_level, status_code
from sessionlog.service.follow import follow
from sessionlog.service.metrics import (
    CONTENT_TYPE,
    Observed,
    exposition,
    registry,
    status,
    version,
)
from sessionlog.service.notifier import Notifier
from sessionlog.service.usecases import SessionLog, SessionQuery, listing_order
from sessionlog.shard.ownership import Ownership
from sessionlog.storage.records import BY_UPDATE
from sessionlog.storage.store import SessionView, Store
from sessionlog.v1.event_pb2 import Event, EventType
from sessionlog.v1.message_pb2 import Message, Role
from sessionlog.v1.session_log_service_pb2 import Session
from sessionlog_client.convert import struct_to_dict  # whole numbers as ints, like the CLI

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
SERVICE = "/sessionlog.v1.SessionLogService/"
FOLLOW_BATCH_BYTES = 256 << 10
MAX_EVENTS_PAGE = 2000
DEFAULT_EVENTS_PAGE = 500
MAX_TRANSCRIPT = 5000
MAX_SESSIONS_PAGE = 1000
SHUTDOWN_SECONDS = 2.0

_TYPE_NAMES = {value: name[len("EVENT_TYPE_") :].lower() for name, value in EventType.items()}
_ROLE_NAMES = {value: name[len("ROLE_") :].lower() for name, value in Role.items()}
_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "ALREADY_EXISTS": 409,
    "FAILED_PRECONDITION": 412,
    "ABORTED": 409,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Served(Observed, Protocol):
    """What the console reads from a running server (``SessionLogServer`` provides it)."""

    @property
    def notifier(self) -> Notifier: ...

    @property
    def authorizer(self) -> Authorizer | None: ...

    @property
    def heartbeat_seconds(self) -> float: ...

    @property
    def listen(self) -> str: ...

    @property
    def cases(self) -> SessionLog | None:
        """The use cases the gRPC servicer runs, over the open store (None: not open)."""
        ...

    @property
    def ownership(self) -> Ownership: ...

    @property
    def serving(self) -> bool:
        """What the gRPC health check says now: SERVING (True) or NOT_SERVING."""
        ...

    @property
    def takes_writes(self) -> bool:
        """Serving, and a write sent now would be taken: a primary (in cluster mode the leader
        with a live lease), not fenced, its writes not stalled."""
        ...

    @property
    def role(self) -> str:
        """primary, replica, or (cluster mode, between roles) member."""
        ...


class ListenError(RuntimeError):
    """An HTTP address could not be bound; the message names the flag and the address."""


# -- JSON views of stored things ---------------------------------------------------------------


def _ms(ns: int) -> int:
    return ns // 1_000_000


def event_json(event: Event, visible: set[int] | None = None) -> dict[str, Any]:
    """A stored event for the page: type name, time, data, replace range, its state delta
    (null when it has none), and (when the surface is known) whether a later replace hides it."""
    surface = event.type in fold.SURFACE_TYPES
    rng = fold.replace_range(event)
    out: dict[str, Any] = {
        "seq": event.seq,
        "type": _TYPE_NAMES.get(event.type, str(event.type)),
        "time": event.time.ToJsonString() if event.HasField("time") else None,
        "data": struct_to_dict(event.data),
        "surface": surface,
        "replace": list(rng) if rng is not None else None,
        "state_delta": struct_to_dict(event.state_delta) if event.HasField("state_delta") else None,
    }
    if visible is not None:
        out["shadowed"] = surface and event.seq not in visible
    return out


def usage_json(totals: fold.UsageByModel) -> list[dict[str, Any]]:
    """Usage totals per model, in model order, as the console shows them."""
    return [
        {
            "model": u.model,
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cached_input_tokens": u.cached_input_tokens,
            "reasoning_tokens": u.reasoning_tokens,
            "event_count": u.event_count,
        }
        for u in ledger.model_usages(totals)
    ]


def session_json(view: SessionView, usage: fold.UsageByModel | None = None) -> dict[str, Any]:
    meta = view.meta
    out: dict[str, Any] = {"session_id": view.session_id, "exists": meta is not None}
    if meta is not None:
        out.update(
            event_count=meta.next_seq,
            replace_generation=meta.replace_generation,
            create_time_ms=_ms(meta.create_time_ns),
            last_append_time_ms=_ms(meta.last_append_time_ns),
            parent_session_id=meta.parent_id,
            parent_event_count=meta.parent_length,
            usage=usage_json(usage or {}),
        )
    if view.lease is not None:
        out["lease"] = {
            "holder": view.lease.holder,
            "token": view.lease.token,
            "expire_time_ms": _ms(view.lease.expire_time_ns),
        }
    return out


def session_message_json(session: Session) -> dict[str, Any]:
    """``session_json`` of a listed Session message, with its record and update time."""
    out: dict[str, Any] = {"session_id": session.session_id, "exists": session.exists}
    if session.exists:
        out.update(
            event_count=session.event_count,
            replace_generation=session.replace_generation,
            create_time_ms=session.create_time.ToMilliseconds(),
            last_append_time_ms=session.last_append_time.ToMilliseconds(),
            parent_session_id=session.parent_session_id,
            parent_event_count=session.parent_event_count,
            usage=usage_json(ledger.from_messages(session.usage)),
            title=session.title,
            labels=dict(sorted(session.labels.items())),
            owner=session.owner,
            status=session.status,
            update_time_ms=session.update_time.ToMilliseconds(),
        )
        if session.HasField("parent_seq"):
            out["parent_seq"] = session.parent_seq
        if session.HasField("expire_time"):
            out["expire_time_ms"] = session.expire_time.ToMilliseconds()
        if session.pinned:
            out["pinned"] = True
    if session.HasField("lease"):
        out["lease"] = {
            "holder": session.lease.holder,
            "token": session.lease.token,
            "expire_time_ms": session.lease.expire_time.ToMilliseconds(),
        }
    return out


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """One tool call in OpenAI's shape ({id, function: {name, arguments}}) or a flat one."""
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments", call.get("arguments", call.get("input")))
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    name = function.get("name", call.get("name"))
    return {
        "id": call.get("id") if isinstance(call.get("id"), str) else None,
        "name": name if isinstance(name, str) else None,
        "arguments": arguments,
        "result": None,
    }


def transcript_json(surface: list[Event], projected: list[bytes]) -> list[dict[str, Any]]:
    """The derived messages with roles, each tool call paired with the tool result that answers
    it (``call.result`` is the result's index; the result's ``answers`` is [message, call])."""
    messages: list[dict[str, Any]] = []
    open_calls: dict[str, tuple[int, int]] = {}
    for event, raw in zip(surface, projected, strict=True):
        message = Message.FromString(raw)
        rng = fold.replace_range(event)
        entry: dict[str, Any] = {
            "seq": event.seq,
            "role": _ROLE_NAMES.get(message.role, "unknown"),
            "content": message.content if message.HasField("content") else None,
            "reasoning": (
                message.reasoning_content if message.HasField("reasoning_content") else None
            ),
            "name": message.name if message.HasField("name") else None,
            "tool_call_id": message.tool_call_id if message.HasField("tool_call_id") else None,
            "tool_calls": [_tool_call(struct_to_dict(c)) for c in message.tool_calls],
            "replace": list(rng) if rng is not None else None,
            "answers": None,
        }
        index = len(messages)
        for number, call in enumerate(entry["tool_calls"]):
            if call["id"]:
                open_calls[call["id"]] = (index, number)
        answered = open_calls.pop(entry["tool_call_id"] or "", None)
        if answered is not None:
            entry["answers"] = list(answered)
            messages[answered[0]]["tool_calls"][answered[1]]["result"] = index
        messages.append(entry)
    return messages


# -- the console -------------------------------------------------------------------------------


@dataclass
class Console:
    """The /api handlers over one server's store and notifier."""

    server: Served

    @property
    def store(self) -> Store:
        store = self.server.store
        if store is None:
            raise errors.Unavailable("the store is not open")
        return store

    @property
    def cases(self) -> SessionLog:
        cases = self.server.cases
        if cases is None:
            raise errors.Unavailable("the store is not open")
        return cases

    def principal(self, request: web.Request, method: str) -> Principal | None:
        """The caller's principal when auth is on (raises when the token may not call
        ``method``); None when auth is off."""
        authorizer = self.server.authorizer
        if authorizer is None:
            return None
        header = request.headers.get("Authorization", "")
        return authorizer.check(SERVICE + method, [("authorization", header)])

    def session_id(self, request: web.Request, method: str) -> str:
        """The session a page reads, once the checks of ``method``'s reads pass."""
        session_id = request.match_info["session_id"]
        self.cases.reading(self.principal(request, method), session_id)
        return session_id

    async def status(self, request: web.Request) -> web.Response:
        """The server at a glance. Counts, positions, map usage and replication span every
        session, so (like GetReplicationStatus) a token limited to a session prefix sees only
        the version, the role and its own prefix."""
        principal = self.principal(request, "ListSessions")
        if principal is not None and principal.session_prefix:
            role = "replica" if self.server.replica is not None else "primary"
            scoped = {"version": version(), "role": role}
            return _json({**scoped, "session_prefix": principal.session_prefix})
        return _json(status(self.server, self.server.listen))

    async def sessions(self, request: web.Request) -> web.Response:
        """A page of sessions as ListSessions lists them: ``filter`` is its filter, ``order``
        ``update_time`` its "update_time desc" (newest first; ``after`` then does not apply:
        ask for a larger ``limit``)."""
        principal = self.principal(request, "ListSessions")
        limit = _int(request, "limit", 100, 1, MAX_SESSIONS_PAGE)
        by_update = _listing_order(request.query.get("order", ""))
        query = SessionQuery(
            prefix=request.query.get("prefix", ""),
            filter_text=request.query.get("filter", ""),
            order_by=BY_UPDATE if by_update else "",
            page_size=limit,
            after="" if by_update else request.query.get("after", ""),
        )
        # A sharded server lists every group, as its ListSessions does (``shard.scatter``),
        # with the caller's token.
        token = [("authorization", request.headers.get("Authorization", ""))]
        page = await self.cases.list_sessions(principal, query, token)
        shown = [session_message_json(s) for s in page.sessions]
        return _json({"sessions": shown, "more": bool(page.next_page_token)})

    async def session(self, request: web.Request) -> web.Response:
        principal = self.principal(request, "GetSession")
        read = self.cases.session(principal, request.match_info["session_id"])
        return _json(session_json(read.view, read.usage))

    async def events(self, request: web.Request) -> web.Response:
        """A page of raw events (by default the newest ones), each marked shadowed or not."""
        session_id = self.session_id(request, "Since")
        store = self.store
        folded = store.surface(session_id)
        count = folded.count
        limit = _int(request, "limit", DEFAULT_EVENTS_PAGE, 1, MAX_EVENTS_PAGE)
        start = _int(request, "from", max(0, count - limit), 0, 1 << 62)
        raws = store.read_session(session_id, start, min(count, start + limit))
        events = store.decode_events(raws, start, session_id)
        visible = set(folded.seqs)
        return _json(
            {
                "session_id": session_id,
                "from": start,
                "next_seq": count,
                "replace_generation": folded.replace_generation,
                "events": [event_json(event, visible) for event in events],
            }
        )

    async def transcript(self, request: web.Request) -> web.Response:
        session_id = request.match_info["session_id"]
        principal = self.principal(request, "DeriveMessages")
        folded = self.cases.messages(principal, session_id).snapshot
        messages = transcript_json(folded.surface, folded.projected)
        first = max(0, len(messages) - MAX_TRANSCRIPT)
        return _json(
            {
                "session_id": session_id,
                "event_count": folded.count,
                "replace_generation": folded.replace_generation,
                "first_index": first,
                "messages": messages[first:],
            }
        )

    async def state(self, request: web.Request) -> web.Response:
        """The session's state after its whole log (GetState, memoized with the surface)."""
        session_id = request.match_info["session_id"]
        state, count = self.cases.state(self.principal(request, "GetState"), session_id)
        return _json(
            {"session_id": session_id, "event_count": count, "state": struct_to_dict(state)}
        )

    async def follow(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``events`` batches from ``from`` on, one ``caught_up``, then live
        batches as they commit, with a comment line as heartbeat while idle; a refusal, or
        shutdown (UNAVAILABLE with the seq to resume from), ends it with an ``error`` event.

        The loop is Since's own (``service.follow``): the same wakeups, pacing and resume
        point; only the framing differs."""
        session_id = self.session_id(request, "Since")
        cursor = _int(request, "from", 0, 0, 1 << 62)
        streams = self.server.streams
        peer = f"http:{request.remote}"
        streams.acquire(peer)
        response = web.StreamResponse(
            headers={**_SECURITY_HEADERS, "Content-Type": "text/event-stream"}
        )

        async def refuse(error: errors.SessionLogError) -> None:
            await _write(response, streams, _event("error", _error_body(error)))

        try:
            await response.prepare(request)
            stream = follow(
                refuse,
                self.server.notifier,
                key=session_id,
                subject=f"session '{session_id}'",
                cursor=cursor,
                live=True,
                heartbeat_seconds=self.server.heartbeat_seconds,
                read=lambda start: self._owned_read_from(session_id, start),
                marker=lambda caught_up: self._marker(session_id, caught_up),
                pace=streams.pace,
            )
            async for payload, _ in stream:
                await _write(response, streams, payload)
        except ConnectionResetError:
            pass  # the page went away
        finally:
            streams.release(peer)
        return response

    def _owned_read_from(self, session_id: str, start: int) -> tuple[bytes, int, bool]:
        """``_read_from`` while this server's group still owns the session (the map may move
        it: the stream then ends with WRONG_GROUP)."""
        self.server.ownership.check(session_id)
        return self._read_from(session_id, start)

    def _read_from(self, session_id: str, start: int) -> tuple[bytes, int, bool]:
        """One ``events`` batch from ``start``: its frame, its event count, whether more follow."""
        store = self.store
        next_seq = store.next_seq(session_id)
        if start >= next_seq:
            return b"", 0, False
        raws = store.read_session(session_id, start, next_seq, FOLLOW_BATCH_BYTES)
        batch = store.decode_events(raws, start, session_id)
        after = start + len(batch)
        payload = {"events": [event_json(e) for e in batch], "next_seq": after}
        return _event("events", payload), len(batch), after < next_seq

    def _marker(self, session_id: str, caught_up: bool) -> bytes:
        if caught_up:
            return _event("caught_up", {"next_seq": self.store.next_seq(session_id)})
        return b": heartbeat\n\n"


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    # int() would also take " 5", "5_000" and other scripts' digits: a query is ASCII digits
    plain = text.isascii() and text.isdigit() and len(text) <= 20
    value = int(text) if plain else low - 1
    if not low <= value <= high:
        raise errors.MalformedRequest(f"{name} must be a whole number from {low} to {high}")
    return value


CONSOLE_NEWEST = "update_time"
"""The console's own word for newest update first (its page's choice since before ``order``
followed ListSessions' grammar, where a field alone is ascending): read as "update_time desc"."""


def _listing_order(order: str) -> bool:
    """Whether /api/sessions' ``order`` asks for newest update first. ``order`` is read by
    ListSessions' parser (``usecases.listing_order``: the same grammar, the same
    INVALID_ORDER_BY), except that "update_time" alone keeps its console meaning, newest first."""
    if order.strip().lower() == CONSOLE_NEWEST:
        order = BY_UPDATE
    return listing_order(order) == BY_UPDATE


def _json(body: dict[str, Any]) -> web.Response:
    return web.json_response(body, dumps=lambda v: json.dumps(v, ensure_ascii=False))


async def _write(response: web.StreamResponse, streams: Any, chunk: bytes) -> None:
    streams.sent_bytes += len(chunk)
    await response.write(chunk)


def _event(kind: str, body: Any) -> bytes:
    """One server-sent event of this ``kind`` carrying ``body`` as JSON."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A SessionLogError becomes JSON {reason, message, metadata} with a matching HTTP status;
    any other failure a JSON 500 (INTERNAL), logged with its traceback."""
    try:
        response = await handler(request)
    except web.HTTPException:
        raise
    except errors.SessionLogError as error:
        code = _HTTP_STATUS.get(status_code(error).name, 500)
        if isinstance(error, errors.WrongGroup):
            code = 421  # Misdirected Request: another group's servers hold this session
        if isinstance(error, errors.DataCorrupted):
            log.log(refusal_level(error), "request refused", extra={"reason": error.reason})
        response = web.json_response(_error_body(error), status=code)
        if code == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
    except Exception:
        log.exception("unexpected failure in %s", request.path)
        internal = errors.SessionLogError("internal error; see the server log")
        response = web.json_response(_error_body(internal), status=500)
    for key, value in _SECURITY_HEADERS.items():
        if not response.prepared:
            response.headers.setdefault(key, value)
    return response


def _error_body(error: errors.SessionLogError) -> dict[str, Any]:
    return {"reason": error.reason, "message": error.message, "metadata": error.metadata}


def _checked(server: Served, ok: bool) -> web.Response:
    """A health check's answer: 200 or 503, with the role and epoch as JSON."""
    store = server.store
    body = {
        "role": server.role,
        "epoch": 0 if store is None else store.writer.lead.epoch,
        "serving": server.serving,
        "takes_writes": server.takes_writes,
    }
    return web.json_response(body, status=200 if ok else 503, headers=_SECURITY_HEADERS)


def console_app(server: Served) -> web.Application:
    console = Console(server)
    app = web.Application(middlewares=[_errors])

    async def healthz(request: web.Request) -> web.Response:
        return _checked(server, server.serving)

    async def primary(request: web.Request) -> web.Response:
        return _checked(server, server.takes_writes)

    async def index(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/primary", primary)
    app.router.add_get("/api/status", console.status)
    app.router.add_get("/api/sessions", console.sessions)
    app.router.add_get("/api/sessions/{session_id}", console.session)
    app.router.add_get("/api/sessions/{session_id}/events", console.events)
    app.router.add_get("/api/sessions/{session_id}/transcript", console.transcript)
    app.router.add_get("/api/sessions/{session_id}/follow", console.follow)
    app.router.add_get("/api/sessions/{session_id}/state", console.state)
    return app


def add_metrics(app: web.Application, server: Observed) -> None:
    """GET /metrics on ``app``: the server's metrics in Prometheus' text format."""
    metrics = registry(server)

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=exposition(metrics), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/metrics", scrape)


# -- binding -----------------------------------------------------------------------------------


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as (host, port); ValueError when it is not one."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port_text)


def _bind(address: str, flag: str, share_port: bool = False) -> socket.socket:
    try:
        host, port = split_address(address)
        if ":" in host:
            return socket.create_server(
                (host, port),
                family=socket.AF_INET6,
                dualstack_ipv6=host == "::",
                reuse_port=share_port,
            )
        return socket.create_server((host, port), reuse_port=share_port)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ListenError(
            f"cannot listen on {address} ({flag}): {reason}; pick another address"
        ) from None


@dataclass
class HttpSites:
    """The running HTTP listeners: the console, the metrics endpoint, or one serving both."""

    http_port: int = 0
    metrics_port: int = 0
    share_port: bool = False
    """Bind with SO_REUSEPORT, beside the other workers of one server (see ``grpc_server``)."""
    _runners: list[web.AppRunner] = field(default_factory=list)

    @classmethod
    async def start(
        cls, server: Served, http_listen: str, metrics_listen: str, share_port: bool = False
    ) -> HttpSites:
        """Bind and serve what is configured; on a bind failure nothing is left running."""
        sites = cls(share_port=share_port)
        try:
            if http_listen:
                app = console_app(server)
                if metrics_listen == http_listen:
                    add_metrics(app, server)
                sites.http_port = await sites._serve(app, http_listen, "--http-listen")
                if metrics_listen == http_listen:
                    sites.metrics_port = sites.http_port
            if metrics_listen and metrics_listen != http_listen:
                app = web.Application()
                add_metrics(app, server)
                sites.metrics_port = await sites._serve(app, metrics_listen, "--metrics-listen")
        except BaseException:
            await sites.close()
            raise
        return sites

    async def _serve(self, app: web.Application, address: str, flag: str) -> int:
        sock = _bind(address, flag, self.share_port)
        # handler_cancellation: a page that goes away ends its follow at once (its stream slot
        # freed), not at the next heartbeat.
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS, handler_cancellation=True
        )
        self._runners.append(runner)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        port: int = sock.getsockname()[1]
        return port

    async def close(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
