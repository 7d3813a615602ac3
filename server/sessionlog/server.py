"""The composition root: one running sessionlog server, wired from its parts.

    config ─▶ SessionLogServer ─▶ storage.Store (LMDB, the writer thread)
                               ├▶ service/  gRPC: servicers, auth, limits, replication
                               └▶ web/      HTTP: the console and /metrics

This is the only module that imports both ``service`` and ``web``: the layers below it know
nothing of one another's wiring, and nothing below it imports it. ``sessionlog.testing`` and the
CLI start servers through it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1._async import HealthServicer

from sessionlog import errors
from sessionlog.cluster.promotion import Promoter
from sessionlog.cluster.sync import SyncTracker
from sessionlog.config import SHARD_MAP_ETCD, ConfigError, ServerConfig, replica_token_of
from sessionlog.defaults import DEFAULT_DATA_DIR, DEFAULT_LISTEN
from sessionlog.retention import NS, Policy
from sessionlog.service import app, metrics, purger, sweeper
from sessionlog.service.admin_service import AdminServicer
from sessionlog.service.auth import AuthConfigError, AuthInterceptor, Authorizer, TokenTable
from sessionlog.service.counters import Counters
from sessionlog.service.doorbell import Peers
from sessionlog.service.limits import StreamLimiter
from sessionlog.service.notifier import Notifier
from sessionlog.service.replication import ReplicaState, ReplicationServicer, Replicator
from sessionlog.service.servicer import SessionLogServicer
from sessionlog.service.usecases import SessionLog
from sessionlog.shard import scatter
from sessionlog.shard.ownership import Ownership, from_file
from sessionlog.shard.scatter import Scatter
from sessionlog.shard.shardmap import ShardMapError
from sessionlog.storage import folder, snapshot
from sessionlog.storage.changes import FEED_KEY
from sessionlog.storage.leadership import FENCED, Leadership
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.web.app import HttpSites, ListenError

if TYPE_CHECKING:
    from sessionlog.cluster.member import GroupMember
    from sessionlog.shard.source import EtcdShardMap

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_LISTEN",
    "BindError",
    "ConfigError",
    "RestartInPlace",
    "ServerConfig",
    "SessionLogServer",
    "serve",
    "store_config",
]

log = logging.getLogger(__name__)

WRITE_STALL_SECONDS = 5.0
"""How long the writer may wait in LMDB (the write lock, a commit) before the server says so."""
WRITE_STALL_CHECK_SECONDS = 1.0


class BindError(RuntimeError):
    """The listen address could not be bound (in use, or not an address of this host)."""


class RestartInPlace(Exception):
    """``serve`` stopped the server because it must start again in a fresh process (a cluster
    member deposed with changes of its own rejoins the leader at start-up): the caller
    executes the same command again. The message says why."""


def store_config(config: ServerConfig) -> StoreConfig:
    """What the store needs to know of a server's settings."""
    return StoreConfig(
        map_size=config.map_size,
        durability=config.durability,
        limits=config.limits,
        request_id_ttl_seconds=config.request_id_ttl_seconds,
        replica_of=config.replica_of,
        elected=bool(config.cluster),
    )


