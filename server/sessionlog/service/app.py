"""Assemble the gRPC server: store, notifier, servicer, health, reflection; start and stop it."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from sessionlog import fold
from sessionlog.service.notifier import Notifier
from sessionlog.service.replication import SERVICE_NAME as REPLICATION_SERVICE_NAME
from sessionlog.service.replication import ReplicaState, ReplicationServicer, Replicator
from sessionlog.service.servicer import SERVICE_NAME, SessionLogServicer
from sessionlog.storage.store import DEFAULT_MAP_SIZE, Store, StoreConfig

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "./sessionlog-data"
DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True)
class ServerConfig:
    """Everything `sessionlog serve` can be told; the defaults are the embedded set-up."""

    data_dir: str = DEFAULT_DATA_DIR
    listen: str = DEFAULT_LISTEN
    map_size: int = DEFAULT_MAP_SIZE
    durable: bool = True
    limits: fold.Limits = field(default_factory=fold.Limits)
    max_message_bytes: int = 4 << 20
    """Largest gRPC message accepted or sent. gRPC clients accept 4 MiB replies by default, so a
    larger limit also needs clients configured for it (an Append's reply echoes its events)."""
    heartbeat_seconds: float = 15.0
    """An idle follow stream gets a response carrying next_seq this often."""
    shutdown_grace_seconds: float = 10.0
    """On stop, in-flight calls get this long to finish before they are cancelled."""
    replica_of: str = ""
    """HOST:PORT of a primary to follow as a read replica; empty for a primary."""

    def __post_init__(self) -> None:
        floor = self.limits.max_event_bytes + 4096
        if self.max_message_bytes < floor:
            raise ConfigError(
                f"max message size {self.max_message_bytes} is too small for the event size limit "
                f"{self.limits.max_event_bytes}: it must be at least {floor} bytes"
            )
        if self.heartbeat_seconds <= 0 or self.shutdown_grace_seconds < 0:
            raise ConfigError("heartbeat must be positive and shutdown grace not negative")

    def store_config(self) -> StoreConfig:
        return StoreConfig(map_size=self.map_size, durable=self.durable, limits=self.limits)


class ConfigError(ValueError):
    """The configuration contradicts itself; the message says which values to change."""


class BindError(RuntimeError):
    """The listen address could not be bound (in use, or not an address of this host)."""


class SessionLogServer:
    """One running sessionlog server. ``start`` binds and serves; ``stop`` drains and closes."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.port = 0
        self.store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._notifier = Notifier()
        self._health = HealthServicer()
        self._stopped = asyncio.Event()
        self.replica: ReplicaState | None = (
            ReplicaState(config.replica_of) if config.replica_of else None
        )
        self._replicator: Replicator | None = None
        self._replicator_task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Open the store, bind, and start serving. Returns the bound port."""
        loop = asyncio.get_running_loop()
        notifier = self._notifier

        def wake(session_ids: set[str]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(notifier.notify, session_ids)

        self.store = Store(Path(self.config.data_dir), self.config.store_config(), on_commit=wake)
        limit = self.config.max_message_bytes
        # Replies are sized by the handlers themselves (BATCH_TOO_LARGE, RESPONSE_TOO_LARGE, Since
        # batches); only the change feed may send more, to replicas that accept it.
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
            ]
        )
        heartbeat = self.config.heartbeat_seconds
        servicer = SessionLogServicer(
            self.store,
            notifier,
            max_message_bytes=limit,
            heartbeat_seconds=heartbeat,
            primary=self.config.replica_of,
        )
        replication = ReplicationServicer(
            self.store, notifier, replica=self.replica, heartbeat_seconds=heartbeat
        )
        server.add_generic_rpc_handlers((servicer.handlers(), replication.handlers()))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                REPLICATION_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        try:
            self.port = server.add_insecure_port(self.config.listen)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            self.store.close()
            raise BindError(
                f"cannot listen on {self.config.listen}: the address is in use, or is not an "
                "address of this host (another server there? pick another --listen)"
            )
        await server.start()
        self._server = server
        if self.replica is None:
            await self._set_health(serving=True)
        else:
            # A replica is NOT_SERVING until it has caught up with its primary once.
            await self._set_health(serving=False)
            self._replicator = Replicator(self.store, self.replica, self._caught_up)
            self._replicator_task = asyncio.create_task(self._replicator.run())
        log.info(
            "sessionlog serving",
            extra={
                "listen": self.config.listen,
                "port": self.port,
                "data": str(self.store.path.absolute()),
                "role": "replica" if self.replica else "primary",
                **({"primary": self.config.replica_of} if self.replica else {}),
            },
        )
        return self.port

    async def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME, REPLICATION_SERVICE_NAME):
            await self._health.set(service, status)

    def _caught_up(self) -> None:
        if self._server is not None:
            asyncio.get_running_loop().create_task(self._set_health(serving=True))

    async def stop(self, grace: float | None = None) -> None:
        """Stop: followers end with UNAVAILABLE, in-flight appends finish, LMDB closes."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self._replicator is not None and self._replicator_task is not None:
            self._replicator.stop()
            self._replicator_task.cancel()
            await asyncio.gather(self._replicator_task, return_exceptions=True)
        await self._health.enter_graceful_shutdown()
        self._notifier.close()
        await server.stop(self.config.shutdown_grace_seconds if grace is None else grace)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        self._stopped.set()
        log.info("sessionlog stopped")

    async def wait(self) -> None:
        await self._stopped.wait()


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    server = SessionLogServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    await stop_requested.wait()
    log.info("stopping on signal")
    await server.stop()
