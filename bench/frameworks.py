"""Case 12, the framework backends per call, beside the stores users pick instead (issue 32).

Each call is timed one at a time from this process (one client), after a few untimed calls,
``frameworks_calls`` times (the whole-history and listing reads ``frameworks_whole_calls``
times); the table shows p50 and p99 and the ratio sessionlog / peer of the p50s. Every store runs
on this machine in the same run with durable settings:

- sessionlog: the main server of the run (``--workers 1``, synced commits), through the
  client's backends (``sessionlog_client.openai_agents``, ``.google_adk``, ``.langgraph``);
- SQLite, in-process, file-backed: the OpenAI Agents SDK's ``SQLiteSession`` (WAL, SQLite's
  default ``synchronous=FULL``), ADK's ``DatabaseSessionService`` on ``sqlite+aiosqlite`` and
  ``langgraph-checkpoint-sqlite``'s ``SqliteSaver``;
- Redis (Debian's ``redis-server``, ``appendonly yes``, ``appendfsync always``), started for
  this case: the SDK's ``RedisSession`` when it imports, else ``ListSession`` below;
- Postgres (Debian's ``postgresql``): a cluster ``initdb``-ed in a temp dir for this case,
  ``synchronous_commit=on`` and ``fsync=on``, over TCP on 127.0.0.1, through psycopg 3:
  ``PgSession`` below (a minimal table-based SDK session), ADK's ``DatabaseSessionService`` on
  ``postgresql+psycopg`` and ``langgraph-checkpoint-postgres``'s ``PostgresSaver``.

The Claude Agent SDK store's peers (append, load) are tables (SQLite, Postgres) and a list per
transcript (Redis) written here, storing entries only (sessionlog's append also keeps the SDK's
summary in the session's title). The concurrent writers run ``WRITERS`` tasks at once adding one
item per call through the OpenAI sessions above, all on one session and each on its own (Postgres
with a connection per writer).

A peer that cannot run here (a package or a binary missing) is a row marked skipped with why,
and its targets show as not measured, never as met. The targets (issue 32): at or ahead of every
networked peer on every call; within 2x of in-process SQLite on the cheap calls; ahead of all on
listing, last-N reads of long sessions, concurrent writers and whole-history reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import peer
from bench.common import CONTENT, Settings, percentile
from bench.procs import ServerProcess, free_port

WARMUP_CALLS = 5
WHOLE_WARMUP_CALLS = 1
"""Untimed calls before the whole-history reads and the listings (each one long)."""
FILL_BATCH = 500
FILL_CONCURRENCY = 16
START_SECONDS = 30.0
STOP_SECONDS = 20.0
IN_PROCESS = "in-process"
NETWORKED = "networked"
SESSIONLOG = "sessionlog"
WRITERS = 8
"""How many writers the concurrent-writer rows run at once."""
ONE_SESSION = "add_items, 1 session"
MANY_SESSIONS = f"add_items, {WRITERS} sessions"
AHEAD_CALLS = frozenset(
    {"get_items(limit=20)", "get_items() whole", "list_sessions", ONE_SESSION, MANY_SESSIONS}
)
"""Calls where the target is ahead of every peer, in-process SQLite too (listing, last-N reads
of long sessions, whole-history reads, concurrent writers); on the other (cheap) calls it is
within 2x of it."""
ITEM = {"role": "user", "content": CONTENT}


@dataclass
class CallRow:
    """One call on one store: its per-call times, or why it was skipped."""

    framework: str
    call: str
    store: str
    kind: str
    """SESSIONLOG, IN_PROCESS or NETWORKED."""
    latencies_ms: list[float] = field(default_factory=list)
    skipped: str = ""

    @property
    def p50_ms(self) -> float | None:
        return percentile(sorted(self.latencies_ms), 0.50)

    @property
    def p99_ms(self) -> float | None:
        return percentile(sorted(self.latencies_ms), 0.99)

    def to_json(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "call": self.call,
            "store": self.store,
            "kind": self.kind,
            "calls": len(self.latencies_ms),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class Goal:
    """One of issue 32's targets for one call against one peer."""

    what: str
    goal: str
    measured: str
    met: bool | None
    """None: not measured (the peer or sessionlog's row was skipped)."""


# -- what can run here ---------------------------------------------------------------------------


def _missing_modules(*modules: str) -> str:
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            absent.append(name)
    return "" if not absent else f"Python module(s) {', '.join(absent)} not installed"


