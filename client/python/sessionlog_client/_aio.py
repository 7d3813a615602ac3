"""The asyncio client: the methods of ``Client``, awaitable; streams are async iterators.

The source of the blocking client: ``client/python/gen_sync.py`` rewrites this whole file into
``_sync.py`` (``make gen-client``; ``make gen-check`` fails when ``_sync.py`` is stale). Where
the two must differ, call a helper of ``_async_io``: ``_sync_io`` holds its blocking twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from sessionlog_client import _async_io as io
from sessionlog_client import _common as c
from sessionlog_client import _etcd
from sessionlog_client._common import EventLike, MessageLike, Retry
from sessionlog_client._routing import (
    ADMIN,
    LOG,
    REPLICATION,
    WRITES,
    Member,
    Router,
    Step,
    StreamEpochs,
    make_router,
    move_budget,
    replicas_unavailable,
)
from sessionlog_client._shards import (
    SERVER,
    ShardGroup,
    ShardMapInvalid,
    ShardTable,
    after_wrong_group,
    is_wrong_group,
)
from sessionlog_client._status import to_error
from sessionlog_client.convert import TimeLike, messages_to_dicts, struct_to_dict
from sessionlog_client.errors import LeadershipLost, ResponseTooLarge, SeqConflict, SessionLogError
from sessionlog_client.v1 import admin_service_pb2 as apb
from sessionlog_client.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog_client.v1 import replication_service_pb2 as rpb
from sessionlog_client.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client.v1.event_pb2 import Event


class AsyncEventStream(AsyncIterator[Event]):
    """The asyncio twin of :class:`EventStream`: reconnects from ``next_seq`` after UNAVAILABLE
    or another end of the transport (a proxy's ``Stream removed``, an RST_STREAM, an HTTP 503)
    and after a follow stream's silence (``DEAD_AFTER_HEARTBEATS`` of its intervals).

    Use it in ``async with`` (or call ``aclose()``) so the gRPC call ends as soon as you stop
    reading; breaking out of ``async for`` alone leaves the call to the garbage collector::

        async with client.follow("demo") as events:
            async for ev in events:
                ...
    """

    def __init__(
        self,
        router: Router,
        connection: c.Connection,
        session_id: str,
        seq: int,
        *,
        follow: bool,
        timeout: float | None,
        heartbeat: float | None = None,
    ) -> None:
        self.session_id = session_id
        self.next_seq = seq
        self.caught_up = False
        self.reconnects = 0
        self.dead_streams = 0
        self._router = router
        self._connection = connection
        self._follow = follow
        self._timeout = timeout
        self._heartbeat = heartbeat if follow else None
        self._silence = c.silence_limit(self._heartbeat)
        self._closed = asyncio.Event()
        self._lock = io.call_guard()
        self._call: Any = None
        self._batches = self._run_batches()
        self._events = self._run()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    def batches(self) -> AsyncIterator[Sequence[Event]]:
        """The same events a response at a time, in seq order (``async for batch in
        stream.batches()``): a whole read costs one step per response instead of one per event.

        Reconnects as the event iterator does; read a stream either way, not both.
        """
        return self._batches

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def cancel(self) -> None:
        """Stop the stream without waiting: a pending ``__anext__`` ends with StopAsyncIteration."""
        self._closed.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    async def aclose(self) -> None:
        """Stop the stream and release its call."""
        self.cancel()
        with contextlib.suppress(io.GENERATOR_RUNNING):  # a read elsewhere: the cancel ends it
            await self._events.aclose()
        with contextlib.suppress(io.GENERATOR_RUNNING):
            await self._batches.aclose()

    def _open(self, member: Member) -> Any:
        with self._lock:
            if self._closed.is_set():
                return None
            request = c.since_request(self.session_id, self.next_seq, self._follow, self._heartbeat)
            self._call = member.stubs[LOG].Since(
                request,
                timeout=self._timeout,
                metadata=self._connection.call_metadata(self.session_id),
                wait_for_ready=self._connection.wait_for_ready or None,
            )
            return self._call

    async def _run(self) -> AsyncGenerator[Event, None]:
        async for batch in self._batches:
            for event in batch:
                self.next_seq = event.seq + 1
                yield event

    async def _run_batches(self) -> AsyncGenerator[Sequence[Event], None]:
        backoff = self._connection.retry.backoff()
        hops = 0
        while True:
            if self._closed.is_set():
                return
            member = await self._router.pick_async()
            if member is None:  # no primary known yet (etcd named none): wait and ask again
                wait = backoff.next()
                if wait is None:
                    raise self._router.nobody()
                await io.pause(self._closed, wait)
                continue
            call = self._open(member)
            if call is None:
                return
            reader = io.Reader(call, self._silence, self._closed)
            delay: float | None = None
            try:
                while True:
                    response = await reader.read()
                    if response is None:
                        break
                    backoff.reset()
                    hops = 0
                    member.reached = True
                    if response.caught_up:
                        self.caught_up = True
                    events: Sequence[Event] = response.events
                    if events and events[0].seq < self.next_seq:  # delivered before a reconnect
                        events = [e for e in events if e.seq >= self.next_seq]
                    if events:
                        self.next_seq = events[-1].seq + 1
                        yield events
                return
            except TimeoutError:
                self.dead_streams += 1
                self._router.moved(member)
                delay = backoff.next()
                if delay is None:
                    raise c.dead_stream(self._silence) from None
            except grpc.RpcError as error:
                if self._closed.is_set():
                    return
                step = self._router.after(member, error, retry=True, hops=hops, stream=True)
                hops += step is Step.AGAIN
                budget = move_budget(error, self._connection.retry)
                later = 0.0 if step is Step.AGAIN else backoff.next(budget)
                delay = None if step is Step.RAISE else later
                if delay is None:
                    raise to_error(error) from error
            finally:
                reader.stop()
            await io.pause(self._closed, delay)
            if self._closed.is_set():
                return
            self.reconnects += 1


class AsyncSessionsStream(AsyncIterator[pb.FollowedChange]):
    """The asyncio twin of :class:`SessionsStream` (``AsyncClient.follow_sessions``): resumes
    after the last position the server sent when the call drops or goes silent, with that
    position's checksum, so a server whose history is not the one read (restored from an older
    backup) raises HistoryDiverged instead of resuming in the middle of another history."""

    def __init__(
        self,
        router: Router,
        connection: c.Connection,
        *,
        prefix: str,
        filter_text: str,
        after: int | None,
        follow: bool,
        heartbeat: float | None,
    ) -> None:
        self.prefix = prefix
        self.filter = filter_text
        self.position = after
        self.checksum = b""
        self.caught_up = False
        self.reconnects = 0
        self._router = router
        self._connection = connection
        self._follow = follow
        self._heartbeat = heartbeat
        self._silence = c.silence_limit(heartbeat)
        self._closed = asyncio.Event()
        self._lock = io.call_guard()
        self._call: Any = None
        self._pending: tuple[Member, Any] | None = None
        if after is None:
            # Started now, not at the first read: a stream "from now" must not miss what
            # commits between follow_sessions() and the first read.
            member = router.current()
            if member is not None:
                self._pending = (member, self._open(member))
        self._changes = self._run()

    def __aiter__(self) -> AsyncSessionsStream:
        return self

    async def __anext__(self) -> pb.FollowedChange:
        return await self._changes.__anext__()

    async def __aenter__(self) -> AsyncSessionsStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def cancel(self) -> None:
        """Stop the stream without waiting: a pending ``__anext__`` ends with StopAsyncIteration."""
        self._closed.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    async def aclose(self) -> None:
        """Stop the stream and release its call."""
        self.cancel()
        with contextlib.suppress(io.GENERATOR_RUNNING):
            await self._changes.aclose()
        self._pending = None

    def _open(self, member: Member) -> Any:
        with self._lock:
            if self._closed.is_set():
                return None
            request = c.follow_sessions_request(
                self.prefix, self.filter, self.position, self._heartbeat, self.checksum
            )
            self._call = member.stubs[LOG].FollowSessions(
                request,
                metadata=self._connection.call_metadata(),
                wait_for_ready=self._connection.wait_for_ready or None,
            )
            return self._call

    async def _run(self) -> AsyncGenerator[pb.FollowedChange, None]:
        backoff = self._connection.retry.backoff()
        hops = 0
        while not self._closed.is_set():
            if self._pending is not None:
                (member, call), self._pending = self._pending, None
            else:
                picked = await self._router.pick_async()
                if picked is None:
                    wait = backoff.next()
                    if wait is None:
                        raise self._router.nobody()
                    await io.pause(self._closed, wait)
                    continue
                member, call = picked, self._open(picked)
            if call is None:
                return
            reader = io.Reader(call, self._silence, self._closed)
            delay: float | None = None
            try:
                while True:
                    response = await reader.read()
                    if response is None:
                        return
                    backoff.reset()
                    hops = 0
                    member.reached = True
                    for change in response.changes:
                        self.position = change.position
                        self.checksum = c.checksum_at(response, change.position)
                        yield change
                    if response.position:
                        self.position = max(self.position or 0, response.position)
                        self.checksum = c.checksum_at(response, self.position)
                    if response.caught_up:
                        self.caught_up = True
                        if not self._follow:
                            return
            except TimeoutError:
                self._router.moved(member)
                delay = backoff.next()
                if delay is None:
                    raise c.dead_stream(self._silence) from None
            except grpc.RpcError as error:
                if self._closed.is_set():
                    return
                step = self._router.after(member, error, retry=True, hops=hops, stream=True)
                hops += step is Step.AGAIN
                delay = (
                    None if step is Step.RAISE else 0.0 if step is Step.AGAIN else backoff.next()
                )
                if delay is None:
                    raise to_error(error) from error
            finally:
                reader.stop()
            await io.pause(self._closed, delay)
            if self._closed.is_set():
                return
            self.reconnects += 1


class _AsyncShardedStream(AsyncEventStream):
    """The asyncio twin of ``_sync._ShardedStream``: over the owner group's client, moving on
    from ``next_seq`` to the new owner after a WRONG_GROUP, once per refusal with no event
    between."""

    def __init__(
        self,
        shards: _AsyncShards,
        bootstrap: AsyncClient,
        session_id: str,
        seq: int,
        *,
        follow: bool,
        timeout: float | None,
        heartbeat: float | None,
    ) -> None:
        self._shards = shards
        self._group_client = bootstrap
        super().__init__(
            bootstrap._router,
            bootstrap.connection,
            session_id,
            seq,
            follow=follow,
            timeout=timeout,
            heartbeat=heartbeat,
        )

    def _use(self, client: AsyncClient) -> None:
        self._group_client = client
        self._router = client._router
        self._connection = client.connection

    async def _run_batches(self) -> AsyncGenerator[Sequence[Event], None]:
        self._use(await self._shards.client_for(self.session_id))  # the map loads at the first read
        rerouted_at: int | None = None
        while True:
            inner = super()._run_batches()
            try:
                async for batch in inner:
                    yield batch
                return
            except SessionLogError as error:
                if not is_wrong_group(error) or rerouted_at == self.next_seq:
                    raise
                owner = await self._shards.after_wrong_group(
                    self.session_id, error, self._group_client
                )
                if owner is None:
                    raise
                rerouted_at = self.next_seq
                self._use(owner)
            finally:
                await inner.aclose()


class _AsyncShards:
    """The asyncio twin of ``_sync._Shards``."""

    def __init__(self, bootstrap: AsyncClient, source: str, make: Any, timeout: float) -> None:
        self._bootstrap = bootstrap
        self._etcd = () if source == SERVER else _etcd.parse_cluster(source)
        self._make = make
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self.table: ShardTable | None = None
        self._loaded = False
        self._clients: dict[tuple[str, tuple[str, ...]], AsyncClient] = {}

    async def load(self) -> ShardTable | None:
        """The map routed by (read at the first call); None: unsharded, one group."""
        async with self._lock:
            return await self._load()

    async def _load(self) -> ShardTable | None:
        if not self._loaded:
            self.table = await self._read(self._bootstrap)
            self._loaded = True
        return self.table

    async def client_for(self, session_id: str) -> AsyncClient:
        """The client of the group that owns ``session_id`` (the bootstrap one, unsharded)."""
        async with self._lock:
            table = await self._load()
            if table is None:
                return self._bootstrap
            return self._client_of(table.owner(session_id))

    async def after_wrong_group(
        self, session_id: str, error: SessionLogError, refused_by: AsyncClient
    ) -> AsyncClient | None:
        async with self._lock:
            try:
                newer = await self._read(refused_by)
            except (SessionLogError, ShardMapInvalid):  # a damaged map: the error's word
                newer = None
            table, owner = after_wrong_group(self.table, newer, session_id, error.metadata)
            self.table = table if table is not None else self.table
            if owner is None:
                return None
            client = self._client_of(owner)
            return None if client is refused_by else client

    def _client_of(self, group: ShardGroup) -> AsyncClient:
        key = (group.name, tuple(sorted(set(group.addresses))))
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = self._make(list(group.addresses))
        return client

    async def _read(self, client: AsyncClient) -> ShardTable | None:
        if self._etcd:
            value = await asyncio.to_thread(
                _etcd.read_key, self._etcd, _etcd.SHARDS_KEY, self._timeout, "the shard map"
            )
            return None if value is None else ShardTable.from_json(value)
        reply = await client._call("GetShardMap", pb.GetShardMapRequest(), None, retry=True)
        return ShardTable.from_reply(reply)

    async def close(self) -> None:
        async with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            await client.close()


class AsyncAppendStream:
    """Appends pipelined on one AppendStream call (``AsyncClient.append_stream``): see
    :class:`AppendStream`. ``append_nowait`` returns an ``asyncio.Future`` of this loop."""

    def __init__(self, client: AsyncClient, timeout: float | None) -> None:
        self._client = client
        self._timeout = timeout
        self._member: Member | None = None
        self._pipe: io.AppendPipe | None = None
        self._opening = io.call_guard()
        """Held while the first append opens the call (appends from several threads)."""

    async def __aenter__(self) -> AsyncAppendStream:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.aclose()
        else:
            self.cancel()

    async def open(self) -> None:
        """Pick the member writes go to now (``async with`` does it); the call opens there with
        the first append, carrying the epoch of that append's group."""
        client = self._client
        if client._shards is not None:
            raise ValueError(
                "append_stream sends every append to one server group; with a shard map, use "
                "one client per group (or append)"
            )
        member = await client._router.pick_async()
        if member is None:
            raise client._router.nobody()
        self._member = member

    def _open_pipe(self, member: Member, session_id: str) -> io.AppendPipe:
        router, connection = self._client._router, self._client.connection
        return io.AppendPipe(
            member.stubs[LOG].AppendStream,
            StreamEpochs(router, member),
            timeout=self._timeout,
            metadata=router.stream_metadata(connection.call_metadata(), session_id),
            wait_for_ready=connection.wait_for_ready or None,
        )

    def append_nowait(
        self,
        session_id: str,
        events: Iterable[EventLike],
        *,
        expected_seq: int | None = None,
        request_id: str | None = None,
        lease_holder: str = "",
        lease_token: int = 0,
        lenient: bool = False,
    ) -> io.Pending[pb.AppendResponse]:
        """Send one append at once (see ``AppendStream.append_nowait``); await the future for
        its reply, the ``AppendResponse`` ``append`` returns, or its error."""
        if self._member is None:
            raise RuntimeError("open the append stream first: async with client.append_stream()")
        request = c.append_request(
            session_id,
            events,
            expected_seq=expected_seq,
            request_id=c.new_request_id() if request_id is None else request_id,
            lease_holder=lease_holder,
            lease_token=lease_token,
            lenient=lenient,
        )
        with self._opening:
            if self._pipe is None:
                self._pipe = self._open_pipe(self._member, session_id)
        return self._pipe.send(request)

    async def aclose(self) -> None:
        """Send no more; return once every append sent has its outcome."""
        if self._pipe is not None:
            await self._pipe.close()

    def cancel(self) -> None:
        """End the call now; the appends still unanswered fail with Cancelled."""
        if self._pipe is not None:
            self._pipe.cancel()


