"""A TCP relay on 127.0.0.1 for fault tests: forward bytes both ways, or swallow them.

    client ──▶ relay.port ──▶ target          forwarding (the default)
    client ──▶ relay.port ─X                  black hole: both sockets stay open, every byte
                                              read is dropped, nothing is sent either way

This is a dead link as TCP keeps it: no reset, no FIN, the peers' writes succeed, and only a
deadline or keepalive on top of TCP can tell. Bytes a black hole swallowed are gone, so a
connection it held never forwards again (HTTP/2 on it would be corrupt): ``blackhole(False)``
makes *new* connections forward, and the old ones stay silent until a peer gives up on them and
closes its side, or until ``cut()``. A connection opened during a black hole never reaches the
target at all.

    with Relay(target_port).start() as relay:     # stop() closes everything, joins the thread
        connect(relay.address)
        relay.blackhole(True); ...; relay.blackhole(False)
        relay.cut()                               # reset every open connection

The relay runs an asyncio loop in one daemon thread; every method may be called from any other
thread and returns once the change is in effect (bounded by ``CALL_SECONDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

CHUNK_BYTES = 64 << 10
CALL_SECONDS = 5.0


@dataclass(eq=False)
class _Link:
    """One client connection and, unless it was born in a black hole, its upstream."""

    downstream: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    dead: bool = False
    """Set once a black hole swallowed (or could have swallowed) its bytes; never cleared."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.downstream, self.upstream):
            if writer is not None:
                writer.transport.abort()


class Relay:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port``; see the module docstring."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port
        self._blackhole = False
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """Client connections open now (black-holed ones included)."""
        return len(self._links)

    def start(self) -> Relay:
        """Listen (on ``port``, or a free one) and return once accepting."""
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="relay", daemon=True)
        self._thread.start()
        self._run(self._listen())
        return self

    def blackhole(self, on: bool) -> None:
        """Swallow everything from now on (on), or forward new connections again (off)."""
        self._run(self._set_blackhole(on))

    def cut(self) -> None:
        """Reset every open connection, forwarding or black-holed; new ones are accepted."""
        self._run(self._cut())

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop, join the thread."""
        if self._loop is None or self._thread is None:
            return
        self._run(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_SECONDS)
        assert not self._thread.is_alive(), "the relay thread did not stop"
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, work: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None, "the relay is not started"
        asyncio.run_coroutine_threadsafe(work, self._loop).result(CALL_SECONDS)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_blackhole(self, on: bool) -> None:
        self._blackhole = on
        if on:
            for link in self._links:
                link.dead = True

    async def _cut(self) -> None:
        for link in list(self._links):
            link.abort()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()
        tasks = [task for link in self._links for task in link.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer, dead=self._blackhole)
        self._links.add(link)
        try:
            if link.dead:
                link.tasks = [asyncio.create_task(self._pump(link, reader, None))]
            else:
                try:
                    target = await asyncio.open_connection("127.0.0.1", self.target_port)
                except OSError:
                    return  # the target is down: refuse, as it would
                link.upstream = target[1]
                link.tasks = [
                    asyncio.create_task(self._pump(link, reader, target[1])),
                    asyncio.create_task(self._pump(link, target[0], writer)),
                ]
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            link.abort()
            self._links.discard(link)

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None
    ) -> None:
        """Copy one direction until EOF; drop what a dead link reads. A live link's EOF closes
        it whole (gRPC never half-closes a connection); a dead one keeps its other side open."""
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(CHUNK_BYTES):
                if link.dead or writer is None:
                    continue
                writer.write(chunk)
                await writer.drain()
        if not link.dead:
            link.abort()