def postgres_bin() -> Path | None:
    """The folder of Debian's postgres binaries (initdb, postgres), or None."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(os.path.realpath(initdb)).parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def postgres_unavailable() -> str:
    """Why the Postgres peer cannot run here, or "" when it can."""
    if postgres_bin() is None:
        return "Debian's postgresql is not installed (apt-get install postgresql)"
    if os.geteuid() == 0 and _postgres_user() is None:
        return "running as root and there is no 'postgres' user to run the cluster as"
    return _missing_modules("psycopg")


def _postgres_user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return None


def redis_unavailable() -> str:
    return peer.unavailable()


# -- Postgres ------------------------------------------------------------------------------------


class PostgresProcess:
    """A Postgres cluster initdb-ed in a temp dir of its own (one the postgres user may enter
    when this runs as root), one server on 127.0.0.1, stopped by its PID (fast shutdown)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sessionlog-bench-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log_path = self.root / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.user = _postgres_user() if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=bench dbname=postgres"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL (psycopg 3, async capable)."""
        return f"postgresql+psycopg://bench@127.0.0.1:{self.port}/postgres"

    def _run_as(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def start(self) -> PostgresProcess:
        import psycopg

        bin_dir = postgres_bin()
        assert bin_dir is not None
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        with self.log_path.open("ab") as log:
            subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(self.data), "-U", "bench", "--auth=trust",
                 "-E", "UTF8", "--no-sync"],
                stdout=log, stderr=log, check=True, timeout=120, **self._run_as(),
            )  # fmt: skip
        argv = [
            str(bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
            "-c", "synchronous_commit=on", "-c", "fsync=on", "-c", "full_page_writes=on",
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            argv, stdout=log, stderr=log, start_new_session=True, **self._run_as()
        )
        log.close()
        deadline = time.monotonic() + START_SECONDS
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"postgres exited with {self.process.returncode}")
                try:
                    psycopg.connect(self.dsn, connect_timeout=2).close()
                    return self
                except psycopg.OperationalError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"postgres not answering within {START_SECONDS:.0f} s"
                        ) from None
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGINT)  # fast shutdown: clients are cut
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(STOP_SECONDS)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresProcess]:
    server = PostgresProcess()
    try:
        yield server.start()
    finally:
        server.stop()


# -- minimal sessions for the peers the SDK has none for -----------------------------------------


class PgSession:
    """The OpenAI Agents SDK ``Session`` protocol on one Postgres table: one row per item, items
    as JSON text (parsed on read, as the SDK's SQLiteSession does), autocommit (each write its
    own synced commit)."""

    def __init__(self, session_id: str, connection: Any) -> None:
        self.session_id = session_id
        self.connection = connection

    @staticmethod
    async def create_table(connection: Any) -> None:
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS agent_items (id bigserial PRIMARY KEY, "
            "session_id text NOT NULL, message_data text NOT NULL)"
        )
        await connection.execute(
            "CREATE INDEX IF NOT EXISTS agent_items_session ON agent_items (session_id, id)"
        )

    async def add_items(self, items: list[Any]) -> None:
        rows = [(self.session_id, json.dumps(item)) for item in items]
        async with self.connection.transaction(), self.connection.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO agent_items (session_id, message_data) VALUES (%s, %s)", rows
            )

    async def get_items(self, limit: int | None = None) -> list[Any]:
        if limit is None:
            cursor = await self.connection.execute(
                "SELECT message_data FROM agent_items WHERE session_id = %s ORDER BY id",
                (self.session_id,),
            )
            return [json.loads(row[0]) for row in await cursor.fetchall()]
        cursor = await self.connection.execute(
            "SELECT message_data FROM agent_items WHERE session_id = %s ORDER BY id DESC LIMIT %s",
            (self.session_id, limit),
        )
        return [json.loads(row[0]) for row in reversed(await cursor.fetchall())]

    async def pop_item(self) -> Any | None:
        cursor = await self.connection.execute(
            "DELETE FROM agent_items WHERE id = (SELECT id FROM agent_items WHERE session_id = %s "
            "ORDER BY id DESC LIMIT 1) RETURNING message_data",
            (self.session_id,),
        )
        row = await cursor.fetchone()
        return None if row is None else json.loads(row[0])