class AsyncClient:
    """The asyncio sessionlog client; same arguments and methods as :class:`Client`, several
    addresses and ``cluster``/``group`` (etcd) included.

    Create it inside a running event loop, and close it with ``await client.close()`` or
    ``async with``::

        async with AsyncClient("127.0.0.1:50051") as client:
            await client.append("demo", [event("user_message", {"content": "hi"})])
            async with client.follow("demo") as events:
                async for ev in events:
                    print(ev.seq, ev.data)
    """

    def __init__(
        self,
        target: str | Sequence[str] | None = None,
        *,
        cluster: str | None = None,
        group: str | None = None,
        timeout: float | None = c.DEFAULT_TIMEOUT,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | str | Path | None = None,
        private_key: bytes | str | Path | None = None,
        certificate_chain: bytes | str | Path | None = None,
        server_name: str | None = None,
        max_message_bytes: int = c.DEFAULT_MAX_MESSAGE_BYTES,
        retry: Retry | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        options: Sequence[tuple[str, Any]] = (),
        connect_timeout: float = c.DEFAULT_CONNECT_TIMEOUT,
        wait_for_ready: bool = False,
        shard_map: str | None = None,
    ) -> None:
        self._router = make_router(
            target,
            cluster,
            group,
            connect_timeout=connect_timeout,
            wait_for_ready=wait_for_ready,
            open_member=self._open_member,
        )
        self.connection = c.Connection(
            target=self._router.target,
            timeout=timeout,
            token=token,
            tls=tls,
            root_certificates=root_certificates,
            private_key=private_key,
            certificate_chain=certificate_chain,
            server_name=server_name,
            max_message_bytes=max_message_bytes,
            retry=retry or Retry(),
            metadata=metadata,
            options=options,
            connect_timeout=connect_timeout,
            wait_for_ready=wait_for_ready,
        )
        self._router.open()
        self._streams: weakref.WeakSet[AsyncEventStream] = weakref.WeakSet()
        self._follows: weakref.WeakSet[AsyncSessionsStream] = weakref.WeakSet()
        self._shards: _AsyncShards | None = None
        if shard_map is not None:

            def group_client(addresses: list[str]) -> AsyncClient:
                client = AsyncClient(
                    addresses,
                    timeout=timeout,
                    token=token,
                    tls=tls,
                    root_certificates=root_certificates,
                    private_key=private_key,
                    certificate_chain=certificate_chain,
                    server_name=server_name,
                    max_message_bytes=max_message_bytes,
                    retry=retry,
                    metadata=metadata,
                    options=options,
                    connect_timeout=connect_timeout,
                    wait_for_ready=wait_for_ready,
                )
                client._router.retry_wrong_group = False
                return client

            self._router.retry_wrong_group = False  # the shard routing reroutes it
            self._shards = _AsyncShards(self, shard_map, group_client, connect_timeout)

    def _open_member(self, address: str) -> tuple[grpc.aio.Channel, dict[str, Any]]:
        conn = self.connection
        if conn.secure:
            channel = grpc.aio.secure_channel(
                address, conn.credentials(), options=conn.channel_options()
            )
        else:
            channel = grpc.aio.insecure_channel(address, options=conn.channel_options())
        stubs = {
            LOG: pb_grpc.SessionLogServiceStub(channel),  # type: ignore[no-untyped-call]
            REPLICATION: rpb_grpc.ReplicationServiceStub(channel),  # type: ignore[no-untyped-call]
            ADMIN: apb_grpc.AdminServiceStub(channel),  # type: ignore[no-untyped-call]
        }
        return channel, stubs

    @property
    def members(self) -> list[str]:
        """Every address this client knows, given or learnt from hints and etcd."""
        return [m.address for m in self._router.members]

    @property
    def current(self) -> str | None:
        """The address calls go to now (the primary as far as the client knows)."""
        member = self._router.current()
        return None if member is None else member.address

    @property
    def epoch(self) -> int:
        """The highest leadership epoch a server named in a write's reply (0: none yet). It
        goes with every write: a server at a lower epoch (a deposed primary) refuses it."""
        return self._router.epoch

    async def shard_map(self) -> ShardTable | None:
        """The shard map calls are routed by (see ``Client.shard_map``), loaded if not yet."""
        return None if self._shards is None else await self._shards.load()

    async def close(self) -> None:
        """Close every open stream, then every channel."""
        for stream in list(self._streams):
            await stream.aclose()
        for followed in list(self._follows):
            await followed.aclose()
        if self._shards is not None:
            await self._shards.close()
        for channel in self._router.channels():
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(
        self, method: str, request: Any, timeout: float | None, *, retry: bool, stub: str = LOG
    ) -> Any:
        """See ``Client._call``."""
        session = c.session_of(request) if self._shards is not None else ""
        if self._shards is None or not session:
            return await self._send(method, request, timeout, retry=retry, stub=stub)
        owner = await self._shards.client_for(session)
        if owner is self:
            return await self._send(method, request, timeout, retry=retry, stub=stub)
        try:
            return await owner._call(method, request, timeout, retry=retry, stub=stub)
        except SessionLogError as error:
            if not is_wrong_group(error):
                raise
            # Refused before anything was done (ownership is checked first): safe to send again.
            again = await self._shards.after_wrong_group(session, error, owner)
            if again is None:
                raise
            return await again._call(method, request, timeout, retry=retry, stub=stub)

    async def _send(
        self, method: str, request: Any, timeout: float | None, *, retry: bool, stub: str = LOG
    ) -> Any:
        """See ``Client._send``."""
        retries = self.connection.retry
        backoff = retries.backoff()
        hops = waits = 0
        write = method in WRITES
        while True:
            member = await self._router.pick_async()
            if member is None:  # no primary known yet (etcd named none): wait and ask again
                delay = backoff.next()
                if delay is None:
                    raise self._router.nobody()
                await asyncio.sleep(delay)
                continue
            session = c.session_of(request)
            metadata = self.connection.call_metadata(session)
            try:
                call = getattr(member.stubs[stub], method)(
                    request,
                    timeout=self.connection.deadline(timeout),
                    metadata=self._router.write_metadata(metadata, session) if write else metadata,
                    wait_for_ready=self.connection.wait_for_ready or None,
                )
                reply = await call
                member.reached = True
                if write:
                    self._router.accepted(member, await call.trailing_metadata(), session)
                return reply
            except LeadershipLost:  # acknowledged by a deposed member: not an acknowledgement
                delay = backoff.next() if retry else None
                if delay is None:
                    raise
            except grpc.RpcError as error:
                step = self._router.after(
                    member, error, retry=retry, hops=hops, deadline_moves=retry, session_id=session
                )
                if step is Step.AGAIN:
                    hops += 1
                    continue
                waits += replicas_unavailable(error)
                if waits > retries.replicas_retries:
                    step = Step.RAISE
                budget = move_budget(error, retries)
                delay = None if step is Step.RAISE else backoff.next(budget)
                if delay is None:
                    raise to_error(error) from error
            await asyncio.sleep(delay)

    # -- the log ----------------------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Iterable[EventLike],
        *,
        expected_seq: int | None = None,
        request_id: str | None = None,
        lease_holder: str = "",
        lease_token: int = 0,
        lenient: bool = False,
        title: str | None = None,
        expected_uid: str = "",
        timeout: float | None = None,
    ) -> pb.AppendResponse:
        """See :meth:`Client.append`: retried on UNAVAILABLE with one request_id."""
        rid = c.new_request_id() if request_id is None else request_id
        request = c.append_request(
            session_id,
            events,
            expected_seq=expected_seq,
            request_id=rid,
            lease_holder=lease_holder,
            lease_token=lease_token,
            lenient=lenient,
            title=title,
            expected_uid=expected_uid,
        )
        reply: pb.AppendResponse = await self._call("Append", request, timeout, retry=bool(rid))
        return reply

    def append_stream(self, *, timeout: float | None = None) -> AsyncAppendStream:
        """Appends pipelined on one stream (see ``Client.append_stream``)::

        async with client.append_stream() as stream:
            first = stream.append_nowait("demo", [event("user_message", {"content": "a"})])
            second = stream.append_nowait("demo", [event("user_message", {"content": "b"})])
            print((await first).next_seq, (await second).next_seq)  # 1 2
        """
        return AsyncAppendStream(self, timeout)

    def since(
        self, session_id: str, seq: int = 0, *, timeout: float | None = None
    ) -> AsyncEventStream:
        """The stored events from ``seq`` to the end (``async for ev in client.since(...)``)."""
        return self._stream(session_id, seq, follow=False, timeout=timeout)

    def follow(
        self, session_id: str, seq: int = 0, *, heartbeat: float | None = c.DEFAULT_FOLLOW_HEARTBEAT
    ) -> AsyncEventStream:
        """Stored events from ``seq``, then live ones, resuming after drops and dead links (see
        Client.follow, also for ``heartbeat``)."""
        return self._stream(session_id, seq, follow=True, timeout=None, heartbeat=heartbeat)

    def follow_sessions(
        self,
        *,
        prefix: str = "",
        filter: str = "",
        after: int | None = None,
        follow: bool = True,
        heartbeat: float | None = c.DEFAULT_FOLLOW_HEARTBEAT,
    ) -> AsyncSessionsStream:
        """The changes of every session under ``prefix`` matching ``filter``, resumable by
        change-feed position (see ``Client.follow_sessions``)."""
        stream = AsyncSessionsStream(
            self._router,
            self.connection,
            prefix=prefix,
            filter_text=filter,
            after=after,
            follow=follow,
            heartbeat=heartbeat,
        )
        self._follows.add(stream)
        return stream

    def _stream(
        self,
        session_id: str,
        seq: int,
        *,
        follow: bool,
        timeout: float | None,
        heartbeat: float | None = None,
    ) -> AsyncEventStream:
        c.whole("seq", seq)  # refused at the call, not at the first read of the stream
        if self._shards is not None:
            stream: AsyncEventStream = _AsyncShardedStream(
                self._shards,
                self,
                session_id,
                seq,
                follow=follow,
                timeout=timeout,
                heartbeat=heartbeat,
            )
            self._streams.add(stream)
            return stream
        stream = AsyncEventStream(
            self._router,
            self.connection,
            session_id,
            seq,
            follow=follow,
            timeout=timeout,
            heartbeat=heartbeat,
        )
        self._streams.add(stream)
        return stream

    async def surface(
        self, session_id: str, *, at_seq: int | None = None, timeout: float | None = None
    ) -> pb.SurfaceResponse:
        """The model-visible events in order (as when the log ended at ``at_seq``, if given)."""
        reply: pb.SurfaceResponse = await self._call(
            "Surface", c.surface_request(session_id, at_seq), timeout, retry=True
        )
        return reply

    async def get_state(
        self, session_id: str, *, at_seq: int | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """The session's state (every event's state_delta folded in seq order) as a dict, after
        the whole log or as it was when the log ended at ``at_seq``.

        >>> await client.get_state("demo")
        {'user': 'ann'}
        """
        return (await self.get_state_with_count(session_id, at_seq=at_seq, timeout=timeout))[0]

    async def get_state_with_count(
        self, session_id: str, *, at_seq: int | None = None, timeout: float | None = None
    ) -> tuple[dict[str, Any], int]:
        """The state as a dict and the number of events it folds (``event_count``)."""
        reply: pb.GetStateResponse = await self._call(
            "GetState", c.state_request(session_id, at_seq), timeout, retry=True
        )
        return struct_to_dict(reply.state), reply.event_count

    async def get_usage(
        self,
        session_id: str,
        *,
        at_seq: int | None = None,
        include_descendants: bool = False,
        timeout: float | None = None,
    ) -> pb.GetUsageResponse:
        """The session's token usage totals per model (``reply.usage``; ``usage_to_dict`` makes a
        dict of them), over the whole log or events 0..``at_seq``. ``reply.own_usage`` leaves
        out what a fork copied from its parent; ``include_descendants`` adds the own usage of
        every fork taken of the session (and of those), counting copied events once.

        >>> usage_to_dict((await client.get_usage("demo")).usage)
        {'gpt-5': {'input_tokens': 1200, 'output_tokens': 80, ...}}
        """
        request = c.usage_request(session_id, at_seq, include_descendants)
        reply: pb.GetUsageResponse = await self._call("GetUsage", request, timeout, retry=True)
        return reply

    async def derive_messages(
        self,
        session_id: str,
        *,
        at_seq: int | None = None,
        known: pb.DeriveMessagesResponse | None = None,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> pb.DeriveMessagesResponse:
        """The derived messages, with ``seqs[i]`` the seq that ``messages[i]`` came from.

        Pass an earlier reply as ``known`` to get only what was added since: the reply then has
        ``incremental = True`` and its messages extend the earlier ones, unless a replace
        happened since (``incremental = False``: the full list).

        With ``page_size`` (at most 1000), only the last ``page_size`` messages, and a
        ``next_page_token`` to pass as ``page_token`` for the ones before them (the view stays
        as the first page saw it). The server reads the log backwards, not all of it.
        """
        request = c.derive_request(session_id, at_seq, known, page_size, page_token)
        reply: pb.DeriveMessagesResponse = await self._call(
            "DeriveMessages", request, timeout, retry=True
        )
        return reply

    async def last_messages(
        self,
        session_id: str,
        n: int,
        *,
        at_seq: int | None = None,
        timeout: float | None = None,
    ) -> pb.DeriveMessagesResponse:
        """The last ``n`` derived messages (fewer when the view has fewer), in order, with their
        seqs; ``next_page_token`` continues before them (``derive_messages(page_token=...)``).
        Costs the events from the end back to the first of them, whatever the log's length.
        """
        c.last_page_size(n, 0)
        held = await self.derive_messages(
            session_id, at_seq=at_seq, page_size=max(1, min(n, c.MAX_PAGE_SIZE)), timeout=timeout
        )
        if n == 0:
            del held.messages[:], held.seqs[:]
            held.next_page_token = ""
        while len(held.messages) < n and held.next_page_token:
            size = c.last_page_size(n, len(held.messages))
            older = await self.derive_messages(
                session_id,
                at_seq=at_seq,
                page_size=size,
                page_token=held.next_page_token,
                timeout=timeout,
            )
            held = c.prepend_page(held, older)
        return held

    async def list_events(
        self,
        session_id: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        order_by: str = "seq",
        timeout: float | None = None,
    ) -> pb.ListEventsResponse:
        """One page of stored events: oldest first (``order_by="seq"``) or newest first
        (``"seq desc"``), ``page_size`` of them (0: 100; at most 1000). Pass the reply's
        ``next_page_token`` as ``page_token`` for the next page; newest first stays pinned to
        the log as the first page saw it."""
        request = c.list_events_request(session_id, page_size, page_token, order_by)
        reply: pb.ListEventsResponse = await self._call("ListEvents", request, timeout, retry=True)
        return reply

    async def last_events(
        self, session_id: str, n: int, *, timeout: float | None = None
    ) -> list[Event]:
        """The last ``n`` stored events (fewer when the log is shorter), in seq order: newest
        first pages read backwards, ``n`` reads whatever the log's length."""
        c.last_page_size(n, 0)
        newest: list[Event] = []
        token = ""
        while len(newest) < n:
            size = c.last_page_size(n, len(newest))
            page = await self.list_events(
                session_id, page_size=size, page_token=token, order_by="seq desc", timeout=timeout
            )
            newest.extend(page.events)
            token = page.next_page_token
            if not token:
                break
        return newest[::-1]

    async def hide(
        self,
        session_id: str,
        start_seq: int,
        stop_seq: int,
        *,
        reason: str | None = None,
        expected_seq: int | None = None,
        expected_uid: str = "",
        timeout: float | None = None,
    ) -> pb.AppendResponse:
        """Hide the surface positions [start_seq, stop_seq] (inclusive) from the view, adding no
        message (see :meth:`Client.hide`)."""
        return await self.append(
            session_id,
            [c.hide_event(start_seq, stop_seq, reason)],
            expected_seq=expected_seq,
            expected_uid=expected_uid,
            timeout=timeout,
        )

    async def pop_last(
        self, session_id: str, *, reason: str | None = "pop_last", timeout: float | None = None
    ) -> c.Popped | None:
        """Hide the newest message of the view and return it with its seq (see
        :meth:`Client.pop_last`)."""
        while True:
            shown = await self.surface(session_id, timeout=timeout)
            where = c.newest_position(shown)
            if where is None:
                return None
            derived = await self.derive_messages(
                session_id, at_seq=shown.event_count - 1, timeout=timeout
            )
            try:
                await self.hide(
                    session_id,
                    where,
                    where,
                    reason=reason,
                    expected_seq=shown.event_count,
                    timeout=timeout,
                )
            except SeqConflict:
                continue
            return c.popped(shown, derived)

    async def clear(
        self, session_id: str, *, reason: str | None = "clear", timeout: float | None = None
    ) -> pb.AppendResponse | None:
        """Hide every message so far (see :meth:`Client.clear`)."""
        while True:
            length = (await self.surface(session_id, timeout=timeout)).event_count
            if length == 0:
                return None
            try:
                return await self.hide(
                    session_id, 0, length - 1, reason=reason, expected_seq=length, timeout=timeout
                )
            except SeqConflict:
                continue

    async def chat_messages(
        self,
        session_id: str,
        *,
        at_seq: int | None = None,
        extra: bool = False,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """The derived messages as OpenAI chat-format dicts, ready for a model API."""
        reply = await self.derive_messages(session_id, at_seq=at_seq, timeout=timeout)
        return messages_to_dicts(reply.messages, extra=extra)

    # -- sessions ---------------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        events: Iterable[EventLike] = (),
        *,
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str | None = None,
        title: str = "",
        labels: Mapping[str, str] | None = None,
        owner: str = "",
        status: str = "",
        parent_session_id: str = "",
        parent_seq: int | None = None,
        ttl: float | dt.timedelta | None = None,
        expire_time: TimeLike | None = None,
        pinned: bool = False,
        timeout: float | None = None,
    ) -> pb.CreateSessionResponse:
        """Create a session with its first events atomically (``SessionAlreadyExists`` if any),
        with its title, labels, owner and status; ``parent_session_id`` (and the ``parent_seq``
        of the tool call that spawned it) makes it a sub-agent child, which starts empty.
        ``ttl`` (seconds or a timedelta) or ``expire_time`` makes the server delete it then,
        unless it is ``pinned`` (README "Retention").

        Retried on UNAVAILABLE with one ``request_id`` (made when None), so a retry after a
        lost reply gets the first result; ``request_id=""`` for no idempotency and no retry.
        """
        rid = c.new_request_id() if request_id is None else request_id
        record = c.SessionFields(
            title,
            labels,
            owner,
            status,
            parent_session_id,
            parent_seq,
            ttl=ttl,
            expire_time=expire_time,
            pinned=pinned,
        )
        request = c.create_request(session_id, events, lease_holder, lease_token, rid, record)
        reply: pb.CreateSessionResponse = await self._call(
            "CreateSession", request, timeout, retry=bool(rid)
        )
        return reply

    async def seed_session(
        self,
        session_id: str,
        messages: Iterable[MessageLike],
        *,
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> pb.SeedSessionResponse:
        """Create a session from chat messages (Message protos or chat-format dicts)."""
        rid = c.new_request_id() if request_id is None else request_id
        request = c.seed_request(session_id, messages, lease_holder, lease_token, rid)
        reply: pb.SeedSessionResponse = await self._call(
            "SeedSession", request, timeout, retry=bool(rid)
        )
        return reply

    async def get_session(
        self, session_id: str, *, timeout: float | None = None
    ) -> pb.GetSessionResponse:
        """Describe a session (``session.exists`` is False for one never written)."""
        request = pb.GetSessionRequest(session_id=session_id)
        reply: pb.GetSessionResponse = await self._call("GetSession", request, timeout, retry=True)
        return reply

    async def list_sessions(
        self,
        *,
        prefix: str = "",
        page_size: int = 0,
        filter: str = "",
        order_by: str = "",
        with_state: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[pb.ListSessionsResponse]:
        """Every page of sessions in id order (``async for page in client.list_sessions()``);
        ``with_state``: each session's state (``Session.state``, as ``get_state`` returns it)
        in the same call (SESSION_VIEW_FULL)."""
        token, size = "", page_size
        while True:
            request = c.list_request(size, token, prefix, filter, order_by, with_state)
            try:
                page: pb.ListSessionsResponse = await self._call(
                    "ListSessions", request, timeout, retry=True
                )
            except ResponseTooLarge:
                smaller = c.smaller_listing_page(size, with_state)
                if smaller is None:
                    raise
                size = smaller  # the same token, a page of fewer sessions
                continue
            yield page
            token = page.next_page_token
            if not token:
                return

    async def list_lease_audit(
        self, *, prefix: str = "", page_size: int = 0, timeout: float | None = None
    ) -> AsyncIterator[apb.ListLeaseAuditResponse]:
        """Every page of the lease audit across sessions (see ``Client.list_lease_audit``)."""
        token = ""
        while True:
            request = apb.ListLeaseAuditRequest(
                page_size=c.checked_page_size(page_size), page_token=token, prefix=prefix
            )
            page: apb.ListLeaseAuditResponse = await self._call(
                "ListLeaseAudit", request, timeout, retry=True, stub=ADMIN
            )
            yield page
            token = page.next_page_token
            if not token:
                return

    async def update_session(
        self,
        session_id: str,
        *,
        title: str = c.UNSET,
        labels: Mapping[str, str] = c.UNSET,
        owner: str = c.UNSET,
        status: str = c.UNSET,
        set_labels: Mapping[str, str] | None = None,
        remove_labels: Iterable[str] = (),
        ttl: float | dt.timedelta = c.UNSET,
        expire_time: TimeLike | None = c.UNSET,
        pinned: bool = c.UNSET,
        timeout: float | None = None,
    ) -> pb.Session:
        """Set the fields given, and only those (the update mask names exactly them):
        ``labels`` replaces the whole map, ``set_labels`` / ``remove_labels`` change single
        keys; ``ttl`` expires the session that long from now, ``expire_time`` at a time (None:
        never), ``pinned`` pins or unpins it. Returns the session as updated.
        ``SessionNotFound`` for a session never written.
        Retried on UNAVAILABLE: setting the same values twice is the same update."""
        request = c.update_request(
            session_id,
            title,
            labels,
            owner,
            status,
            set_labels,
            remove_labels,
            ttl=ttl,
            expire_time=expire_time,
            pinned=pinned,
        )
        reply: pb.UpdateSessionResponse = await self._call(
            "UpdateSession", request, timeout, retry=True
        )
        return reply.session

    async def children(self, session_id: str, *, timeout: float | None = None) -> list[pb.Session]:
        """The sub-agent children and forks of a session, in id order (every page)."""
        quoted = session_id.replace("\\", "\\\\").replace('"', '\\"')
        found: list[pb.Session] = []
        async for page in self.list_sessions(filter=f'parent = "{quoted}"', timeout=timeout):
            found.extend(page.sessions)
        return found

    async def fork_session(
        self,
        parent_session_id: str,
        *,
        at_seq: int | None = None,
        session_id: str = "",
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> pb.ForkSessionResponse:
        """Copy events 0..``at_seq`` of a session into a new one (id generated when empty).

        Retried like :meth:`create_session`: the request_id is kept on the parent, so a retry
        returns the first child (the same generated id), never a second one.
        """
        rid = c.new_request_id() if request_id is None else request_id
        request = c.fork_request(
            parent_session_id, at_seq, session_id, lease_holder, lease_token, rid
        )
        reply: pb.ForkSessionResponse = await self._call(
            "ForkSession", request, timeout, retry=bool(rid)
        )
        return reply

    async def import_session(
        self,
        session_id: str,
        events: Iterable[EventLike] = (),
        *,
        first_seq: int = 0,
        create_time: TimeLike | None = None,
        last_append_time: TimeLike | None = None,
        parent_session_id: str = "",
        parent_event_count: int = 0,
        record: pb.Session | None = None,
        timeout: float | None = None,
    ) -> pb.ImportSessionResponse:
        """Write one chunk of a session as it was elsewhere: events keep their seqs and
        times, the chunk that creates the session (``first_seq`` 0) sets its create time and fork
        parent; ``record`` (a Session, as GetSession returns it) keeps its title, labels, owner,
        status, parent_seq and update time. Later chunks continue at the session's next seq
        (``ImportSeqMismatch`` otherwise, naming it); a session not made by an import is
        ``SessionAlreadyExists``. Not retried: a chunk written before a lost reply is refused when
        sent again, and the error's ``next_seq`` says where to go on.

        >>> when = "2024-01-01T00:00:00Z"
        >>> reply = await client.import_session("copy", [{"type": "user_message", "time": when}])
        >>> reply.imported_count
        1
        """
        request = c.import_request(
            session_id,
            events,
            first_seq,
            create_time,
            last_append_time,
            parent_session_id,
            parent_event_count,
            record,
        )
        reply: pb.ImportSessionResponse = await self._call(
            "ImportSession", request, timeout, retry=False
        )
        return reply

    # -- the writer lease -------------------------------------------------------------------------

    async def acquire_lease(
        self,
        session_id: str,
        holder: str,
        *,
        ttl: float | dt.timedelta | None = None,
        timeout: float | None = None,
    ) -> pb.AcquireLeaseResponse:
        """Take the session's writer lease for ``ttl`` seconds (server default 30 s)."""
        request = pb.AcquireLeaseRequest(session_id=session_id, holder=holder, ttl=c.duration(ttl))
        reply: pb.AcquireLeaseResponse = await self._call(
            "AcquireLease", request, timeout, retry=True
        )
        return reply

    async def renew_lease(
        self,
        session_id: str,
        holder: str,
        *,
        ttl: float | dt.timedelta | None = None,
        timeout: float | None = None,
    ) -> pb.RenewLeaseResponse:
        """Extend a held lease (``LeaseLost`` if it was taken over or released)."""
        request = pb.RenewLeaseRequest(session_id=session_id, holder=holder, ttl=c.duration(ttl))
        reply: pb.RenewLeaseResponse = await self._call("RenewLease", request, timeout, retry=True)
        return reply

    async def release_lease(
        self,
        session_id: str,
        holder: str,
        *,
        force: bool = False,
        timeout: float | None = None,
    ) -> pb.ReleaseLeaseResponse:
        """Give the lease up (``force=True``: an operator releasing another holder's lease)."""
        request = pb.ReleaseLeaseRequest(session_id=session_id, holder=holder, force=force)
        reply: pb.ReleaseLeaseResponse = await self._call(
            "ReleaseLease", request, timeout, retry=False
        )
        return reply

    # -- erasure ----------------------------------------------------------------------------------

    async def delete_session(
        self,
        session_id: str,
        *,
        expected_seq: int | None = None,
        lease_holder: str = "",
        force: bool = False,
        reason: str = "",
        timeout: float | None = None,
    ) -> pb.DeleteSessionResponse:
        """``Client.delete_session``: erase a session for good (not retried)."""
        request = c.delete_request(session_id, expected_seq, lease_holder, force, reason)
        reply: pb.DeleteSessionResponse = await self._call(
            "DeleteSession", request, timeout, retry=False
        )
        return reply

    async def redact_events(
        self,
        session_id: str,
        seqs: Iterable[int],
        *,
        reason: str = "",
        lease_holder: str = "",
        timeout: float | None = None,
    ) -> pb.RedactEventsResponse:
        """``Client.redact_events``: erase the data of events ``seqs`` (retried: idempotent)."""
        request = c.redact_request(session_id, seqs, reason, lease_holder)
        reply: pb.RedactEventsResponse = await self._call(
            "RedactEvents", request, timeout, retry=True
        )
        return reply

    # -- replication ------------------------------------------------------------------------------

    async def replication_status(
        self, *, timeout: float | None = None
    ) -> rpb.GetReplicationStatusResponse:
        """The server's role, change-feed positions and, on a replica, its link to the primary
        (see ``Client.replication_status``)."""
        request = rpb.GetReplicationStatusRequest()
        reply: rpb.GetReplicationStatusResponse = await self._call(
            "GetReplicationStatus", request, timeout, retry=True, stub=REPLICATION
        )
        return reply