class SessionLogServer:
    """One running sessionlog server. ``start`` binds and serves; ``stop`` drains and closes.

    With ``peers`` it is one worker of several sharing the folder and the ports
    (``sessionlog.workers``): it shares the ports, opens the folder its supervisor prepared,
    rings the other workers after each commit and answers their rings."""

    def __init__(
        self,
        config: ServerConfig,
        peers: Peers | None = None,
        may_write: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.may_write = may_write
        """A process-level leadership check for the writer (an election's lease; see
        ``storage.writer``); None: always allowed."""
        self.peers = peers
        self.port = 0
        self.store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._notifier = Notifier()
        self._health = HealthServicer()
        self.counters = Counters()
        """Per-call counts the unary handlers keep, read by the metrics."""
        self.shared_metrics = metrics.SharedMetrics.from_environment()
        """This worker's share of the metrics, when PROMETHEUS_MULTIPROC_DIR names a directory
        (``--workers N``); None for a server on its own."""
        self._publishing: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._purger: asyncio.Task[None] | None = None
        self.streams = StreamLimiter(
            config.max_streams,
            config.max_streams_per_connection,
            notifier=self._notifier,
            send_rate=config.follow_send_rate,
        )
        if peers is not None and peers.counts is not None:
            self.streams.elsewhere = peers.counts.others
            self.streams.published = peers.counts.publish
        self.authorizer: Authorizer | None = None
        self.http_port = 0
        """The web console's bound port (0: off)."""
        self.metrics_port = 0
        """The metrics endpoint's bound port (0: off)."""
        self._http: HttpSites | None = None
        self._stopped = asyncio.Event()
        self.replica: ReplicaState | None = (
            ReplicaState(config.replica_of) if config.replica_of else None
        )
        self._replicator: Replicator | None = None
        self._replicator_task: asyncio.Task[None] | None = None
        self._servicers: tuple[SessionLogServicer, ReplicationServicer, AdminServicer]
        self._serving = False
        """What the gRPC health check says now (``_set_health``), for GET /healthz."""
        self._fenced = False
        """The folder's leadership record says a newer epoch deposed it (see ``_watch_fence``)."""
        self._replication: ReplicationServicer | None = None
        self.sync: SyncTracker | None = None
        """The replicas' reported progress, which every write waits on with --ack replica."""
        self.group: GroupMember | None = _group_member(config)
        """This server's membership of an etcd-elected group (--cluster); None otherwise."""
        self._promoter: Promoter | None = None
        self._writes_stuck = False
        self._progress_due = False
        self.restart_requested = asyncio.Event()
        """Set when this server must start again in a fresh process (see ``RestartInPlace``);
        ``restart_reason`` says why."""
        self.restart_reason = ""
        self.scatter: Scatter | None = None
        """With --shard-map: the cluster-wide session listing (``shard.scatter``)."""
        self.cases: SessionLog | None = None
        """The session log's use cases over the open store, which the gRPC servicer and the
        web console both call (``service.usecases``)."""
        self.ownership = Ownership(sharded=False)
        """Which sessions this server's group owns (--shard-map; set up by ``start``)."""
        self._shard_source: EtcdShardMap | None = None

    async def start(self) -> int:
        """Open the store, bind, and start serving. Returns the bound port."""
        config = self.config
        credentials = app.server_credentials(config)
        # Every worker loads the tokens; one says what is wrong with them, so the log of a
        # server of N workers has each warning once.
        self.authorizer = _authorizer(config, warn=self.peers is None or self.peers.slot == 0)
        replica_token = replica_token_of(config)
        self.ownership = _ownership(config)
        self.ownership.on_change(lambda _: self._notifier.notify_all())  # streams check again
        if self.group is not None:
            await self.group.prepare()  # a deposed folder rejoins before it is opened
        store = self.store = self._open_store()
        if self.peers is None:  # with workers, the supervisor has done it (``_prepare``)
            index_old_sessions(store, config)
        for stale in snapshot.clear_stale(store.path):
            log.warning(
                "removed a snapshot's temporary copy a stopped server left behind",
                extra={"folder": str(stale)},
            )
        self._hold_writes_to_map(store)
        server = app.grpc_server(
            config,
            [AuthInterceptor(self.authorizer)] if self.authorizer else None,
            share_port=self.peers is not None,
        )
        app.add_services(server, self._handlers(store), self._health)
        self.port = _bind(server, config.listen, credentials)
        if self.port == 0:
            store.close()
            raise BindError(
                f"cannot listen on {config.listen}: the address is in use, or is not an "
                "address of this host (another server there? pick another --listen)"
            )
        try:
            await self._start_http()
        except BindError:
            await server.stop(None)
            raise
        await server.start()
        self._server = server
        if self.peers is not None:
            self.peers.listen(store, self._notifier)
        if self.shared_metrics is not None:
            self._publishing = asyncio.create_task(
                metrics.keep_published(self, self.shared_metrics)
            )
        self._watchdog = asyncio.create_task(self._watch_writes(store))
        if self.peers is None or self.peers.slot == 0:  # --workers N: worker 0 sweeps
            self._sweeper = asyncio.create_task(
                sweeper.keep_swept(
                    store,
                    Policy(idle_ns=round(config.retention_idle_seconds * NS)),
                    config.retention_sweep_interval_seconds,
                    may_sweep=lambda: self.takes_writes,
                    ours=lambda session_id: self.ownership.refusal(session_id) is None,
                )
            )
            self._purger = asyncio.create_task(
                purger.keep_purged(store, may_purge=lambda: self.takes_writes)
            )
        if config.shard_map == SHARD_MAP_ETCD and config.cluster_settings is not None:
            from sessionlog.shard.source import EtcdShardMap

            self._shard_source = EtcdShardMap(self.ownership, config.cluster_settings.endpoints)
            self._shard_source.start()
        self._fenced = store.leadership().role == FENCED
        if self.group is not None:
            await self._set_health(serving=False)  # until the election says what this is
            assert self._promoter is not None
            self.group.start(store, self._promoter, _GroupHost(self), self.sync)
        elif self.replica is None:
            await self._set_health(serving=True)
        else:
            # A replica is NOT_SERVING until it has caught up with its primary once.
            await self._set_health(serving=False)
            # The primary it follows: --replica-of, or the one it turned to from there by itself
            # (``leadership.followed``; the open kept it).
            self.replica.primary = store.leadership().primary or self.replica.primary
            self.replica.note = store.rejoin_note()
            if self.replica.note:
                log.warning("this replica rejoined: %s", self.replica.note)
            self._start_replicator(store, self.replica, replica_token)
        self._log_serving(tls=credentials is not None)
        return self.port

    def _hold_writes_to_map(self, store: Store) -> None:
        """With --shard-map: every write is checked against the held map inside its write
        transaction too (a slot frozen for a move takes no write that was checked earlier and
        queued), and a new map counts as settled once the writes queued before it committed."""
        ownership = self.ownership
        if not ownership.sharded:
            return
        store.writer.admits = ownership.refusal
        loop = asyncio.get_running_loop()

        def barrier(done: Callable[[], None]) -> None:
            store.writer.barrier().add_done_callback(lambda _: loop.call_soon_threadsafe(done))

        ownership.barrier = barrier

    def _open_store(self) -> Store:
        """The store, with its commits waking followers and a panic turning health off, both
        on this event loop (the writer thread calls them)."""
        loop = asyncio.get_running_loop()
        notifier = self._notifier
        peers = self.peers

        def wake(session_ids: set[str]) -> None:
            """On the writer thread; followers here are woken on the loop by ``notify``, in
            the same wakeup that hands the loop the commit's replies."""
            if peers is not None:
                peers.ring()
            progress = self.group is not None and FEED_KEY in session_ids
            if progress and not self._progress_due and not loop.is_closed():
                self._progress_due = True
                loop.call_soon_threadsafe(self._note_progress)

        def broken() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._storage_broken)

        config = self.config
        return Store(
            Path(config.data_dir),
            store_config(config),
            on_commit=wake,
            on_broken=broken,
            lock=None if peers is None else peers.lock,
            prepared=peers is not None,
            may_write=self.may_write if self.group is None else self.group.may_write,
            on_loop_commit=(loop, notifier.notify),
        )

    def _note_progress(self) -> None:
        """The feed moved: the cluster member publishes its new progress (one read for every
        commit that happened since the last one)."""
        self._progress_due = False
        if self.group is not None:
            self.group.note_commit()

    def _handlers(self, store: Store) -> tuple[grpc.GenericRpcHandler, ...]:
        config = self.config
        self.sync = SyncTracker(
            store.checksum_at, config.required_replicas, config.sync_timeout_seconds
        )
        servicer = SessionLogServicer(
            store,
            self._notifier,
            max_message_bytes=config.max_message_bytes,
            heartbeat_seconds=config.heartbeat_seconds,
            primary=config.replica_of,
            authorizer=self.authorizer,
            max_events_per_append=config.max_events_per_append,
            append_stream_window=config.append_stream_window,
            streams=self.streams,
            counters=self.counters,
            sync=self.sync,
            ownership=self.ownership,
        )
        self.scatter = scatter.for_ownership(self.ownership, app.replica_channel_factory(config))
        servicer.scatter = self.scatter
        self.cases = servicer.cases
        group = self.group
        if group is not None:
            servicer.refusal = group.refusal
        replication = self._replication = ReplicationServicer(
            store,
            self._notifier,
            replica=self.replica,
            heartbeat_seconds=config.heartbeat_seconds,
            streams=self.streams,
            sync=self.sync,
            cluster=None if group is None else group.status,
        )
        promoter = self._promoter = Promoter(
            store,
            stop_replication=self._stop_replication,
            resume_replication=self._resume_replication,
            promoted=self._promoted,
        )
        admin = AdminServicer(
            store,
            replica=self.replica is not None,
            counters=self.counters,
            max_message_bytes=config.max_message_bytes,
            promoter=promoter,
            elected_in=config.group if group is not None else "",
            authorizer=self.authorizer,
        )
        admin.ownership = self.ownership
        if group is not None:
            admin.role = "member"
        self._servicers = (servicer, replication, admin)
        return servicer.handlers(), replication.handlers(), admin.handlers()

    async def _stop_replication(self) -> None:
        """End the replica's change stream, and wait until nothing more can be applied."""
        if self._replicator is not None and self._replicator_task is not None:
            self._replicator.stop()
            self._replicator_task.cancel()
            await asyncio.gather(self._replicator_task, return_exceptions=True)
        self._replicator = self._replicator_task = None

    def _resume_replication(self) -> None:
        if self.replica is not None and self.store is not None and self._replicator is None:
            self._start_replicator(self.store, self.replica, replica_token_of(self.config))

    async def _promoted(self, record: Leadership) -> None:
        """A promotion committed: this server is the primary from now on (see ``Promoter``)."""
        servicer, replication, admin = self._servicers
        servicer.primary = ""
        replication.replica = None
        admin.role = "primary"
        self.replica = None
        await self._set_health(serving=True)

    async def _follow(self, primary: str) -> None:
        """A cluster member replicates ``primary``: a new replica state, the same folder."""
        await self._stop_replication()
        assert self.store is not None
        state = self.replica = ReplicaState(primary)
        state.note = self.store.rejoin_note()
        _, replication, admin = self._servicers
        replication.replica = state
        admin.role = "replica"
        await self._set_health(serving=False)  # until it has caught up with this leader
        self._start_replicator(self.store, state, replica_token_of(self.config))

    async def _stop_following(self) -> None:
        await self._stop_replication()
        self.replica = None
        _, replication, admin = self._servicers
        replication.replica = None
        admin.role = "member"

    def _restart(self, reason: str) -> None:
        self.restart_reason = reason
        self.restart_requested.set()

    def _start_replicator(self, store: Store, replica: ReplicaState, token: str) -> None:
        config = self.config
        self._replicator = Replicator(
            store,
            replica,
            self._caught_up,
            channel_factory=app.replica_channel_factory(config),
            metadata=_bearer_metadata(token),
            timeout_seconds=config.replica_timeout_seconds,
            on_diverged=self._diverged,
            name=config.advertise if self.group is not None else _replica_name(store),
        )
        self._replicator_task = asyncio.create_task(self._replicator.run())
        if config.serves_open_replica:
            log.warning(
                "this replica serves every tenant's data without tokens "
                "(--replica-serve-open); give it --auth-tokens to require them",
                extra={"primary": config.replica_of},
            )

    def _log_serving(self, tls: bool) -> None:
        config, store, authorizer = self.config, self.store, self.authorizer
        assert store is not None
        log.info(
            "sessionlog serving" if self.peers is None else "worker serving",
            extra={
                "listen": config.listen,
                "port": self.port,
                "data": str(store.path.absolute()),
                "role": "member" if self.group else "replica" if self.replica else "primary",
                **(
                    {"group": config.group, "advertise": config.advertise, "etcd": config.cluster}
                    if self.group
                    else {}
                ),
                "ack": config.ack,
                **({"sync_replicas": config.required_replicas} if config.required_replicas else {}),
                "tls": "mutual" if config.tls_client_ca else "on" if tls else "off",
                "auth": f"{len(authorizer.tokens)} tokens" if authorizer else "off",
                "http": config.http_listen or "off",
                "metrics": config.metrics_listen or "off",
                **({"primary": config.replica_of} if self.replica else {}),
            },
        )

    async def _start_http(self) -> None:
        """Serve the web console and the metrics endpoint when configured (see ``web.app``)."""
        config = self.config
        if not config.http_listen and not config.metrics_listen:
            return
        try:
            self._http = await HttpSites.start(
                self, config.http_listen, config.metrics_listen, share_port=self.peers is not None
            )
        except ListenError as exc:
            if self.store is not None:
                self.store.close()
            raise BindError(str(exc)) from None
        self.http_port, self.metrics_port = self._http.http_port, self._http.metrics_port

    @property
    def notifier(self) -> Notifier:
        return self._notifier

    @property
    def heartbeat_seconds(self) -> float:
        return self.config.heartbeat_seconds

    @property
    def listen(self) -> str:
        return self.config.listen

    @property
    def serving(self) -> bool:
        """SERVING, and (sharded) holding a map with this server's group: a member that cannot
        tell which sessions it owns fails /healthz, so HAProxy sends it nothing."""
        return self._serving and self.ownership.ready

    @property
    def takes_writes(self) -> bool:
        """Serving as the primary (GET /primary): not a replica, and in cluster mode the leader
        with a live lease at the epoch its folder took; a process-level check (--workers'
        election) must allow it too."""
        if not self.serving or self.replica is not None or self.store is None:
            return False
        if not self.store.writer.lead.may_write:
            return False
        if self.group is not None:
            return self.group.may_write()
        return self.may_write is None or self.may_write()

    @property
    def role(self) -> str:
        if self.replica is not None:
            return "replica"
        if self.group is not None and not self.group.may_write():
            return "member"
        return "primary"

    async def _set_health(self, serving: bool) -> None:
        """A store whose LMDB has panicked stays NOT_SERVING whatever else happens, and so
        does a deposed (fenced) primary: its data may lack what the new primary took. A
        cluster member's health is its role's (``GroupMember.serving``), whatever the caller
        thought: SERVING while it leads or replicates the current leader."""
        broken = self.store is not None and self.store.writer.broken is not None
        group = self.group
        if group is not None:
            replica = self.replica
            current = (
                replica is not None
                and replica.caught_up
                and not replica.diverged
                and replica.primary == group.following
            )
            serving = group.serving(current) and not (self._writes_stuck and replica is None)
        self._serving = serving and not broken and not self._fenced
        await app.set_health(self._health, self._serving)

    async def _watch_fence(self, store: Store, writes_stuck: bool) -> None:
        """Follow the leadership record (another worker, or a feed reader, may have fenced the
        folder): a fenced primary turns NOT_SERVING within a check interval, with one line."""
        fenced = store.leadership().role == FENCED
        if fenced == self._fenced:
            return
        self._fenced = fenced
        if fenced:
            log.warning("this primary was fenced by a newer epoch: health is NOT_SERVING")
        await self._set_health(serving=self.replica is None and not writes_stuck)

    def _storage_broken(self) -> None:
        if self._server is not None:
            log.error("the storage engine panicked: restart the server")
            asyncio.get_running_loop().create_task(self._set_health(serving=False))

    async def _watch_writes(self, store: Store) -> None:
        """Say so when the writer has waited in LMDB for WRITE_STALL_SECONDS: for the write
        lock (another process holds it: a frozen worker of this server, or any other
        program writing the folder) or for a commit's sync (a hung disk). A primary is then
        NOT_SERVING until writes move again; one line when it starts, one when it ends."""
        stalled_since: float | None = None
        while True:
            await asyncio.sleep(WRITE_STALL_CHECK_SECONDS)
            await self._watch_fence(store, writes_stuck=stalled_since is not None)
            await self._watch_replica_link()
            stalled = store.writer.stalled
            now = time.monotonic()
            if stalled is not None and now - stalled[1] >= WRITE_STALL_SECONDS:
                if stalled_since is None:
                    stalled_since = stalled[1]
                    self._writes_stuck = True
                    log.error(
                        "writes are stuck: the writer has been %s for %.0f s (is a process "
                        "holding the data folder's write lock stopped or frozen?)",
                        stalled[0],
                        now - stalled[1],
                        extra={"waiting_for": stalled[0]},
                    )
                    if self.replica is None:
                        await self._set_health(serving=False)
            elif stalled_since is not None and (stalled is None or stalled[1] != stalled_since):
                log.warning(
                    "writes move again", extra={"stuck_seconds": round(now - stalled_since, 1)}
                )
                stalled_since = None
                self._writes_stuck = False
                if self.replica is None:
                    await self._set_health(serving=True)

    async def _watch_replica_link(self) -> None:
        """A replica that has heard nothing from its primary for longer than --replica-timeout
        (its link is down) may be any distance behind: NOT_SERVING, with one line, until a new
        stream catches it up again (``_caught_up``), so a balancer stops sending it reads."""
        replica, timeout = self.replica, self.config.replica_timeout_seconds
        if replica is None or not replica.caught_up or not replica.link_down_too_long(timeout):
            return
        replica.caught_up = False
        log.warning(
            "this replica has heard nothing from its primary for over %g s: health is "
            "NOT_SERVING until it catches up again",
            timeout,
            extra={"primary": replica.primary, "detail": replica.detail},
        )
        await self._set_health(serving=False)

    def _caught_up(self) -> None:
        if self._server is not None:
            asyncio.get_running_loop().create_task(self._set_health(serving=True))

    def _diverged(self) -> None:
        """A diverged replica is not current, whatever it served before: NOT_SERVING. A
        cluster member checks its history against the leader's again (it may rejoin)."""
        if self._server is not None:
            asyncio.get_running_loop().create_task(self._set_health(serving=False))
            if self.group is not None:
                self.group.replica_diverged()

    async def stop(self, grace: float | None = None) -> None:
        """Stop: followers end with UNAVAILABLE, in-flight appends finish, LMDB closes."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self._shard_source is not None:
            await self._shard_source.stop()
        if self.group is not None:
            await self.group.stop()  # writes stop, and the lease goes: another member may lead
        for task in (self._watchdog, self._sweeper, self._purger):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._stop_replication()
        await self._health.enter_graceful_shutdown()
        if self.sync is not None:
            self.sync.close()  # writes waiting for replicas fail now, not at their timeout
        if self._replication is not None:
            self._replication.end_reports()
        if self.peers is not None:
            self.peers.close()
        self._notifier.close()
        await server.stop(self.config.shutdown_grace_seconds if grace is None else grace)
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.scatter is not None:
            await self.scatter.close()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        if self._publishing is not None:
            self._publishing.cancel()  # publishes the final numbers on its way out
            await asyncio.gather(self._publishing, return_exceptions=True)
        self._stopped.set()
        log.info("sessionlog stopped")

    async def wait(self) -> None:
        await self._stopped.wait()


async def serve(
    config: ServerConfig, peers: Peers | None = None, on_started: Callable[[], None] | None = None
) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully. ``on_started`` runs once serving.
    RestartInPlace once stopped because the server must start again in a fresh process."""
    server = SessionLogServer(config, peers)
    await server.start()
    if on_started is not None:
        on_started()
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    waits = [
        asyncio.create_task(stop_requested.wait()),
        asyncio.create_task(server.restart_requested.wait()),
    ]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    if stop_requested.is_set():
        log.info("stopping on signal")
        await server.stop()
        return
    log.warning("restarting in place", extra={"reason": server.restart_reason})
    await server.stop()
    raise RestartInPlace(server.restart_reason)