class ListSession:
    """The OpenAI Agents SDK ``Session`` protocol on one Redis list (RPUSH, LRANGE, RPOP): the
    Redis peer when the SDK's own ``RedisSession`` does not import."""

    def __init__(self, session_id: str, client: Any) -> None:
        self.key = f"agents:{session_id}"
        self.client = client

    async def add_items(self, items: list[Any]) -> None:
        await self.client.rpush(self.key, *(json.dumps(item) for item in items))

    async def get_items(self, limit: int | None = None) -> list[Any]:
        start = 0 if limit is None else -limit
        return [json.loads(raw) for raw in await self.client.lrange(self.key, start, -1)]

    async def pop_item(self) -> Any | None:
        raw = await self.client.rpop(self.key)
        return None if raw is None else json.loads(raw)


# -- timing --------------------------------------------------------------------------------------


async def _timed_async(
    calls: int, call: Callable[[int], Awaitable[object]], warmup: int = WARMUP_CALLS
) -> list[float]:
    for i in range(warmup):
        await call(-1 - i)
    times = []
    for i in range(calls):
        started = time.perf_counter()
        await call(i)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _timed(calls: int, call: Callable[[int], object]) -> list[float]:
    for i in range(WARMUP_CALLS):
        call(-1 - i)
    times = []
    for i in range(calls):
        started = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _expect(what: str, got: int, wanted: int) -> None:
    if got != wanted:
        raise RuntimeError(f"{what}: got {got}, expected {wanted}")


# -- OpenAI Agents SDK ---------------------------------------------------------------------------

OPENAI = "OpenAI Agents SDK"
OPENAI_CALLS = ("add_items", "get_items(limit=20)", "get_items() whole", "pop_item")


async def openai_calls(
    settings: Settings, make: Callable[[str], Any], prefix: str
) -> dict[str, list[float]]:
    """The four calls on sessions ``make`` opens: add_items of one item and pop_item on one
    session, get_items(limit=20) and the whole history of a session of ``frameworks_items``."""
    calls, items = settings.frameworks_calls, settings.frameworks_items
    short, long = make(f"{prefix}-short"), make(f"{prefix}-long")
    for start in range(0, items, FILL_BATCH):
        await long.add_items([ITEM] * min(FILL_BATCH, items - start))
    out = {"add_items": await _timed_async(calls, lambda _: short.add_items([ITEM]))}

    async def last_20(_: int) -> None:
        _expect("get_items(limit=20)", len(await long.get_items(limit=20)), 20)

    async def whole(_: int) -> None:
        _expect("get_items()", len(await long.get_items()), items)

    async def pop(_: int) -> None:
        if await short.pop_item() is None:
            raise RuntimeError("pop_item found the session empty")

    out["get_items(limit=20)"] = await _timed_async(calls, last_20)
    out["get_items() whole"] = await _timed_async(
        settings.frameworks_whole_calls, whole, WHOLE_WARMUP_CALLS
    )
    out["pop_item"] = await _timed_async(calls, pop)
    return out


async def openai_sessionlog(settings: Settings, address: str) -> dict[str, list[float]]:
    from sessionlog_client import AsyncClient
    from sessionlog_client.openai_agents import SessionlogSession

    async with AsyncClient(address) as client:
        prefix = f"fw-openai-{time.time_ns()}"
        return await openai_calls(settings, lambda sid: SessionlogSession(sid, client), prefix)


async def openai_sqlite(settings: Settings, path: Path) -> dict[str, list[float]]:
    from agents import SQLiteSession

    opened: list[Any] = []

    def make(session_id: str) -> Any:
        opened.append(SQLiteSession(session_id, db_path=path))
        return opened[-1]

    try:
        return await openai_calls(settings, make, "fw-openai")
    finally:
        for session in opened:
            session.close()


async def openai_redis(settings: Settings, port: int) -> tuple[dict[str, list[float]], str]:
    """The Redis rows, and which session class ran them."""
    import redis.asyncio

    url = f"redis://127.0.0.1:{port}/0"
    try:
        from agents.extensions.memory.redis_session import RedisSession
    except ImportError:
        client = redis.asyncio.Redis.from_url(url)
        try:
            made = await openai_calls(settings, lambda sid: ListSession(sid, client), "fw-openai")
            return made, "a list per session (the bench's)"
        finally:
            await client.aclose()
    client = redis.asyncio.Redis.from_url(url)
    try:
        made = await openai_calls(
            settings, lambda sid: RedisSession(sid, redis_client=client), "fw-openai"
        )
        return made, "the SDK's RedisSession"
    finally:
        await client.aclose()


