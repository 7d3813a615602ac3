"""Replication: the change feed a primary serves, and the loop a replica runs to follow it.

    writers ──Append──▶ primary ──ReplicationService.Changes (follow)──▶ replica ──▶ readers
                          │ one change record per commit,                  │ applies each batch
                          │ position dense from 1                          │ verbatim in one commit,
                          ▼                                                ▼ position included
                        LMDB                                             LMDB (byte-identical)

A replica resumes from its own newest stored position + 1, so after a crash or restart it
neither skips nor repeats a change: the position is committed in the same transaction as the
data. It reconnects with capped exponential backoff, serves every read, and refuses writes with
NOT_PRIMARY naming its primary.

A replica never mixes two histories. On connect it names the checksum of its newest change, and
the primary refuses the stream (HISTORY_DIVERGED) unless its own change there is the same; and
every record the replica applies must chain from the replica's previous one. When either check
fails, the replica stops applying, reports DIVERGED (status, health NOT_SERVING, a log line with
the reason) and waits to be resynced (`sessionlog replica resync`).

A primary deposed by a newer epoch says so on every frame of its feed, naming the new primary
when it knows it (``ChangesResponse.fenced_epoch``, ``new_primary``). Its replicas then apply
nothing more from it and turn to the new primary by themselves: one whose data is on the new
primary's history (the new primary accepts its position and checksum, the check every connect
makes) follows it from its own next position; one that holds records the new primary never had
(it went past the point where the two histories part) is refused, reports DIVERGED and waits
for `sessionlog replica rejoin --primary NEW`.

A link can die without a word (a partition, a stopped primary, a proxy that keeps both sockets
open): TCP then reports nothing for hours. So a replica asks for heartbeats at a third of its
``timeout_seconds`` and deems the stream dead when no frame at all arrives for that long; gRPC
keepalive on its channel is the second line, for the transport under it. While disconnected its
status says so, with the primary position it last heard, never one it guessed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from sessionlog import errors, mirrors, wire
from sessionlog.cluster.sync import SyncTracker
from sessionlog.defaults import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_REPLICA_TIMEOUT_SECONDS
from sessionlog.service.convert import decode
from sessionlog.service.errors import abort
from sessionlog.service.follow import follow, heartbeat_interval
from sessionlog.service.limits import Outgoing, StreamLimiter
from sessionlog.service.notifier import Notifier
from sessionlog.storage import leadership
from sessionlog.storage.changes import FEED_KEY, ReceivedChange
from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb

log = logging.getLogger(__name__)

_CHANGES_FIELD = rpb.ChangesResponse.DESCRIPTOR.fields_by_name["changes"].number

SERVICE_NAME = "sessionlog.v1.ReplicationService"
CHANGES_METHOD = f"/{SERVICE_NAME}/Changes"
REPORT_PROGRESS_METHOD = f"/{SERVICE_NAME}/ReportProgress"
CHANGES_BATCH_BYTES = 1 << 20
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
REPLICA_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    # Ping the primary after 10 s without a frame (gRPC's advised floor, and at least the
    # server's accepted ping interval, see app.SERVER_KEEPALIVE_OPTIONS); no ack within 5 s
    # closes the transport. A follow stream sends no data after its request, and gRPC stops
    # pinging after two pings without data unless told otherwise.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),  # what gRPC 1.85 times the ping by
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
)


class DeadStream(Exception):
    """The primary sent no frame, not even a heartbeat, within the replica timeout."""


class StaleStream(Exception):
    """The primary's frames carry an older epoch than this replica knows: it was deposed."""


class Deposed(Exception):
    """The primary's frames say a newer epoch deposed it, and name that epoch's primary."""

    def __init__(self, epoch: int, primary: str) -> None:
        super().__init__(f"deposed by epoch {epoch}, led by {primary}")
        self.epoch = epoch
        self.primary = primary


