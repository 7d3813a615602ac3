"""The blocking client: one method per RPC, exceptions from the server's own vocabulary."""

# Generated from _aio.py by client/python/gen_sync.py (make gen-client): edit _aio.py, not
# this file. Only the docstrings and the members gen_sync.HAND_WRITTEN names are kept from
# here when it is generated again.

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from sessionlog_client import _common as c
from sessionlog_client import _etcd
from sessionlog_client import _sync_io as io
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


class EventStream(Iterator[Event]):
    """Events of one session from a seq on, one at a time, surviving dropped connections.

    Returned by :meth:`Client.since` and :meth:`Client.follow`. When the stream fails with
    UNAVAILABLE (the server restarted or shut down, the connection dropped) or another end of the
    transport (UNKNOWN "Stream removed" or INTERNAL with no ErrorInfo: a proxy lost the member
    behind the stream, or a reloaded proxy's old process stopped; a proxy's HTTP 502/503/504),
    or a follow stream hears nothing, not even a heartbeat, for ``DEAD_AFTER_HEARTBEATS`` of the
    intervals it asked for (a dead link), it reconnects by itself and asks for ``next_seq``, the
    seq after the last event it delivered: no event is skipped and none is delivered twice. It
    gives up (raising ``Unavailable``) only after the client's ``Retry.give_up_after`` seconds
    without an answer.

    Stop it with ``close()`` (safe from another thread), by leaving a ``with`` block, or by
    breaking out of the loop; closing the client closes it too.

    Attributes:
        session_id: the session read.
        next_seq: the seq of the next event this stream will deliver.
        caught_up: True once a follow stream has delivered every event stored when it opened.
        reconnects: how many times it reconnected.
        dead_streams: how many of those followed a silence (the stream deemed dead).
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
        self._closed = threading.Event()
        self._lock = io.call_guard()
        self._call: Any = None
        self._batches = self._run_batches()
        self._events = self._run()

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        return self._events.__next__()

    def batches(self) -> Iterator[Sequence[Event]]:
        """The same events a response at a time, in seq order (``for batch in
        stream.batches()``): a whole read costs one step per response instead of one per event.

        Reconnects as the event iterator does; read a stream either way, not both.
        """
        return self._batches

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def cancel(self) -> None:
        """Stop the stream without waiting: a pending ``__next__`` ends with StopIteration."""
        self._closed.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def close(self) -> None:
        """End the stream: a blocked ``next()`` (in any thread) stops with StopIteration."""
        self.cancel()
        with contextlib.suppress(io.GENERATOR_RUNNING):  # a read elsewhere: the cancel ends it
            self._events.close()
        with contextlib.suppress(io.GENERATOR_RUNNING):
            self._batches.close()

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

    def _run(self) -> Generator[Event, None, None]:
        for batch in self._batches:
            for event in batch:
                self.next_seq = event.seq + 1
                yield event

    def _run_batches(self) -> Generator[Sequence[Event], None]:
        backoff = self._connection.retry.backoff()
        hops = 0
        while True:
            if self._closed.is_set():
                return
            member = self._router.pick()
            if member is None:  # no primary known yet (etcd named none): wait and ask again
                wait = backoff.next()
                if wait is None:
                    raise self._router.nobody()
                io.pause(self._closed, wait)
                continue
            call = self._open(member)
            if call is None:
                return
            reader = io.Reader(call, self._silence, self._closed)
            delay: float | None = None
            try:
                while True:
                    response = reader.read()
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
            io.pause(self._closed, delay)
            if self._closed.is_set():
                return
            self.reconnects += 1


class SessionsStream(Iterator[pb.FollowedChange]):
    """The changes of every followed session (``Client.follow_sessions``), one at a time, in
    the server's change-feed order, surviving dropped connections like ``EventStream``: after
    UNAVAILABLE, another end of the transport (as ``EventStream``) or a dead link it
    reconnects and asks for the changes after ``position``, the last position the server sent
    (heartbeats included), so no change is skipped or repeated. It sends that position's
    checksum too: a server whose change there is another (restored from an older backup and
    written since, or another store) raises HistoryDiverged instead of resuming in the middle
    of another history.

    Each item is a ``FollowedChange``: ``session_id``, ``position``, ``events`` (a redaction's
    rewritten events are sent again, redacted) and ``deleted``.

    Attributes:
        position: the change-feed position read to; pass it as ``after`` to resume elsewhere.
        checksum: the server's checksum of the change at ``position`` (empty inside a batch).
        caught_up: True once the changes stored when it opened were delivered.
        reconnects: how many times it reconnected.
    """

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
        self._closed = threading.Event()
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

    def __iter__(self) -> SessionsStream:
        return self

    def __next__(self) -> pb.FollowedChange:
        return self._changes.__next__()

    def __enter__(self) -> SessionsStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def cancel(self) -> None:
        """Stop the stream without waiting: a pending ``__next__`` ends with StopIteration."""
        self._closed.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def close(self) -> None:
        """End the stream: a blocked ``next()`` (in any thread) stops with StopIteration."""
        self.cancel()
        with contextlib.suppress(io.GENERATOR_RUNNING):
            self._changes.close()
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

    def _run(self) -> Generator[pb.FollowedChange, None, None]:
        backoff = self._connection.retry.backoff()
        hops = 0
        while not self._closed.is_set():
            if self._pending is not None:
                (member, call), self._pending = self._pending, None
            else:
                picked = self._router.pick()
                if picked is None:
                    wait = backoff.next()
                    if wait is None:
                        raise self._router.nobody()
                    io.pause(self._closed, wait)
                    continue
                member, call = picked, self._open(picked)
            if call is None:
                return
            reader = io.Reader(call, self._silence, self._closed)
            delay: float | None = None
            try:
                while True:
                    response = reader.read()
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
            io.pause(self._closed, delay)
            if self._closed.is_set():
                return
            self.reconnects += 1


class _ShardedStream(EventStream):
    """An EventStream over the group that owns its session: on WRONG_GROUP (the session's slot
    moved to another group, or the map the client routed by was old) it goes on from
    ``next_seq`` on the owner the client then finds, once per refusal with no event between."""

    def __init__(
        self,
        shards: _Shards,
        bootstrap: Client,
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

    def _use(self, client: Client) -> None:
        self._group_client = client
        self._router = client._router
        self._connection = client.connection

    def _run_batches(self) -> Generator[Sequence[Event], None]:
        self._use(self._shards.client_for(self.session_id))  # the map loads at the first read
        rerouted_at: int | None = None
        while True:
            inner = super()._run_batches()
            try:
                for batch in inner:
                    yield batch
                return
            except SessionLogError as error:
                if not is_wrong_group(error) or rerouted_at == self.next_seq:
                    raise
                owner = self._shards.after_wrong_group(self.session_id, error, self._group_client)
                if owner is None:
                    raise
                rerouted_at = self.next_seq
                self._use(owner)
            finally:
                inner.close()


class _Shards:
    """The shard map a client routes by and one client per group (see ``_shards``)."""

    def __init__(self, bootstrap: Client, source: str, make: Any, timeout: float) -> None:
        self._bootstrap = bootstrap
        self._etcd = () if source == SERVER else _etcd.parse_cluster(source)
        self._make = make
        self._timeout = timeout
        self._lock = threading.Lock()
        self.table: ShardTable | None = None
        self._loaded = False
        self._clients: dict[tuple[str, tuple[str, ...]], Client] = {}

    def load(self) -> ShardTable | None:
        """The map routed by (read at the first call); None: unsharded, one group."""
        with self._lock:
            return self._load()

    def _load(self) -> ShardTable | None:
        if not self._loaded:
            self.table = self._read(self._bootstrap)
            self._loaded = True
        return self.table

    def client_for(self, session_id: str) -> Client:
        """The client of the group that owns ``session_id`` (the bootstrap one, unsharded)."""
        with self._lock:
            table = self._load()
            if table is None:
                return self._bootstrap
            return self._client_of(table.owner(session_id))

    def after_wrong_group(
        self, session_id: str, error: SessionLogError, refused_by: Client
    ) -> Client | None:
        """Where to send a call again after ``refused_by`` answered WRONG_GROUP: the owner in
        a newer map (read from the server that refused, which holds one), else the owner the
        error names; None when neither names another group."""
        with self._lock:
            try:
                newer = self._read(refused_by)
            except (SessionLogError, ShardMapInvalid):  # a damaged map: the error's word
                newer = None
            table, owner = after_wrong_group(self.table, newer, session_id, error.metadata)
            self.table = table if table is not None else self.table
            if owner is None:
                return None
            client = self._client_of(owner)
            return None if client is refused_by else client

    def _client_of(self, group: ShardGroup) -> Client:
        key = (group.name, tuple(sorted(set(group.addresses))))
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = self._make(list(group.addresses))
        return client

    def _read(self, client: Client) -> ShardTable | None:
        if self._etcd:
            value = _etcd.read_key(self._etcd, _etcd.SHARDS_KEY, self._timeout, "the shard map")
            return None if value is None else ShardTable.from_json(value)
        reply = client._call("GetShardMap", pb.GetShardMapRequest(), None, retry=True)
        return ShardTable.from_reply(reply)

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.close()


class AppendStream:
    """Appends pipelined on one AppendStream call (``Client.append_stream``).

    ``append_nowait`` sends an append at once, without waiting for the ones before it, and
    returns a ``concurrent.futures.Future``: its result is the ``AppendResponse`` ``append``
    returns, once the append is durable; a refused append raises the same error class
    ``append`` raises (SeqConflict, LeaseHeld...), and the stream goes on. The server applies
    the appends in the order they were sent, so a chain of ``expected_seq`` values holds however
    many are in flight, and it reads at most its ``--append-stream-window`` unanswered ones
    (gRPC's flow control then holds the sender back).

    Leaving ``with`` (or ``close()``) waits for every outcome; an exception leaving it cancels
    the call instead. If the call itself ends (the server stops: UNAVAILABLE), every unanswered
    append fails with that error and may or may not have been written: send it again with its
    request_id (each append gets one unless you give it) and it is never written twice. Nothing
    is resent by itself. A client with a shard map refuses it (ValueError): use one client per
    group.

    Epochs, as for ``append``: the call opens with the first append and carries the highest
    epoch the client has seen (of that append's group), so a deposed primary refuses every
    append NOT_PRIMARY and writes nothing; the server's epoch, named in the stream's headers,
    is learnt before any reply. An append acknowledged by a server below the epoch seen when
    its reply arrives fails with LeadershipLost (``committed``: send it again with its
    request_id). A NOT_PRIMARY reply fails its append (a stream stays on its server) and points
    the client at the primary it names, unless that server is deposed: then at the next
    address; the next stream, or call, goes there. A call that ends UNAVAILABLE moves the
    client on as a unary call's would.
    """

    def __init__(self, client: Client, timeout: float | None) -> None:
        self._client = client
        self._timeout = timeout
        self._member: Member | None = None
        self._pipe: io.AppendPipe | None = None
        self._opening = io.call_guard()
        """Held while the first append opens the call (appends from several threads)."""

    def __enter__(self) -> AppendStream:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()

    def open(self) -> None:
        """Open the call on the member writes go to now (``with`` does it)."""
        client = self._client
        if client._shards is not None:
            raise ValueError(
                "append_stream sends every append to one server group; with a shard map, use "
                "one client per group (or append)"
            )
        member = client._router.pick()
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
        """Send one append at once, with ``Client.append``'s arguments; the future's result is
        its ``AppendResponse`` (or it raises the append's error). Returns before the reply."""
        if self._member is None:
            raise RuntimeError("open the append stream first: with client.append_stream()")
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

    def close(self) -> None:
        """Send no more; return once every append sent has its outcome."""
        if self._pipe is not None:
            self._pipe.close()

    def cancel(self) -> None:
        """End the call now; the appends still unanswered fail with Cancelled."""
        if self._pipe is not None:
            self._pipe.cancel()


class Client:
    """A blocking sessionlog client (thread-safe; share one per process).

    Example::

        from sessionlog_client import Client, event

        with Client("127.0.0.1:50051") as client:
            client.append("demo", [event("user_message", {"content": "What is LMDB?"})])
            for message in client.chat_messages("demo"):
                print(message["role"], message["content"])

    A group (a primary and its replicas)::

        Client(["10.0.0.1:50051", "10.0.0.2:50051"])          # any order: it finds the primary
        Client(cluster="etcd://10.0.0.9:2379", group="main")  # the leader named in etcd

    Args:
        target: ``HOST:PORT`` of the server (or a gRPC target with a scheme, ``dns:///``,
            ``unix:``; a bare host is a ValueError: gRPC would dial port 443), or a list of the
            addresses of a group's members. Given a list (or ``cluster``), the client sends
            every call to the member it takes for the primary, follows NOT_PRIMARY hints, and
            moves to the next address when the one it uses is down (see
            ``sessionlog_client._routing``); appends carry a request id, so a retry on the new
            primary never writes twice. None: ``127.0.0.1:50051`` unless ``cluster`` is given.
        cluster: ``etcd://HOST:PORT[,HOST:PORT...]``, etcd endpoints whose JSON gateway says
            which member leads ``group`` (the key ``/sessionlog/groups/GROUP/leader``); read
            at the first call and again whenever the primary is lost.
        group: the group's name in etcd (with ``cluster``).
        timeout: default deadline of each unary call, in seconds (None: no deadline). Streams
            have no deadline unless ``since(..., timeout=...)`` sets one.
        token: sent as ``authorization: Bearer TOKEN`` on every call. Use it with TLS: on a
            plaintext channel the token crosses the network in the clear.
        tls: use TLS with the system's root certificates (implied by any certificate argument).
        root_certificates: PEM bytes or a file path of the CA to trust instead of the system's.
        private_key, certificate_chain: PEM bytes or file paths of a client certificate (mTLS).
        server_name: the name to check the server's certificate against, when it differs from
            the target's host.
        max_message_bytes: the largest message sent or accepted; keep it at least the server's
            ``--max-message-size`` (default 64 MiB here, 4 MiB on the server).
        retry: how long UNAVAILABLE is retried (appends, reads, stream reconnects).
        metadata: extra ``(key, value)`` pairs sent on every call.
        options: extra gRPC channel options.
        connect_timeout: seconds a connection attempt may take (TCP, TLS and HTTP/2 set-up)
            before it counts as failed. Until the server has answered once, a failed
            connection (refused, unknown host, timed out) raises ``Unavailable`` naming the
            address at once instead of being retried: a wrong address fails fast.
        wait_for_ready: gRPC's wait-for-ready instead: every call waits for a connection up to
            its deadline and UNAVAILABLE is retried from the first call on (for a worker that
            may start before its server).
        shard_map: route by the cluster's shard map (sessions over several groups, see
            ``sessionlog_client._shards``): ``"server"`` loads it with GetShardMap from
            ``target``, ``"etcd://HOST:PORT[,...]"`` from etcd's ``/sessionlog/shards``; each
            call that names a session then goes to its owner group's primary (one client per
            group, with every option above), and a ``WRONG_GROUP`` refusal reloads the map (or
            takes the owner the refusal names) and sends the call there once more. ListSessions
            and the replication calls go to ``target``. None (default): no routing by slot.

    Every method raises the server's exception classes (``sessionlog_client.errors``, the same
    names and reasons as the server's ``sessionlog.errors``) with the ErrorInfo metadata in
    ``error.metadata``; see ``sessionlog_client._status`` for transport failures. Among them:
    ``NotPrimary`` (``.primary``, ``.epoch``), ``LeadershipLost`` (``.committed``) and
    ``ReplicasUnavailable`` (``.needed``, ``.counted``, ``.position``: committed locally, so a
    retry with the same request id is safe; appends retry it ``Retry.replicas_retries`` times).

    The client remembers the highest leadership epoch a server named (``epoch``) and never
    takes a member that answers with a lower one for the primary (see ``_routing``).
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
        self._streams: weakref.WeakSet[EventStream] = weakref.WeakSet()
        self._follows: weakref.WeakSet[SessionsStream] = weakref.WeakSet()
        self._shards: _Shards | None = None
        if shard_map is not None:

            def group_client(addresses: list[str]) -> Client:
                client = Client(
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
            self._shards = _Shards(self, shard_map, group_client, connect_timeout)

    def _open_member(self, address: str) -> tuple[grpc.Channel, dict[str, Any]]:
        conn = self.connection
        if conn.secure:
            channel = grpc.secure_channel(
                address, conn.credentials(), options=conn.channel_options()
            )
        else:
            channel = grpc.insecure_channel(address, options=conn.channel_options())
        stubs = {
            LOG: pb_grpc.SessionLogServiceStub(channel),  # type: ignore[no-untyped-call]
            REPLICATION: rpb_grpc.ReplicationServiceStub(channel),  # type: ignore[no-untyped-call]
            ADMIN: apb_grpc.AdminServiceStub(channel),  # type: ignore[no-untyped-call]
        }
        return channel, stubs

    @property
    def channel(self) -> grpc.Channel:
        """The gRPC channel to the current member (the only one, given one address), for the
        server's other services (health, reflection, replication); send
        ``connection.call_metadata()`` with each call for the token."""
        member = self._router.pick()
        if member is None:
            raise self._router.nobody()
        channel: grpc.Channel = member.channel
        return channel

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

    @property
    def shard_map(self) -> ShardTable | None:
        """The shard map calls are routed by (``shard_map=...``; loaded at the first use), None
        without routing or from an unsharded server."""
        return None if self._shards is None else self._shards.load()

    def close(self) -> None:
        """Close every open stream, then every channel."""
        for stream in list(self._streams):
            stream.close()
        for followed in list(self._follows):
            followed.close()
        if self._shards is not None:
            self._shards.close()
        for channel in self._router.channels():
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(
        self, method: str, request: Any, timeout: float | None, *, retry: bool, stub: str = LOG
    ) -> Any:
        """One RPC: to the session's owner group with ``shard_map``, else through the router."""
        session = c.session_of(request) if self._shards is not None else ""
        if self._shards is None or not session:
            return self._send(method, request, timeout, retry=retry, stub=stub)
        owner = self._shards.client_for(session)
        if owner is self:
            return self._send(method, request, timeout, retry=retry, stub=stub)
        try:
            return owner._call(method, request, timeout, retry=retry, stub=stub)
        except SessionLogError as error:
            if not is_wrong_group(error):
                raise
            # Refused before anything was done (ownership is checked first): safe to send again.
            again = self._shards.after_wrong_group(session, error, owner)
            if again is None:
                raise
            return again._call(method, request, timeout, retry=retry, stub=stub)

    def _send(
        self, method: str, request: Any, timeout: float | None, *, retry: bool, stub: str = LOG
    ) -> Any:
        """One RPC through the router (see ``_routing``): hints, moves, epochs, retries."""
        retries = self.connection.retry
        backoff = retries.backoff()
        hops = waits = 0
        write = method in WRITES
        while True:
            member = self._router.pick()
            if member is None:  # no primary known yet (etcd named none): wait and ask again
                delay = backoff.next()
                if delay is None:
                    raise self._router.nobody()
                time.sleep(delay)
                continue
            session = c.session_of(request)
            metadata = self.connection.call_metadata(session)
            try:
                reply, call = getattr(member.stubs[stub], method).with_call(
                    request,
                    timeout=self.connection.deadline(timeout),
                    metadata=self._router.write_metadata(metadata, session) if write else metadata,
                    wait_for_ready=self.connection.wait_for_ready or None,
                )
                member.reached = True
                if write:
                    self._router.accepted(member, call.trailing_metadata(), session)
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
            time.sleep(delay)

    # -- the log ----------------------------------------------------------------------------------

    def append(
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
        """Append events (Event protos or dicts for :func:`event_from_dict`) as one atomic batch.

        The append is retried on UNAVAILABLE with the same ``request_id`` (a fresh one is made
        when None is given), so the server writes it at most once whatever the retries; pass
        ``request_id=""`` for no idempotency and no retry. ``expected_seq`` fails the append
        with ``SeqConflict`` (``error.metadata["next_seq"]``) unless the first event gets that
        seq; ``expected_uid`` fails it with ``SessionUidMismatch`` unless the session is the one
        that uid names (``reply.session_uid`` of an earlier write: a session deleted and written
        again has another). ``title`` sets the session's title in the same commit as the events.

        >>> reply = client.append("demo", [event("user_message", {"content": "hi"})])
        >>> reply.events[0].seq, reply.next_seq
        (0, 1)
        """
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
        reply: pb.AppendResponse = self._call("Append", request, timeout, retry=bool(rid))
        return reply

    def append_stream(self, *, timeout: float | None = None) -> AppendStream:
        """Appends pipelined on one AppendStream call: many in flight at once, each answered on
        its own once durable (see :class:`AppendStream`). Faster than ``append`` when a worker
        writes many appends without needing each reply before sending the next::

            with client.append_stream() as stream:
                futures = [
                    stream.append_nowait("demo", [event("user_message", {"content": text})])
                    for text in ("a", "b", "c")
                ]
            print([future.result().next_seq for future in futures])  # [1, 2, 3]

        ``timeout``: a deadline for the whole stream in seconds (None: none).
        """
        return AppendStream(self, timeout)

    def since(self, session_id: str, seq: int = 0, *, timeout: float | None = None) -> EventStream:
        """The stored events from ``seq`` (inclusive) to the end, then stop.

        >>> [e.seq for e in client.since("demo", 1)]
        [1, 2]
        """
        return self._stream(session_id, seq, follow=False, timeout=timeout)

    def follow(
        self, session_id: str, seq: int = 0, *, heartbeat: float | None = c.DEFAULT_FOLLOW_HEARTBEAT
    ) -> EventStream:
        """The stored events from ``seq``, then every new event as it commits, until closed.

        Survives server restarts, dropped connections and dead links with no gap and no
        duplicate::

            with client.follow("demo", seq=0) as events:
                for ev in events:
                    handle(ev)
                    if done:
                        break

        ``heartbeat``: the seconds between the heartbeats the server is asked for while the
        session is idle; a stream that hears nothing for three of them is deemed dead and
        resumed. None: the server's own interval, and no such deadline.
        """
        return self._stream(session_id, seq, follow=True, timeout=None, heartbeat=heartbeat)

    def follow_sessions(
        self,
        *,
        prefix: str = "",
        filter: str = "",
        after: int | None = None,
        follow: bool = True,
        heartbeat: float | None = c.DEFAULT_FOLLOW_HEARTBEAT,
    ) -> SessionsStream:
        """The events of every session under ``prefix`` (and matching the ListSessions
        ``filter``), change by change in commit order, resumable by change-feed position::

            with client.follow_sessions(prefix="team-a.", after=saved) as changes:
                for change in changes:
                    route(change.session_id, change.events)
                    saved = change.position

        ``after``: None starts with what commits from now on (the call opens here, not at
        the first read, so nothing committed in between is missed); 0 replays the whole feed
        first; N resumes after position N (a ``FollowedChange.position`` or the stream's
        ``position``, which heartbeats advance too). ``follow=False`` stops once the changes
        stored at the start were delivered. A token limited to a session prefix follows its
        own sessions only. A sharded server streams its own group's sessions: follow each
        group (a client per group) with a position per group.
        """
        stream = SessionsStream(
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
    ) -> EventStream:
        c.whole("seq", seq)  # refused at the call, not at the first read of the stream
        if self._shards is not None:
            stream: EventStream = _ShardedStream(
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
        stream = EventStream(
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

    def surface(
        self, session_id: str, *, at_seq: int | None = None, timeout: float | None = None
    ) -> pb.SurfaceResponse:
        """The model-visible events in order (as when the log ended at ``at_seq``, if given)."""
        reply: pb.SurfaceResponse = self._call(
            "Surface", c.surface_request(session_id, at_seq), timeout, retry=True
        )
        return reply

    def get_state(
        self, session_id: str, *, at_seq: int | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """The session's state (every event's state_delta folded in seq order) as a dict, after
        the whole log or as it was when the log ended at ``at_seq``.

        >>> client.get_state("demo")
        {'user': 'ann'}
        """
        return self.get_state_with_count(session_id, at_seq=at_seq, timeout=timeout)[0]

    def get_state_with_count(
        self, session_id: str, *, at_seq: int | None = None, timeout: float | None = None
    ) -> tuple[dict[str, Any], int]:
        """The state as a dict and the number of events it folds (``event_count``)."""
        reply: pb.GetStateResponse = self._call(
            "GetState", c.state_request(session_id, at_seq), timeout, retry=True
        )
        return struct_to_dict(reply.state), reply.event_count

    def get_usage(
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

        >>> usage_to_dict((client.get_usage("demo")).usage)
        {'gpt-5': {'input_tokens': 1200, 'output_tokens': 80, ...}}
        """
        request = c.usage_request(session_id, at_seq, include_descendants)
        reply: pb.GetUsageResponse = self._call("GetUsage", request, timeout, retry=True)
        return reply

    def derive_messages(
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
        reply: pb.DeriveMessagesResponse = self._call(
            "DeriveMessages", request, timeout, retry=True
        )
        return reply

    def last_messages(
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
        held = self.derive_messages(
            session_id, at_seq=at_seq, page_size=max(1, min(n, c.MAX_PAGE_SIZE)), timeout=timeout
        )
        if n == 0:
            del held.messages[:], held.seqs[:]
            held.next_page_token = ""
        while len(held.messages) < n and held.next_page_token:
            size = c.last_page_size(n, len(held.messages))
            older = self.derive_messages(
                session_id,
                at_seq=at_seq,
                page_size=size,
                page_token=held.next_page_token,
                timeout=timeout,
            )
            held = c.prepend_page(held, older)
        return held

    def list_events(
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
        reply: pb.ListEventsResponse = self._call("ListEvents", request, timeout, retry=True)
        return reply

    def last_events(self, session_id: str, n: int, *, timeout: float | None = None) -> list[Event]:
        """The last ``n`` stored events (fewer when the log is shorter), in seq order: newest
        first pages read backwards, ``n`` reads whatever the log's length."""
        c.last_page_size(n, 0)
        newest: list[Event] = []
        token = ""
        while len(newest) < n:
            size = c.last_page_size(n, len(newest))
            page = self.list_events(
                session_id, page_size=size, page_token=token, order_by="seq desc", timeout=timeout
            )
            newest.extend(page.events)
            token = page.next_page_token
            if not token:
                break
        return newest[::-1]

    def hide(
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
        message: one EVENT_TYPE_HIDE event, kept in the log with the events it hides. Only
        events appended before it are hidden; ``stop_seq`` may run past the end.

        >>> client.hide("demo", 1, 2).next_seq
        5
        """
        return self.append(
            session_id,
            [c.hide_event(start_seq, stop_seq, reason)],
            expected_seq=expected_seq,
            expected_uid=expected_uid,
            timeout=timeout,
        )

    def pop_last(
        self, session_id: str, *, reason: str | None = "pop_last", timeout: float | None = None
    ) -> c.Popped | None:
        """Hide the newest message of the view and return it with its seq; None when the view
        is empty (nothing is written then).

        Safe under concurrency: the hide is appended with ``expected_seq`` set to the length of
        the log it read, so a message appended (or popped) by someone else meanwhile makes it
        read again rather than hide the wrong message or a second one.
        """
        while True:
            shown = self.surface(session_id, timeout=timeout)
            where = c.newest_position(shown)
            if where is None:
                return None
            derived = self.derive_messages(
                session_id, at_seq=shown.event_count - 1, timeout=timeout
            )
            try:
                self.hide(
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

    def clear(
        self, session_id: str, *, reason: str | None = "clear", timeout: float | None = None
    ) -> pb.AppendResponse | None:
        """Hide every message so far (one hide over [0, last seq]); messages appended later
        show as usual. None, writing nothing, for a session with no events; a concurrent
        append makes it read the length again, so the hide covers all it saw and no more."""
        while True:
            length = self.surface(session_id, timeout=timeout).event_count
            if length == 0:
                return None
            try:
                return self.hide(
                    session_id, 0, length - 1, reason=reason, expected_seq=length, timeout=timeout
                )
            except SeqConflict:
                continue

    def chat_messages(
        self,
        session_id: str,
        *,
        at_seq: int | None = None,
        extra: bool = False,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """The derived messages as OpenAI chat-format dicts, ready for a model API.

        >>> client.chat_messages("demo")
        [{'role': 'user', 'content': 'hi'}]
        """
        reply = self.derive_messages(session_id, at_seq=at_seq, timeout=timeout)
        return messages_to_dicts(reply.messages, extra=extra)

    # -- sessions ---------------------------------------------------------------------------------

    def create_session(
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
        reply: pb.CreateSessionResponse = self._call(
            "CreateSession", request, timeout, retry=bool(rid)
        )
        return reply

    def seed_session(
        self,
        session_id: str,
        messages: Iterable[MessageLike],
        *,
        lease_holder: str = "",
        lease_token: int = 0,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> pb.SeedSessionResponse:
        """Create a session from chat messages (Message protos or chat-format dicts).

        >>> client.seed_session("copy", [{"role": "user", "content": "hi"}]).session.event_count
        1
        """
        rid = c.new_request_id() if request_id is None else request_id
        request = c.seed_request(session_id, messages, lease_holder, lease_token, rid)
        reply: pb.SeedSessionResponse = self._call("SeedSession", request, timeout, retry=bool(rid))
        return reply

    def get_session(
        self, session_id: str, *, timeout: float | None = None
    ) -> pb.GetSessionResponse:
        """Describe a session (``session.exists`` is False for one never written)."""
        request = pb.GetSessionRequest(session_id=session_id)
        reply: pb.GetSessionResponse = self._call("GetSession", request, timeout, retry=True)
        return reply

    def list_sessions(
        self,
        *,
        prefix: str = "",
        page_size: int = 0,
        filter: str = "",
        order_by: str = "",
        with_state: bool = False,
        timeout: float | None = None,
    ) -> Iterator[pb.ListSessionsResponse]:
        """Every page of sessions in id order, fetching the next page as you iterate.

        >>> [s.session_id for page in client.list_sessions(prefix="de") for s in page.sessions]
        ['demo']
        """
        token, size = "", page_size
        while True:
            request = c.list_request(size, token, prefix, filter, order_by, with_state)
            try:
                page: pb.ListSessionsResponse = self._call(
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

    def list_lease_audit(
        self, *, prefix: str = "", page_size: int = 0, timeout: float | None = None
    ) -> Iterator[apb.ListLeaseAuditResponse]:
        """Every page of the lease audit of every session (or of those whose id starts with
        ``prefix``): takeovers and forced releases, each with its session id, in session id
        order, fetching the next page as you iterate. Needs an admin token without a session
        prefix.

        >>> [(e.session_id, e.entry.actor) for p in client.list_lease_audit() for e in p.entries]
        [('demo', 'new-worker')]
        """
        token = ""
        while True:
            request = apb.ListLeaseAuditRequest(
                page_size=c.checked_page_size(page_size), page_token=token, prefix=prefix
            )
            page: apb.ListLeaseAuditResponse = self._call(
                "ListLeaseAudit", request, timeout, retry=True, stub=ADMIN
            )
            yield page
            token = page.next_page_token
            if not token:
                return

    def update_session(
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
        reply: pb.UpdateSessionResponse = self._call("UpdateSession", request, timeout, retry=True)
        return reply.session

    def children(self, session_id: str, *, timeout: float | None = None) -> list[pb.Session]:
        """The sub-agent children and forks of a session, in id order (every page)."""
        quoted = session_id.replace("\\", "\\\\").replace('"', '\\"')
        found: list[pb.Session] = []
        for page in self.list_sessions(filter=f'parent = "{quoted}"', timeout=timeout):
            found.extend(page.sessions)
        return found

    def fork_session(
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
        reply: pb.ForkSessionResponse = self._call("ForkSession", request, timeout, retry=bool(rid))
        return reply

    def import_session(
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
        >>> client.import_session("copy", [{"type": "user_message", "time": when}]).imported_count
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
        reply: pb.ImportSessionResponse = self._call("ImportSession", request, timeout, retry=False)
        return reply

    # -- the writer lease -------------------------------------------------------------------------

    def acquire_lease(
        self,
        session_id: str,
        holder: str,
        *,
        ttl: float | dt.timedelta | None = None,
        timeout: float | None = None,
    ) -> pb.AcquireLeaseResponse:
        """Take the session's writer lease for ``ttl`` seconds (server default 30 s).

        >>> lease = client.acquire_lease("demo", "worker-1", ttl=30).lease
        >>> client.append("demo", [...], lease_holder="worker-1", lease_token=lease.token)
        """
        request = pb.AcquireLeaseRequest(session_id=session_id, holder=holder, ttl=c.duration(ttl))
        reply: pb.AcquireLeaseResponse = self._call("AcquireLease", request, timeout, retry=True)
        return reply

    def renew_lease(
        self,
        session_id: str,
        holder: str,
        *,
        ttl: float | dt.timedelta | None = None,
        timeout: float | None = None,
    ) -> pb.RenewLeaseResponse:
        """Extend a held lease (``LeaseLost`` if it was taken over or released)."""
        request = pb.RenewLeaseRequest(session_id=session_id, holder=holder, ttl=c.duration(ttl))
        reply: pb.RenewLeaseResponse = self._call("RenewLease", request, timeout, retry=True)
        return reply

    def release_lease(
        self,
        session_id: str,
        holder: str,
        *,
        force: bool = False,
        timeout: float | None = None,
    ) -> pb.ReleaseLeaseResponse:
        """Give the lease up (``force=True``: an operator releasing another holder's lease)."""
        request = pb.ReleaseLeaseRequest(session_id=session_id, holder=holder, force=force)
        reply: pb.ReleaseLeaseResponse = self._call("ReleaseLease", request, timeout, retry=False)
        return reply

    # -- erasure ----------------------------------------------------------------------------------

    def delete_session(
        self,
        session_id: str,
        *,
        expected_seq: int | None = None,
        lease_holder: str = "",
        force: bool = False,
        reason: str = "",
        timeout: float | None = None,
    ) -> pb.DeleteSessionResponse:
        """Erase a session for good: its events, request records, lease and lease audit, on the
        primary and its replicas (an audit record without content stays). ``SessionNotFound``
        when it is not stored; ``LeaseHeld`` while another holder's lease lives, unless
        ``force`` (an admin token). Not retried: a retry after a lost reply would find nothing
        and raise ``SessionNotFound``."""
        request = c.delete_request(session_id, expected_seq, lease_holder, force, reason)
        reply: pb.DeleteSessionResponse = self._call("DeleteSession", request, timeout, retry=False)
        return reply

    def redact_events(
        self,
        session_id: str,
        seqs: Iterable[int],
        *,
        reason: str = "",
        lease_holder: str = "",
        timeout: float | None = None,
    ) -> pb.RedactEventsResponse:
        """Erase the data and state_delta of events ``seqs`` (their seq, type, time and
        surface_op stay; ``Event.redacted`` marks them). Retried like a read: redacting an
        event again changes nothing. The reply's ``seqs`` are those this call redacted."""
        request = c.redact_request(session_id, seqs, reason, lease_holder)
        reply: pb.RedactEventsResponse = self._call("RedactEvents", request, timeout, retry=True)
        return reply

    # -- replication ------------------------------------------------------------------------------

    def replication_status(
        self, *, timeout: float | None = None
    ) -> rpb.GetReplicationStatusResponse:
        """The server's role, change-feed positions and, on a replica, its link to the primary
        (state, lag, connected, history ids, detail). Needs a token without a session prefix."""
        request = rpb.GetReplicationStatusRequest()
        reply: rpb.GetReplicationStatusResponse = self._call(
            "GetReplicationStatus", request, timeout, retry=True, stub=REPLICATION
        )
        return reply