class _GroupHost:
    """What a cluster member asks of its server (``cluster.member.Host``)."""

    def __init__(self, server: SessionLogServer) -> None:
        self._server = server

    async def follow(self, primary: str) -> None:
        await self._server._follow(primary)

    async def stop_following(self) -> None:
        await self._server._stop_following()

    async def refresh(self) -> None:
        await self._server._set_health(serving=True)

    def restart(self, reason: str) -> None:
        self._server._restart(reason)


def _group_member(config: ServerConfig) -> GroupMember | None:
    """The cluster member of a server started with --cluster (None without): imported only
    then, so that a server that runs no election never loads etcd's client."""
    settings = config.cluster_settings
    if settings is None:
        return None
    from sessionlog.cluster.member import GroupMember

    return GroupMember(
        settings,
        Path(config.data_dir),
        channel_factory=app.replica_channel_factory(config),
        blocking_channel_factory=app.replica_blocking_channel_factory(config),
        metadata=_bearer_metadata(replica_token_of(config)),
    )


def _ownership(config: ServerConfig) -> Ownership:
    """What this server owns: everything without --shard-map; with a file, the map it holds
    (ConfigError, so the server does not start, when it cannot be read or has no group of
    mine); with etcd, nothing until ``shard.source`` reads a map."""
    if not config.shard_map:
        return Ownership(sharded=False)
    address = config.advertise or config.listen
    if config.shard_map == SHARD_MAP_ETCD:
        return Ownership(group=config.group, address=address)
    try:
        return from_file(config.shard_map, config.group, address)
    except ShardMapError as exc:
        raise ConfigError(f"--shard-map: {exc}") from None