@dataclass
class ReplicaState:
    """What a replica knows about its primary and itself. Event-loop thread only."""

    primary: str
    connected: bool = False
    """True from the first frame of a change stream until that stream ends or goes silent."""
    caught_up: bool = False
    """True from the primary's caught-up marker until the link has been down longer than
    --replica-timeout (``link_down_too_long``): then false until a new stream catches up."""
    last_frame_at: float = 0.0
    """time.monotonic() of the last frame heard from the primary (0: none yet)."""
    primary_position: int = 0
    """The head position the primary reported last: not the largest ever seen (a primary
    restored from a backup reports less), and not updated while disconnected."""
    primary_commit_ns: int = 0
    applied_position: int = 0
    applied_commit_ns: int = 0
    last_contact_ns: int = 0
    primary_history_id: str = ""
    diverged: bool = False
    """Set once the replica found its data is not on the primary's history; it applies nothing
    more (until resynced) and is never reported as caught up."""
    detail: str = ""
    """Why the replica is not streaming, for people: what diverged, the last connection error,
    or the silence that made it drop the stream. Cleared on the next frame (unless diverged)."""
    note: str = ""
    """What the folder's last rejoin discarded (``storage.rebuild``): the status detail while
    there is nothing more pressing to say."""

    def link_down_too_long(self, timeout_seconds: float) -> bool:
        """Disconnected, and nothing heard from the primary for over ``timeout_seconds``."""
        return not self.connected and time.monotonic() - self.last_frame_at > timeout_seconds

    @property
    def lag_positions(self) -> int:
        return max(0, self.primary_position - self.applied_position)

    @property
    def replication_state(self) -> rpb.ReplicationState:
        if self.diverged:
            return rpb.REPLICATION_STATE_DIVERGED
        if not self.connected:
            return rpb.REPLICATION_STATE_DISCONNECTED
        if self.lag_positions:
            return rpb.REPLICATION_STATE_CATCHING_UP
        return rpb.REPLICATION_STATE_STREAMING

    @property
    def lag_ns(self) -> int:
        if self.lag_positions == 0:
            return 0
        return max(0, self.primary_commit_ns - self.applied_commit_ns)