async def openai_postgres(settings: Settings, dsn: str) -> dict[str, list[float]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await PgSession.create_table(connection)
        return await openai_calls(
            settings, lambda sid: PgSession(sid, connection), f"fw-openai-{time.time_ns()}"
        )


# -- Google ADK ----------------------------------------------------------------------------------

ADK = "Google ADK"
ADK_CALLS = ("list_sessions", "append_event")


async def adk_calls(
    settings: Settings, service: Any, fill_concurrency: int = FILL_CONCURRENCY
) -> dict[str, list[float]]:
    """list_sessions over ``frameworks_sessions`` sessions of one user (each with a small
    state, created ``fill_concurrency`` at a time: 1 for SQLite, whose concurrent writers get
    "database is locked"), and append_event of a one-part user message to one session."""
    from google.adk.events import Event
    from google.genai import types

    app, user, count = "bench", f"u{time.time_ns()}", settings.frameworks_sessions
    gate = asyncio.Semaphore(fill_concurrency)

    async def create(n: int) -> None:
        async with gate:
            await service.create_session(
                app_name=app, user_id=user, session_id=f"s{n}", state={"n": n}
            )

    await asyncio.gather(*(create(n) for n in range(count)))

    async def listing(_: int) -> None:
        found = await service.list_sessions(app_name=app, user_id=user)
        _expect("list_sessions", len(found.sessions), count)

    out = {
        "list_sessions": await _timed_async(
            settings.frameworks_whole_calls, listing, WHOLE_WARMUP_CALLS
        )
    }
    session = await service.create_session(app_name=app, user_id=f"{user}-w", session_id="w")

    async def append(i: int) -> None:
        content = types.Content(role="user", parts=[types.Part(text=f"{CONTENT} {i}")])
        await service.append_event(
            session, Event(author="user", invocation_id=f"i{i}", content=content)
        )

    out["append_event"] = await _timed_async(settings.frameworks_calls, append)
    return out


async def adk_sessionlog(settings: Settings, address: str) -> dict[str, list[float]]:
    from sessionlog_client import AsyncClient
    from sessionlog_client.google_adk import SessionlogSessionService

    async with AsyncClient(address) as client:
        service = SessionlogSessionService(client, prefix=f"fw-adk-{time.time_ns()}.")
        return await adk_calls(settings, service)


async def adk_database(settings: Settings, url: str) -> dict[str, list[float]]:
    from google.adk.sessions import DatabaseSessionService

    service = DatabaseSessionService(db_url=url)
    try:
        return await adk_calls(settings, service, 1 if url.startswith("sqlite") else 16)
    finally:
        await service.db_engine.dispose()


# -- LangGraph -----------------------------------------------------------------------------------

LANGGRAPH = "LangGraph"
LANGGRAPH_CALLS = ("put", "get_tuple")


def langgraph_calls(settings: Settings, saver: Any) -> dict[str, list[float]]:
    """put of a checkpoint with one message channel after the previous one of its thread, then
    get_tuple of that thread's latest checkpoint."""
    from langgraph.checkpoint.base import empty_checkpoint

    thread = f"fw-lg-{time.time_ns()}"
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    step = 0

    def put(_: int) -> None:
        nonlocal config, step
        step += 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": [ITEM]}
        checkpoint["channel_versions"] = {"messages": step}
        metadata = {"source": "loop", "step": step, "parents": {}}
        config = saver.put(config, checkpoint, metadata, {"messages": step})

    latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    def get(_: int) -> None:
        found = saver.get_tuple(latest)
        if found is None or found.checkpoint["id"] != config["configurable"]["checkpoint_id"]:
            raise RuntimeError("get_tuple did not return the thread's latest checkpoint")

    return {
        "put": _timed(settings.frameworks_calls, put),
        "get_tuple": _timed(settings.frameworks_calls, get),
    }


def langgraph_sessionlog(settings: Settings, address: str) -> dict[str, list[float]]:
    from sessionlog_client.langgraph import SessionlogSaver

    with SessionlogSaver(address, prefix=f"fw-lg-{time.time_ns()}.") as saver:
        return langgraph_calls(settings, saver)


def langgraph_sqlite(settings: Settings, path: Path) -> dict[str, list[float]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(path, check_same_thread=False)
    try:
        return langgraph_calls(settings, SqliteSaver(connection))
    finally:
        connection.close()


def langgraph_postgres(settings: Settings, dsn: str) -> dict[str, list[float]]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        return langgraph_calls(settings, saver)


# -- Claude Agent SDK ----------------------------------------------------------------------------

CLAUDE = "Claude Agent SDK"
CLAUDE_CALLS = ("append", "load")


def _entry(i: int) -> dict[str, Any]:
    """A transcript entry as the SDK appends one (a user turn with its uuid)."""
    return {
        "type": "user",
        "uuid": f"u-{time.time_ns()}-{i}",
        "timestamp": "2026-12-07T12:00:00.000Z",
        "message": {"role": "user", "content": CONTENT},
    }


async def claude_calls(settings: Settings, store: Any, prefix: str) -> dict[str, list[float]]:
    """append of one entry to a session, and load of a session of ``frameworks_items``
    entries (the whole transcript: the SDK's resume)."""
    short = {"project_key": prefix, "session_id": "short"}
    long = {"project_key": prefix, "session_id": "long"}
    items = settings.frameworks_items
    for start in range(0, items, FILL_BATCH):
        await store.append(long, [_entry(start + i) for i in range(min(FILL_BATCH, items - start))])
    out = {
        "append": await _timed_async(
            settings.frameworks_calls, lambda i: store.append(short, [_entry(i)])
        )
    }

    async def load(_: int) -> None:
        _expect("load", len(await store.load(long) or []), items)

    out["load"] = await _timed_async(settings.frameworks_whole_calls, load, WHOLE_WARMUP_CALLS)
    return out


async def claude_sessionlog(settings: Settings, address: str) -> dict[str, list[float]]:
    from sessionlog_client import AsyncClient
    from sessionlog_client.claude_agent_sdk import SessionlogSessionStore

    async with AsyncClient(address) as client:
        store = SessionlogSessionStore(client, prefix=f"fw-claude-{time.time_ns()}.")
        return await claude_calls(settings, store, "bench")


class SqliteStore:
    """The SDK's ``SessionStore`` append and load on one SQLite table (file, WAL, the default
    synchronous=FULL): a row per entry, the entry as JSON text."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, key TEXT NOT NULL, "
            "entry TEXT NOT NULL)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS entries_key ON entries (key, id)")
        self.db.commit()

    async def append(self, key: dict[str, str], entries: list[Any]) -> None:
        name = f"{key['project_key']}/{key['session_id']}"
        with self.db:
            self.db.executemany(
                "INSERT INTO entries (key, entry) VALUES (?, ?)",
                [(name, json.dumps(e)) for e in entries],
            )

    async def load(self, key: dict[str, str]) -> list[Any] | None:
        name = f"{key['project_key']}/{key['session_id']}"
        rows = self.db.execute("SELECT entry FROM entries WHERE key = ? ORDER BY id", (name,))
        return [json.loads(r[0]) for r in rows] or None


class RedisStore:
    """``SessionStore`` append and load on a Redis list per transcript (RPUSH, LRANGE)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def append(self, key: dict[str, str], entries: list[Any]) -> None:
        name = f"claude:{key['project_key']}/{key['session_id']}"
        await self.client.rpush(name, *(json.dumps(e) for e in entries))

    async def load(self, key: dict[str, str]) -> list[Any] | None:
        name = f"claude:{key['project_key']}/{key['session_id']}"
        return [json.loads(raw) for raw in await self.client.lrange(name, 0, -1)] or None


class PgStore:
    """``SessionStore`` append and load on one Postgres table (autocommit, psycopg 3)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def create_table(self) -> None:
        await self.connection.execute(
            "CREATE TABLE IF NOT EXISTS claude_entries (id bigserial PRIMARY KEY, "
            "key text NOT NULL, entry text NOT NULL)"
        )
        await self.connection.execute(
            "CREATE INDEX IF NOT EXISTS claude_entries_key ON claude_entries (key, id)"
        )

    async def append(self, key: dict[str, str], entries: list[Any]) -> None:
        name = f"{key['project_key']}/{key['session_id']}"
        async with self.connection.transaction(), self.connection.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO claude_entries (key, entry) VALUES (%s, %s)",
                [(name, json.dumps(e)) for e in entries],
            )

    async def load(self, key: dict[str, str]) -> list[Any] | None:
        name = f"{key['project_key']}/{key['session_id']}"
        cursor = await self.connection.execute(
            "SELECT entry FROM claude_entries WHERE key = %s ORDER BY id", (name,)
        )
        return [json.loads(r[0]) for r in await cursor.fetchall()] or None


async def claude_sqlite(settings: Settings, path: Path) -> dict[str, list[float]]:
    store = SqliteStore(path)
    try:
        return await claude_calls(settings, store, f"bench-{time.time_ns()}")
    finally:
        store.db.close()


async def claude_redis(settings: Settings, port: int) -> dict[str, list[float]]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        return await claude_calls(settings, RedisStore(client), f"bench-{time.time_ns()}")
    finally:
        await client.aclose()


async def claude_postgres(settings: Settings, dsn: str) -> dict[str, list[float]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        store = PgStore(connection)
        await store.create_table()
        return await claude_calls(settings, store, f"bench-{time.time_ns()}")


# -- concurrent writers (OpenAI Agents SDK sessions) ---------------------------------------------

CONCURRENT = f"{WRITERS} writers at once"
CONCURRENT_CALLS = (ONE_SESSION, MANY_SESSIONS)


async def concurrent_calls(
    settings: Settings, make: Callable[[str, int], Any], prefix: str
) -> dict[str, list[float]]:
    """WRITERS tasks at once, each adding one item per call (``frameworks_calls`` calls in
    all, split between them), every call timed: all on one session, then each on its own.
    ``make(session_id, writer)`` opens writer ``writer``'s session."""
    per_writer = max(1, settings.frameworks_calls // WRITERS)
    out: dict[str, list[float]] = {}
    for call, shared in ((ONE_SESSION, True), (MANY_SESSIONS, False)):
        sessions = [make(f"{prefix}-{'one' if shared else f'own{w}'}", w) for w in range(WRITERS)]
        for session in sessions:
            await session.add_items([ITEM])  # untimed: opens connections, creates the session
        out[call] = []

        async def writer(session: Any, times: list[float]) -> None:
            for _ in range(per_writer):
                started = time.perf_counter()
                await session.add_items([ITEM])
                times.append((time.perf_counter() - started) * 1000)

        await asyncio.gather(*(writer(session, out[call]) for session in sessions))
    return out


async def concurrent_sessionlog(settings: Settings, address: str) -> dict[str, list[float]]:
    from sessionlog_client import AsyncClient
    from sessionlog_client.openai_agents import SessionlogSession

    async with AsyncClient(address) as client:
        return await concurrent_calls(
            settings, lambda sid, _: SessionlogSession(sid, client), f"fw-cw-{time.time_ns()}"
        )


async def concurrent_sqlite(settings: Settings, path: Path) -> dict[str, list[float]]:
    from agents import SQLiteSession

    opened: list[Any] = []

    def make(session_id: str, _: int) -> Any:
        opened.append(SQLiteSession(session_id, db_path=path))
        return opened[-1]

    try:
        return await concurrent_calls(settings, make, f"fw-cw-{time.time_ns()}")
    finally:
        for session in opened:
            session.close()


async def concurrent_redis(settings: Settings, port: int) -> dict[str, list[float]]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        try:
            from agents.extensions.memory.redis_session import RedisSession

            def make(sid: str, _: int) -> Any:
                return RedisSession(sid, redis_client=client)
        except ImportError:

            def make(sid: str, _: int) -> Any:
                return ListSession(sid, client)

        return await concurrent_calls(settings, make, f"fw-cw-{time.time_ns()}")
    finally:
        await client.aclose()


async def concurrent_postgres(settings: Settings, dsn: str) -> dict[str, list[float]]:
    """One connection per writer (one psycopg connection runs one statement at a time)."""
    import psycopg

    connections = [
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(WRITERS)
    ]
    try:
        await PgSession.create_table(connections[0])
        return await concurrent_calls(
            settings, lambda sid, w: PgSession(sid, connections[w]), f"fw-cw-{time.time_ns()}"
        )
    finally:
        for connection in connections:
            await connection.close()


# -- the group -----------------------------------------------------------------------------------


def run_group(
    settings: Settings, server: ServerProcess, work: Path, progress: Callable[[str], None]
) -> list[CallRow]:
    """Every framework's calls on sessionlog and on each peer that can run here."""
    rows: list[CallRow] = []
    directory = work / "frameworks"
    directory.mkdir(parents=True, exist_ok=True)
    redis_missing = redis_unavailable()
    pg_missing = postgres_unavailable()
    with contextlib.ExitStack() as stack:
        redis = None if redis_missing else stack.enter_context(peer.redis_server(directory / "r"))
        pg = None
        if not pg_missing:
            progress("  starting postgres (initdb, synchronous_commit=on)")
            pg = stack.enter_context(postgres_server())

        def add(
            framework: str,
            calls: tuple[str, ...],
            store: str,
            kind: str,
            missing: str,
            measure: Callable[[], dict[str, list[float]]],
        ) -> None:
            if missing:
                rows.extend(CallRow(framework, c, store, kind, skipped=missing) for c in calls)
                return
            progress(f"  {framework}: {store}")
            found = measure()
            rows.extend(CallRow(framework, c, store, kind, found[c]) for c in calls)

        openai_missing = _missing_modules("agents")
        add(OPENAI, OPENAI_CALLS, SESSIONLOG, SESSIONLOG, openai_missing,
            lambda: asyncio.run(openai_sessionlog(settings, server.address)))  # fmt: skip
        add(OPENAI, OPENAI_CALLS, "SQLite (SQLiteSession, file, WAL)", IN_PROCESS,
            openai_missing,
            lambda: asyncio.run(openai_sqlite(settings, directory / "openai.db")))  # fmt: skip
        redis_kind: list[str] = []

        def on_redis() -> dict[str, list[float]]:
            assert redis is not None
            found, kind = asyncio.run(openai_redis(settings, redis.port))
            redis_kind.append(kind)
            return found

        add(OPENAI, OPENAI_CALLS, "Redis (AOF always)", NETWORKED,
            openai_missing or redis_missing, on_redis)  # fmt: skip
        add(OPENAI, OPENAI_CALLS, "Postgres (table, psycopg)", NETWORKED,
            openai_missing or pg_missing,
            lambda: asyncio.run(openai_postgres(settings, pg.dsn if pg else "")))  # fmt: skip
        if redis_kind:
            for row in rows:
                if row.store == "Redis (AOF always)":
                    row.store = f"Redis (AOF always, {redis_kind[0]})"

        adk_missing = _missing_modules("google.adk")
        adk_db_missing = adk_missing or _missing_modules("sqlalchemy", "greenlet", "aiosqlite")
        add(ADK, ADK_CALLS, SESSIONLOG, SESSIONLOG, adk_missing,
            lambda: asyncio.run(adk_sessionlog(settings, server.address)))  # fmt: skip
        sqlite_url = f"sqlite+aiosqlite:///{directory / 'adk.db'}"
        add(ADK, ADK_CALLS, "SQLite (DatabaseSessionService)", IN_PROCESS, adk_db_missing,
            lambda: asyncio.run(adk_database(settings, sqlite_url)))  # fmt: skip
        add(ADK, ADK_CALLS, "Postgres (DatabaseSessionService)", NETWORKED,
            adk_missing or _missing_modules("sqlalchemy", "greenlet") or pg_missing,
            lambda: asyncio.run(adk_database(settings, pg.url if pg else "")))  # fmt: skip

        claude_missing = _missing_modules("claude_agent_sdk")
        add(CLAUDE, CLAUDE_CALLS, SESSIONLOG, SESSIONLOG, claude_missing,
            lambda: asyncio.run(claude_sessionlog(settings, server.address)))  # fmt: skip
        add(CLAUDE, CLAUDE_CALLS, "SQLite (table, file, WAL)", IN_PROCESS, "",
            lambda: asyncio.run(claude_sqlite(settings, directory / "claude.db")))  # fmt: skip
        add(CLAUDE, CLAUDE_CALLS, "Redis (AOF always, a list per transcript)", NETWORKED,
            redis_missing or _missing_modules("redis"),
            lambda: asyncio.run(claude_redis(settings, redis.port if redis else 0)))  # fmt: skip
        add(CLAUDE, CLAUDE_CALLS, "Postgres (table, psycopg)", NETWORKED,
            pg_missing or _missing_modules("psycopg"),
            lambda: asyncio.run(claude_postgres(settings, pg.dsn if pg else "")))  # fmt: skip

        add(CONCURRENT, CONCURRENT_CALLS, SESSIONLOG, SESSIONLOG, openai_missing,
            lambda: asyncio.run(concurrent_sessionlog(settings, server.address)))  # fmt: skip
        add(CONCURRENT, CONCURRENT_CALLS, "SQLite (SQLiteSession, file, WAL)", IN_PROCESS,
            openai_missing,
            lambda: asyncio.run(concurrent_sqlite(settings, directory / "cw.db")))  # fmt: skip
        add(CONCURRENT, CONCURRENT_CALLS, "Redis (AOF always)", NETWORKED,
            openai_missing or redis_missing,
            lambda: asyncio.run(concurrent_redis(settings, redis.port if redis else 0)),
            )  # fmt: skip
        add(CONCURRENT, CONCURRENT_CALLS, f"Postgres (table, psycopg, {WRITERS} connections)",
            NETWORKED, openai_missing or pg_missing,
            lambda: asyncio.run(concurrent_postgres(settings, pg.dsn if pg else "")))  # fmt: skip

        lg_missing = _missing_modules("langgraph.checkpoint.base")
        add(LANGGRAPH, LANGGRAPH_CALLS, SESSIONLOG, SESSIONLOG, lg_missing,
            lambda: langgraph_sessionlog(settings, server.address))  # fmt: skip
        add(LANGGRAPH, LANGGRAPH_CALLS, "SQLite (SqliteSaver)", IN_PROCESS,
            lg_missing or _missing_modules("langgraph.checkpoint.sqlite"),
            lambda: langgraph_sqlite(settings, directory / "langgraph.db"))  # fmt: skip
        add(LANGGRAPH, LANGGRAPH_CALLS, "Postgres (PostgresSaver)", NETWORKED,
            lg_missing or _missing_modules("langgraph.checkpoint.postgres") or pg_missing,
            lambda: langgraph_postgres(settings, pg.dsn if pg else ""))  # fmt: skip
    return rows


# -- the table and the targets -------------------------------------------------------------------


def _ours(rows: list[CallRow], row: CallRow) -> CallRow | None:
    for other in rows:
        if (other.framework, other.call, other.kind) == (row.framework, row.call, SESSIONLOG):
            return other
    return None


def _limit(row: CallRow) -> float:
    """The highest ratio sessionlog / peer (of the p50s) that meets the target for this row."""
    return 2.0 if row.kind == IN_PROCESS and row.call not in AHEAD_CALLS else 1.0


def ratio(rows: list[CallRow], row: CallRow) -> float | None:
    ours = _ours(rows, row)
    if ours is None or ours.p50_ms is None or row.p50_ms is None or row.p50_ms <= 0:
        return None
    return ours.p50_ms / row.p50_ms


def goals(rows: list[CallRow]) -> list[Goal]:
    """Each peer row's target: met, not met, or not measured (skipped)."""
    out = []
    for row in rows:
        if row.kind == SESSIONLOG:
            continue
        limit = _limit(row)
        found = ratio(rows, row)
        out.append(
            Goal(
                what=f"{row.framework} {row.call} p50 vs {row.store}",
                goal=f"<= {limit:g}x",
                measured="-" if found is None else f"{found:.2f}x",
                met=None if found is None else found <= limit,
            )
        )
    return out


def table(rows: list[CallRow]) -> str:
    """Each call's sessionlog row, then its peers' rows under it (a stable sort by call)."""
    header = (
        f"{'framework call':<40}  {'store':<52}  {'calls':>5}  {'p50 ms':>8}  {'p99 ms':>8}  "
        f"{'ratio':>6}  {'target':<6}"
    )
    lines = [header, "-" * len(header)]
    calls = list(dict.fromkeys((row.framework, row.call) for row in rows))
    by_call = sorted(rows, key=lambda row: calls.index((row.framework, row.call)))
    for row in by_call:
        name = f"{row.framework} {row.call}" if row.kind == SESSIONLOG else ""
        if row.skipped:
            lines.append(f"{name:<40}  {row.store:<52}  skipped: {row.skipped}")
            continue
        found = ratio(rows, row) if row.kind != SESSIONLOG else None
        if row.kind == SESSIONLOG:
            mark = ""
        elif found is None:
            mark = "n/a"
        else:
            mark = "met" if found <= _limit(row) else "NOT met"
        lines.append(
            f"{name:<40}  {row.store:<52}  {len(row.latencies_ms):>5}  {_ms(row.p50_ms):>8}  "
            f"{_ms(row.p99_ms):>8}  {_ratio(found):>6}  {mark:<6}"
        )
    return "\n".join(lines)


def note(settings: Settings) -> str:
    return (
        "Case 12, the framework backends: one client, one call at a time from the bench's own "
        f"process, {settings.frameworks_calls} timed calls after {WARMUP_CALLS} untimed "
        f"({settings.frameworks_whole_calls} after {WHOLE_WARMUP_CALLS} for list_sessions and "
        "the whole history); "
        f"get_items on a session of {settings.frameworks_items:,} items, list_sessions over "
        f"{settings.frameworks_sessions:,} sessions. ratio: sessionlog p50 / the peer's p50 "
        "(lower is better). target: at or ahead (<= 1x) of every networked peer on every call "
        "and of in-process SQLite on listing, last-N and whole-history reads; within 2x of "
        "in-process SQLite on the other calls. Durable settings everywhere: sessionlog synced "
        "commits, SQLite synchronous=FULL, Redis appendfsync always, Postgres "
        "synchronous_commit=on."
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