def _bind(server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None) -> int:
    """The bound port; 0 when gRPC could not bind ``listen``."""
    try:
        if credentials is None:
            port: int = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:
        return 0
    return port


def _authorizer(config: ServerConfig, warn: bool = True) -> Authorizer | None:
    if not config.auth_tokens:
        return None
    try:
        tokens = TokenTable.load(config.auth_tokens, warn)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None
    return Authorizer(tokens, open_health=config.auth_open_health)


def _replica_name(store: Store) -> str:
    """What a replica calls itself in its progress reports: its data folder's instance id,
    which stays the same across restarts (a restored backup gets a new one)."""
    marker = folder.read_marker(store.path)
    return f"instance-{marker.instance}" if marker is not None else f"folder-{store.path}"


def _bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def index_old_sessions(store: Store, config: ServerConfig) -> None:
    """A static primary gives sessions written before the session indexes existed their place
    in them (``Store.reindex``), once, at start. A replica gets those writes from its primary; a
    cluster member does it once elected (``GroupMember``), as only the leader may write."""
    if config.replica_of or config.cluster or not store.unindexed():
        return
    try:
        added = store.reindex()
    except errors.SessionLogError as error:
        log.warning("could not index the sessions of an older server", extra={"error": str(error)})
        return
    log.info("indexed the sessions of an older server", extra={"entries": added})