class ReplicationServicer:
    """ReplicationService: the change feed and the replication status."""

    def __init__(
        self,
        store: Store,
        notifier: Notifier,
        *,
        replica: ReplicaState | None = None,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        streams: StreamLimiter | None = None,
        sync: SyncTracker | None = None,
        cluster: Callable[[], rpb.ClusterStatus] | None = None,
    ) -> None:
        self.store = store
        self.notifier = notifier
        self.replica = replica
        self.sync = sync
        self.cluster = cluster
        """A cluster member's view of its group (``cluster.member``), for the status."""
        """The replicas' reported progress (ReportProgress), which --ack replica waits on."""
        self._reporting: set[asyncio.Task[Any]] = set()
        """The handlers of open ReportProgress streams (ended by ``end_reports``)."""
        self.heartbeat_seconds = heartbeat_seconds
        self.streams = streams or StreamLimiter()

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Changes": grpc.unary_stream_rpc_method_handler(
                    self.streams.guard(self.changes, subject=lambda raw: "the change feed")
                ),
                "GetReplicationStatus": grpc.unary_unary_rpc_method_handler(self.status),
                "ReportProgress": grpc.stream_unary_rpc_method_handler(self.report_progress),
            },
        )

    def _response(self, changes: list[bytes] | None = None, caught_up: bool = False) -> bytes:
        """A ChangesResponse with the feed's head: stored change records as they are (see
        ``mirrors``), or a caught-up marker or heartbeat. Its epoch is that of the newest epoch
        this feed holds or writes: a fenced primary's stays the one it wrote in, below the
        epoch that deposed it, so that replicas knowing the newer one refuse its feed. A fenced
        primary also names the epoch that deposed it and that epoch's primary on every frame:
        its own replicas, which may not know the newer epoch, learn from it where to turn."""
        position, commit_ns = self.store.head()
        lead = self.store.leadership()
        response = mirrors.ChangesResponse(
            changes=changes or [],
            caught_up=caught_up,
            head_position=position,
            history_id=self.store.history()[0],
            epoch=lead.last_epoch,
        )
        if lead.role == leadership.FENCED:
            response.fenced_epoch, response.new_primary = lead.epoch, lead.primary
        if commit_ns:
            response.head_commit_time.FromNanoseconds(commit_ns)
        encoded: bytes = response.SerializeToString()
        return encoded

    async def changes(self, raw: bytes, context: grpc.aio.ServicerContext) -> Outgoing:
        """Every change from start_position on, in batches; with follow, then live ones."""
        try:
            request = decode(rpb.ChangesRequest, raw)
            await self._learn_epoch(request.epoch, context)
            self.store.check_feed_after(request.start_position, request.after_checksum)
        except errors.SessionLogError as error:
            if isinstance(error, errors.HistoryDiverged):
                log.warning(
                    "refused a change-feed reader that is not on this history",
                    extra={"position": request.start_position - 1, "peer": context.peer()},
                )
            await abort(context, error)
            return

        def read(cursor: int) -> tuple[bytes, int, bool]:
            batch = self.store.read_changes(cursor, CHANGES_BATCH_BYTES)
            if not batch:
                return b"", 0, False
            return self._response(batch), len(batch), True

        def marker(caught_up: bool) -> bytes:
            return self._response(caught_up=caught_up)

        stream = follow(
            functools.partial(abort, context),
            self.notifier,
            key=FEED_KEY,
            subject="the change feed",
            cursor=max(request.start_position, 1),
            live=request.follow,
            heartbeat_seconds=heartbeat_interval(
                request.heartbeat_interval, self.heartbeat_seconds
            ),
            read=read,
            marker=marker,
            pace=self.streams.pace,
        )
        async for response in stream:
            yield response

    async def _learn_epoch(
        self, epoch: int, context: grpc.aio.ServicerContext, who: str = "a change-feed reader"
    ) -> None:
        """A reader (or a replica reporting its progress) that knows a newer epoch than this
        server's: record it durably (a primary stops taking writes at once, see
        ``leadership.fenced``) and refuse the caller with NOT_PRIMARY: this server's feed is not
        the newest history."""
        if epoch <= self.store.leadership().epoch:
            return
        before, after = await asyncio.wrap_future(self.store.submit_fence(epoch, ""))
        if before.may_write:
            log.warning(
                "%s knows a newer epoch: this primary stops taking writes",
                who,
                extra={"epoch": before.epoch, "newer_epoch": epoch, "peer": context.peer()},
            )
        raise leadership.not_primary(after)

    async def report_progress(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        """A replica's durable positions, one report at a time, for as long as it stays."""
        sync = self.sync
        if sync is None:
            await abort(
                context, errors.FailedPrecondition("this server does not track replica progress")
            )
            return b""
        stream = sync.open_stream()
        refusal: errors.SessionLogError | None = None
        handler = asyncio.current_task()
        if handler is not None:
            self._reporting.add(handler)
        try:
            async for raw in requests:
                request = decode(rpb.ReportProgressRequest, raw)
                if not request.replica:
                    raise errors.MalformedRequest(
                        "a progress report must name its replica (ReportProgressRequest.replica)",
                        field="replica",
                    )
                current = self.store.leadership().epoch
                if request.epoch > current:
                    await self._learn_epoch(request.epoch, context, "a replica's progress report")
                sync.report(
                    stream,
                    request.replica,
                    context.peer(),
                    request.position,
                    request.checksum,
                    epoch=request.epoch,
                    current_epoch=current,
                )
        except errors.SessionLogError as error:
            refusal = error
        finally:
            sync.close_stream(stream)
            self._reporting.discard(handler)
        if refusal is not None:
            await abort(context, refusal)
        return _serialized(rpb.ReportProgressResponse())

    def end_reports(self) -> None:
        """Shutting down: end every ReportProgress stream now. A replica's stream stays open
        for as long as the replica does (a stopped one forever), so waiting for it would hold
        the shutdown for its whole grace period."""
        for handler in list(self._reporting):
            handler.cancel()

    async def status(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            decode(rpb.GetReplicationStatusRequest, raw)
        except errors.SessionLogError as error:
            await abort(context, error)
        position, _ = self.store.head()
        lead = self.store.leadership()
        response = rpb.GetReplicationStatusResponse(
            role="primary",
            position=position,
            state=rpb.REPLICATION_STATE_PRIMARY,
            history_id=self.store.history()[0],
            epoch=lead.epoch,
            epoch_history=[
                rpb.EpochStart(epoch=epoch, first_position=first) for epoch, first in lead.history
            ],
        )
        if lead.role == leadership.FENCED:
            response.state = rpb.REPLICATION_STATE_FENCED
            response.primary = lead.primary
            response.detail = leadership.not_primary(lead).message
        if self.sync is not None:
            _sync_status(response, self.sync)
        state = self.replica
        if state is not None:
            # Everything from the ReplicaState, as the metrics read it, so the two agree.
            response.primary_history_id = state.primary_history_id
            response.role = "replica"
            response.primary = state.primary
            response.primary_position = state.primary_position
            response.lag_positions = state.lag_positions
            response.lag.FromNanoseconds(state.lag_ns)
            response.caught_up = state.caught_up and not state.diverged
            response.connected = state.connected
            response.state = state.replication_state
            response.detail = state.detail or state.note
            if state.last_contact_ns:
                response.last_contact_time.FromNanoseconds(state.last_contact_ns)
        if self.cluster is not None:
            _cluster_status(response, self.cluster(), replicating=state is not None)
        serialized: bytes = response.SerializeToString()
        return serialized


def _cluster_status(
    response: rpb.GetReplicationStatusResponse, group: rpb.ClusterStatus, replicating: bool
) -> None:
    """A cluster member's status: its group's view, and a state that is true of it. A member
    that does not lead takes no writes, whatever its folder's record says (a leader whose lease
    lapsed, a member that knows no leader yet): FENCED, unless it replicates someone."""
    response.cluster.CopyFrom(group)
    if group.role != rpb.CLUSTER_ROLE_LEADER and not replicating:
        response.state = rpb.REPLICATION_STATE_FENCED
        response.primary = group.leader if group.role == rpb.CLUSTER_ROLE_FOLLOWER else ""
        response.detail = group.deposed or response.detail or f"no leader: {group.reason}"
    elif group.deposed:
        response.detail = group.deposed


def _sync_status(response: rpb.GetReplicationStatusResponse, sync: SyncTracker) -> None:
    response.ack = rpb.ACK_MODE_REPLICA if sync.required else rpb.ACK_MODE_LOCAL
    response.sync_replicas = sync.required
    if sync.grouped:
        response.sync_set.extend(sorted(sync.members))
    for replica in sync.replicas():
        entry = response.replicas.add(
            replica=replica.name,
            peer=replica.peer,
            position=replica.position,
            connected=replica.connected,
            counts=replica.counts,
            detail=sync.detail(replica),
            epoch=replica.epoch,
        )
        if replica.report_ns:
            entry.report_time.FromNanoseconds(replica.report_ns)


def _serialized(message: Any) -> bytes:
    encoded: bytes = message.SerializeToString()
    return encoded


class Replicator:
    """Follows a primary's change feed and applies it to the local store, forever."""

    def __init__(
        self,
        store: Store,
        state: ReplicaState,
        on_caught_up: Callable[[], None],
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        timeout_seconds: float = DEFAULT_REPLICA_TIMEOUT_SECONDS,
        on_diverged: Callable[[], None] = lambda: None,
        name: str = "",
    ) -> None:
        self.store = store
        self.name = name
        """What this replica calls itself in its progress reports ("": it sends none)."""
        self._progress: ProgressReports | None = None
        self.state = state
        self.timeout_seconds = timeout_seconds
        self._metadata = metadata
        self._on_caught_up = on_caught_up
        self._on_diverged = on_diverged
        self._channel_factory = channel_factory or _insecure_channel
        self._stopping = False
        self._received = False
        self._known_epoch = 0
        """The highest epoch this replica knows (its leadership record's)."""
        self._deposed_primary = ""
        """The primary this replica followed before it turned to the current one (a deposed
        primary named it), until the new one accepts its position."""

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        backoff = BACKOFF_FIRST_SECONDS
        position, commit_ns = self.store.head()
        self.state.applied_position, self.state.applied_commit_ns = position, commit_ns
        while not self._stopping:
            self._received = False
            try:
                await self._follow_once()
            except asyncio.CancelledError:
                raise
            except errors.HistoryDiverged as error:
                if not self.state.primary_history_id:  # an older primary, which checked nothing
                    self._diverge(error.message)
                    return
                # The primary accepted this replica's position (it checked the checksum there),
                # so a record that then fails to chain was damaged on the primary: not a reason
                # to resync the replica (which would meet the same record again).
                self.state.detail = (
                    f"the primary sent a damaged change ({error.message.split(':')[0]}): its "
                    "record or events do not match their checksum. Run `sessionlog admin verify` "
                    "on the primary and restore it from a backup or a replica"
                )
                self._received = False
                log.error(
                    "the primary's change feed is damaged; applying nothing past it, retrying",
                    extra={"primary": self.state.primary, **error.metadata},
                )
            except grpc.aio.AioRpcError as error:
                info = _error_info(error)
                if info is not None and info.reason == errors.HistoryDiverged.reason:
                    self._learn_head(info.metadata)
                    self._refused_position(error)
                    return
                self.state.detail = f"{error.code().name}: {error.details()}"
                log.warning(
                    "replica lost its primary; reconnecting",
                    extra={"primary": self.state.primary, "code": error.code().name},
                )
            except Deposed as deposed:
                await self._turn_to(deposed)
                self._received = True  # a new primary: start the backoff over
            except StaleStream as error:
                self.state.detail = str(error)
                self._received = False  # keep backing off: it stays deposed for a while
                log.warning(
                    "replica refused a stream from a deposed primary; reconnecting later",
                    extra={"primary": self.state.primary, "why": str(error)},
                )
            except DeadStream as error:
                self.state.detail = str(error)
                log.warning(
                    "replica heard nothing from its primary; reconnecting",
                    extra={"primary": self.state.primary, "silent_seconds": self.timeout_seconds},
                )
            except errors.SessionLogError as error:
                # This replica's own storage refused the changes (a full disk or map, an I/O
                # error): not the link's fault, so no tight reconnect loop and no traceback.
                self.state.detail = f"this replica could not store the changes: {error.message}"
                self._received = False  # keep backing off: retrying at once cannot help
                log.warning(
                    "replica could not apply its primary's changes; retrying",
                    extra={"primary": self.state.primary, "reason": error.reason},
                )
            except Exception as error:
                self.state.detail = f"replication failed: {error}"
                log.exception("replication failed; reconnecting")
            finally:
                self.state.connected = False
            if self._stopping:
                return
            if self._received:  # a stream that worked for a while: start the backoff over
                backoff = BACKOFF_FIRST_SECONDS
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    async def _follow_once(self) -> None:
        """Stream changes until the stream ends (with an error, usually) or goes silent for
        ``timeout_seconds`` (DeadStream; leaving cancels the call and closes the channel, so the
        next attempt opens a new connection rather than reusing a dead one)."""
        channel = self._channel_factory(self.state.primary)
        loop = asyncio.get_running_loop()
        try:
            changes = channel.unary_stream(CHANGES_METHOD)
            position, checksum = self.store.tail()
            self._known_epoch = self.store.leadership().epoch
            if self.name:
                self._progress = ProgressReports(channel, self.name, self._metadata)
                self._progress.report(position, checksum, self._known_epoch)
            request = rpb.ChangesRequest(
                start_position=position + 1,
                follow=True,
                after_checksum=checksum,
                epoch=self._known_epoch,
            )
            request.heartbeat_interval.FromNanoseconds(round(self.timeout_seconds / 3 * 1e9))
            stream = changes(request.SerializeToString(), metadata=self._metadata or None)
            try:
                async with asyncio.timeout(self.timeout_seconds) as silence:
                    async for raw in stream:
                        silence.reschedule(None)  # applying a large batch is not silence
                        await self._handle(raw)
                        silence.reschedule(loop.time() + self.timeout_seconds)
            except TimeoutError:
                raise DeadStream(
                    f"no frame from the primary for {self.timeout_seconds:g} s"
                ) from None
            finally:
                stream.cancel()
        finally:
            progress, self._progress = self._progress, None
            if progress is not None:
                await progress.close()
            await channel.close()

    def _contact(self) -> None:
        if not self.state.connected:
            self.state.connected = True
            self.state.detail = ""
            log.info("replica connected", extra={"primary": self.state.primary})
        self._received = True

    async def _turn_to(self, deposed: Deposed) -> None:
        """Follow the primary that deposed this one's (durably: writes refused here name it),
        from this replica's own next position: the new primary checks that position's
        checksum on connect, so a replica that went past where the histories part is refused
        there (``_refused_position``) and applies nothing of the new feed."""
        old, new = self.state.primary, deposed.primary
        try:
            await asyncio.wrap_future(self.store.submit_follow(deposed.epoch, new))
        except errors.SessionLogError as error:  # a full disk, an I/O error: try again later
            self.state.detail = f"this replica could not record its new primary: {error.message}"
            log.warning(
                "replica could not record its new primary; retrying",
                extra={"primary": new, "reason": error.reason},
            )
            return
        self._known_epoch = max(self._known_epoch, deposed.epoch)
        self._deposed_primary = old
        self.state.primary = new
        self.state.detail = (
            f"its primary {old} was deposed by epoch {deposed.epoch}: following the new primary "
            f"{new} from position {self.store.head()[0] + 1}"
        )
        log.warning(
            "replica's primary was deposed by a newer epoch: it follows the new primary",
            extra={
                "old_primary": old,
                "primary": new,
                "epoch": deposed.epoch,
                "position": self.store.head()[0],
            },
        )

    def _refused_position(self, error: grpc.aio.AioRpcError) -> None:
        """The primary refused this replica's position (HISTORY_DIVERGED): resync, or, for a
        replica that turned from a deposed primary, rejoin (it keeps what both share)."""
        old, new = self._deposed_primary, self.state.primary
        if not old:
            self._diverge(f"the primary refused this replica's position: {error.details()}")
            return
        self._diverge(
            f"this replica's old primary {old} was deposed and its data goes past the point "
            f"where {old}'s history and the new primary {new}'s part ({new} refused its "
            f"position {self.store.head()[0]}): it holds records {new} never had. Stop it and run "
            f"`sessionlog replica rejoin --primary {new}` (it keeps what both share and reports "
            f"what it discards), then start it with --replica-of {new}",
            remedy=f"sessionlog replica rejoin --primary {new}",
        )

    async def _handle(self, raw: bytes) -> None:
        rest, payloads = wire.split_field(raw, _CHANGES_FIELD)
        response = rpb.ChangesResponse.FromString(rest)
        state = self.state
        state.last_contact_ns = time.time_ns()
        state.last_frame_at = time.monotonic()
        if response.fenced_epoch:
            await self._deposed(response)
        await self._check_epoch(response.epoch)
        self._contact()  # only once the stream is one to apply: a refused one never connects
        self._deposed_primary = ""  # a primary that takes writes (or a replica) accepted it
        state.primary_position = response.head_position
        state.primary_commit_ns = response.head_commit_time.ToNanoseconds()
        if response.history_id and response.history_id != state.primary_history_id:
            await self._adopt(response.history_id)
        if payloads:
            received = [ReceivedChange.parse(p) for p in payloads]
            applied = await asyncio.wrap_future(self.store.submit_apply(received))
            state.applied_position = applied.last_position
            state.applied_commit_ns = applied.last_commit_ns
            if self._progress is not None:  # committed and synced: the primary may count it
                self._progress.report(
                    applied.last_position, applied.last_checksum, self._known_epoch
                )
        if response.caught_up and not state.caught_up:
            state.caught_up = True
            log.info(
                "replica caught up",
                extra={"primary": state.primary, "position": state.applied_position},
            )
            self._on_caught_up()

    async def _deposed(self, response: rpb.ChangesResponse) -> None:
        """The primary says a newer epoch deposed it: nothing more of its feed is applied.
        Deposed when it names the new primary; otherwise the newer epoch is recorded durably
        (this feed, and any other of an older epoch, is refused from now on) and StaleStream."""
        epoch, new = response.fenced_epoch, response.new_primary
        if new and new != self.state.primary:
            raise Deposed(epoch, new)
        if epoch > self._known_epoch:
            await asyncio.wrap_future(self.store.submit_fence(epoch, ""))
            self._known_epoch = epoch
        raise StaleStream(
            f"the primary {self.state.primary} was deposed by epoch {epoch} and names no new "
            f"primary; its feed (epoch {response.epoch}) is older than epoch "
            f"{self._known_epoch} this replica knows. Applying nothing from it; point this "
            "replica at the current primary (--replica-of)"
        )

    async def _check_epoch(self, epoch: int) -> None:
        """Refuse a stream from an older epoch than this replica knows (StaleStream: nothing of
        it is applied); record a newer one durably, so that an older one is refused later, and
        report it (a primary counts only reports that name its own epoch)."""
        if epoch < self._known_epoch:
            raise StaleStream(
                f"the primary {self.state.primary} sends epoch {epoch}, older than epoch "
                f"{self._known_epoch} this replica knows: it was deposed. Applying nothing from "
                "it; point this replica at the current primary (--replica-of)"
            )
        if epoch > self._known_epoch:
            await asyncio.wrap_future(self.store.submit_fence(epoch, self.state.primary))
            self._known_epoch = epoch
            if self._progress is not None:
                self._progress.learn_epoch(epoch)

    async def _adopt(self, history_id: str) -> None:
        """Take the primary's history id: the primary accepted this replica's position (it
        checked the checksum there before sending anything), so the data here is on it."""
        self.state.primary_history_id = history_id
        mine, _ = self.store.history()
        if mine == history_id:
            return
        position = self.store.head()[0]
        await asyncio.wrap_future(self.store.submit_adopt_history(history_id, position))
        log.info(
            "replica follows its primary's history",
            extra={
                "primary": self.state.primary,
                "history_id": history_id,
                "previous": mine,
                "position": position,
            },
        )

    def _learn_head(self, metadata: Any) -> None:
        """What a primary that refused this replica's position says it holds now."""
        state = self.state
        if metadata.get("head_position", "").isdigit():
            state.primary_position = int(metadata["head_position"])
        if metadata.get("history_id"):
            state.primary_history_id = metadata["history_id"]

    def _diverge(self, why: str, remedy: str = "sessionlog replica resync") -> None:
        state = self.state
        state.diverged, state.caught_up, state.connected = True, False, False
        state.detail = why
        log.error(
            "replica diverged from its primary: applying nothing more until it is mended (%s)",
            remedy,
            extra={"primary": state.primary, "position": self.store.head()[0], "why": why},
        )
        self._on_diverged()


class ProgressReports:
    """A replica's side of ReportProgress on one connection: its newest durable position, sent
    whenever it moves. Sends never hold up applying: ``report`` only notes the newest position,
    and one task writes it (a report still in flight is followed by the newest one only).

    Losing this stream does not stop replication: an older primary without the RPC, or one
    that refused it, only means this replica does not count for its --ack replica."""

    def __init__(
        self, channel: grpc.aio.Channel, name: str, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        self._name = name
        self._call = channel.stream_unary(REPORT_PROGRESS_METHOD)(metadata=metadata or None)
        self._newest: tuple[int, bytes, int] = (0, b"", 0)
        self._moved = asyncio.Event()
        self._task = asyncio.create_task(self._send())

    def report(self, position: int, checksum: bytes, epoch: int) -> None:
        """The replica, knowing ``epoch``, holds every change up to ``position``."""
        self._newest = (position, checksum, epoch)
        self._moved.set()

    def learn_epoch(self, epoch: int) -> None:
        """The replica learned a newer epoch: report its newest position again with it (the
        primary counts only reports naming its own epoch)."""
        position, checksum, _ = self._newest
        self.report(position, checksum, epoch)

    async def _send(self) -> None:
        try:
            while True:
                await self._moved.wait()
                self._moved.clear()
                position, checksum, epoch = self._newest
                request = rpb.ReportProgressRequest(
                    replica=self._name, position=position, checksum=checksum, epoch=epoch
                )
                await self._call.write(request.SerializeToString())
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            # An older primary (UNIMPLEMENTED) waits for no report: worth a note, not a warning.
            level = (
                logging.INFO if error.code() == grpc.StatusCode.UNIMPLEMENTED else logging.WARNING
            )
            log.log(
                level,
                "replica cannot report its progress to its primary; it does not count for the "
                "primary's --ack replica",
                extra={"code": error.code().name, "details": error.details()},
            )
        except Exception as error:  # the call ended under it (the connection went)
            log.info("replica progress reports ended", extra={"error": repr(error)})

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._call.cancel()


def _error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a failed call, if it has one."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    return None


def _insecure_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])
