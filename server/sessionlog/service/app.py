"""Assemble the gRPC server: store, notifier, servicer, health, reflection; start and stop it."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from sessionlog import fold
from sessionlog.service.admin_service import SERVICE_NAME as ADMIN_SERVICE_NAME
from sessionlog.service.admin_service import AdminServicer
from sessionlog.service.auth import AuthConfigError, AuthInterceptor, Authorizer, TokenTable
from sessionlog.service.counters import Counters
from sessionlog.service.limits import (
    DEFAULT_FOLLOW_SEND_RATE,
    DEFAULT_MAX_EVENTS_PER_APPEND,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
    StreamLimiter,
)
from sessionlog.service.notifier import Notifier
from sessionlog.service.replication import (
    DEFAULT_REPLICA_TIMEOUT_SECONDS,
    REPLICA_KEEPALIVE_OPTIONS,
    REPLICA_TIMEOUT_FLOOR_SECONDS,
    ReplicaState,
    ReplicationServicer,
    Replicator,
)
from sessionlog.service.replication import SERVICE_NAME as REPLICATION_SERVICE_NAME
from sessionlog.service.servicer import SERVICE_NAME, SessionLogServicer
from sessionlog.storage.store import (
    DEFAULT_MAP_SIZE,
    DEFAULT_REQUEST_ID_TTL_SECONDS,
    Store,
    StoreConfig,
)

if TYPE_CHECKING:
    from sessionlog.web.app import HttpSites

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = "./sessionlog-data"
DEFAULT_LISTEN = "127.0.0.1:50051"

SERVER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    # Ping each client after 30 s without a frame from it and drop the connection when 10 s
    # pass with no ack: a client (or replica) that vanished behind a dead link then frees its
    # streams (and their --max-streams slots) within 40 s instead of TCP's hours.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # gRPC 1.85 times keepalive (and every) ping by this one, not by keepalive_timeout_ms.
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    # Our clients and replicas ping every 10 s (see sessionlog_client and replication), even
    # with no call open, while gRPC's server default refuses pings more often than every 5
    # minutes and answers a third with GOAWAY "too_many_pings". Accept one a second: a ping
    # costs the server next to nothing, and only a client pinging faster than that is cut off.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 2),
)


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
    request_id_ttl_seconds: int = DEFAULT_REQUEST_ID_TTL_SECONDS
    """How long a request_id is remembered for idempotent retries."""
    replica_of: str = ""
    """HOST:PORT of a primary to follow as a read replica; empty for a primary."""
    replica_timeout_seconds: float = DEFAULT_REPLICA_TIMEOUT_SECONDS
    """A replica whose primary sends nothing for this long deems the link dead and reconnects
    (it asks for heartbeats at a third of it)."""
    max_events_per_append: int = DEFAULT_MAX_EVENTS_PER_APPEND
    max_streams: int = DEFAULT_MAX_STREAMS
    """Open Since/Changes streams allowed in total (TOO_MANY_STREAMS past it)."""
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    follow_send_rate: int = DEFAULT_FOLLOW_SEND_RATE
    """Live follow responses per second the server paces all its streams to, together."""
    tls_cert: str = ""
    """PEM certificate chain; with tls_key, the server speaks TLS only."""
    tls_key: str = ""
    tls_client_ca: str = ""
    """PEM CA bundle; when set, clients must present a certificate it signed (mTLS)."""
    auth_tokens: str = ""
    """TOML tokens file; when set, every call needs a bearer token (see service.auth)."""
    auth_open_health: bool = False
    """With auth on, still let health checks and reflection through without a token."""
    replica_token: str = ""
    """The bearer token a replica presents to its primary (needs the admin permission)."""
    replica_token_file: str = ""
    """A file holding replica_token instead (read at start, whitespace stripped): off `ps`."""
    replica_serve_open: bool = False
    """Let a replica with a token for its primary serve with no tokens of its own."""
    replica_tls_ca: str = ""
    """PEM CA to verify a TLS primary with; set it to connect to the primary over TLS."""
    replica_tls_cert: str = ""
    """PEM client certificate for a primary that requires mTLS (with replica_tls_key)."""
    replica_tls_key: str = ""
    metrics_listen: str = ""
    """HOST:PORT serving Prometheus metrics at /metrics; empty: off."""
    http_listen: str = ""
    """HOST:PORT serving the read-only web console; empty: off."""

    def __post_init__(self) -> None:
        floor = self.limits.max_event_bytes + 4096
        if self.max_message_bytes < floor:
            raise ConfigError(
                f"max message size {self.max_message_bytes} is too small for the event size limit "
                f"{self.limits.max_event_bytes}: it must be at least {floor} bytes"
            )
        if self.heartbeat_seconds <= 0 or self.shutdown_grace_seconds < 0:
            raise ConfigError("heartbeat must be positive and shutdown grace not negative")
        if self.replica_timeout_seconds < REPLICA_TIMEOUT_FLOOR_SECONDS:
            raise ConfigError(
                f"--replica-timeout must be at least {REPLICA_TIMEOUT_FLOOR_SECONDS} seconds "
                "(it asks the primary for heartbeats at a third of it)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        if bool(self.replica_tls_cert) != bool(self.replica_tls_key):
            raise ConfigError("--replica-tls-cert and --replica-tls-key go together")
        self._check_replica_auth()
        for name in (
            "max_events_per_append",
            "max_streams",
            "max_streams_per_connection",
            "follow_send_rate",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1")
        for name in ("metrics_listen", "http_listen"):
            _check_address(name, getattr(self, name))

    def _check_replica_auth(self) -> None:
        """A replica that needs a token to read its primary holds a primary's data behind
        tokens: serving it to anyone must be asked for, not fallen into."""
        if self.replica_token and self.replica_token_file:
            raise ConfigError(
                "--replica-token and --replica-token-file both give the replica's token; keep one "
                "(the file keeps the secret out of `ps`)"
            )
        if self.replica_of and self.replica_token_file:
            _replica_token(self)  # a missing or empty file is the first thing to hear about
        has_token = bool(self.replica_token or self.replica_token_file)
        if self.replica_of and has_token and not self.auth_tokens and not self.replica_serve_open:
            raise ConfigError(
                "this replica presents a token to its primary but has no --auth-tokens of its "
                "own, so it would serve every tenant's data to anyone: give it --auth-tokens "
                "FILE, or --replica-serve-open to serve open on purpose"
            )

    @property
    def serves_open_replica(self) -> bool:
        """A replica of a primary that requires tokens, serving with none (on purpose)."""
        has_token = bool(self.replica_token or self.replica_token_file)
        return bool(self.replica_of) and has_token and not self.auth_tokens

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            map_size=self.map_size,
            durable=self.durable,
            limits=self.limits,
            request_id_ttl_seconds=self.request_id_ttl_seconds,
            replica_of=self.replica_of,
        )


class ConfigError(ValueError):
    """The configuration contradicts itself; the message says which values to change."""


def _check_address(name: str, address: str) -> None:
    """An HTTP listen address must be HOST:PORT (or [IPv6]:PORT); empty means off."""
    if not address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            f"--{name.replace('_', '-')} {address!r} is not HOST:PORT (e.g. 127.0.0.1:9090)"
        )


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
        self.counters = Counters()
        """Per-call counts the unary handlers keep, read by the metrics."""
        self.streams = StreamLimiter(
            config.max_streams,
            config.max_streams_per_connection,
            notifier=self._notifier,
            send_rate=config.follow_send_rate,
        )
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

    async def start(self) -> int:
        """Open the store, bind, and start serving. Returns the bound port."""
        loop = asyncio.get_running_loop()
        notifier = self._notifier

        def wake(session_ids: set[str]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(notifier.notify, session_ids)

        def broken() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._storage_broken)

        config = self.config
        credentials = _server_credentials(config)
        authorizer = self.authorizer = _authorizer(config)
        replica_token = _replica_token(config)
        self.store = Store(
            Path(config.data_dir), config.store_config(), on_commit=wake, on_broken=broken
        )
        limit = config.max_message_bytes
        # Replies are sized by the handlers themselves (BATCH_TOO_LARGE, RESPONSE_TOO_LARGE, Since
        # batches); only the change feed may send more, to replicas that accept it.
        server = grpc.aio.server(
            interceptors=[AuthInterceptor(authorizer)] if authorizer else None,
            options=[
                ("grpc.so_reuseport", 0),
                # Twice the limit: requests between the two get REQUEST_TOO_LARGE with ErrorInfo
                # from the handlers; only larger ones meet gRPC's own bare refusal.
                ("grpc.max_receive_message_length", min(2 * limit, (2 << 30) - 1)),
                ("grpc.max_send_message_length", -1),
                # gRPC sheds calls waiting to be accepted past 1,000 by default: a burst of
                # followers reconnecting after a restart must not be cancelled at random.
                ("grpc.server.max_pending_requests", config.max_streams + 1000),
                ("grpc.server.max_pending_requests_hard_limit", config.max_streams + 3000),
                *SERVER_KEEPALIVE_OPTIONS,
            ],
        )
        streams = self.streams
        heartbeat = self.config.heartbeat_seconds
        servicer = SessionLogServicer(
            self.store,
            notifier,
            max_message_bytes=limit,
            heartbeat_seconds=heartbeat,
            primary=config.replica_of,
            authorizer=authorizer,
            max_events_per_append=config.max_events_per_append,
            streams=streams,
            counters=self.counters,
        )
        replication = ReplicationServicer(
            self.store,
            notifier,
            replica=self.replica,
            heartbeat_seconds=heartbeat,
            streams=streams,
        )
        admin = AdminServicer(
            self.store,
            replica=self.replica is not None,
            counters=self.counters,
            max_message_bytes=limit,
        )
        server.add_generic_rpc_handlers(
            (servicer.handlers(), replication.handlers(), admin.handlers())
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                REPLICATION_SERVICE_NAME,
                ADMIN_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        try:
            if credentials is None:
                self.port = server.add_insecure_port(config.listen)
            else:
                self.port = server.add_secure_port(config.listen, credentials)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            self.store.close()
            raise BindError(
                f"cannot listen on {self.config.listen}: the address is in use, or is not an "
                "address of this host (another server there? pick another --listen)"
            )
        try:
            await self._start_http()
        except BindError:
            await server.stop(None)
            raise
        await server.start()
        self._server = server
        if self.replica is None:
            await self._set_health(serving=True)
        else:
            # A replica is NOT_SERVING until it has caught up with its primary once.
            await self._set_health(serving=False)
            self._replicator = Replicator(
                self.store,
                self.replica,
                self._caught_up,
                channel_factory=_replica_channel_factory(config),
                metadata=_bearer_metadata(replica_token),
                timeout_seconds=config.replica_timeout_seconds,
                on_diverged=self._diverged,
            )
            self._replicator_task = asyncio.create_task(self._replicator.run())
            if config.serves_open_replica:
                log.warning(
                    "this replica serves every tenant's data without tokens "
                    "(--replica-serve-open); give it --auth-tokens to require them",
                    extra={"primary": config.replica_of},
                )
        log.info(
            "sessionlog serving",
            extra={
                "listen": self.config.listen,
                "port": self.port,
                "data": str(self.store.path.absolute()),
                "role": "replica" if self.replica else "primary",
                "tls": "mutual" if config.tls_client_ca else "on" if credentials else "off",
                "auth": f"{len(authorizer.tokens)} tokens" if authorizer else "off",
                "http": config.http_listen or "off",
                "metrics": config.metrics_listen or "off",
                **({"primary": self.config.replica_of} if self.replica else {}),
            },
        )
        return self.port

    async def _start_http(self) -> None:
        """Serve the web console and the metrics endpoint when configured (see ``web.app``)."""
        config = self.config
        if not config.http_listen and not config.metrics_listen:
            return
        from sessionlog.web.app import HttpSites, ListenError

        try:
            self._http = await HttpSites.start(self, config.http_listen, config.metrics_listen)
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

    async def _set_health(self, serving: bool) -> None:
        """A store whose LMDB has panicked stays NOT_SERVING whatever else happens."""
        broken = self.store is not None and self.store.writer.broken is not None
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving and not broken
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME, REPLICATION_SERVICE_NAME):
            await self._health.set(service, status)

    def _storage_broken(self) -> None:
        if self._server is not None:
            log.error("the storage engine panicked: restart the server")
            asyncio.get_running_loop().create_task(self._set_health(serving=False))

    def _caught_up(self) -> None:
        if self._server is not None:
            asyncio.get_running_loop().create_task(self._set_health(serving=True))

    def _diverged(self) -> None:
        """A diverged replica is not current, whatever it served before: NOT_SERVING."""
        if self._server is not None:
            asyncio.get_running_loop().create_task(self._set_health(serving=False))

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
        if self._http is not None:
            await self._http.close()
            self._http = None
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


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path!r}: {exc.strerror}") from None


def _server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert:
        return None
    key = _read(config.tls_key, "TLS key")
    chain = _read(config.tls_cert, "TLS certificate")
    client_ca = _read(config.tls_client_ca, "client CA") if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _authorizer(config: ServerConfig) -> Authorizer | None:
    if not config.auth_tokens:
        return None
    try:
        tokens = TokenTable.load(config.auth_tokens)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None
    return Authorizer(tokens, open_health=config.auth_open_health)


def _replica_token(config: ServerConfig) -> str:
    """The token the replica presents: the setting, or the stripped content of its file."""
    if not config.replica_token_file:
        return config.replica_token
    path = config.replica_token_file
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the replica token file {path!r}: {reason}") from None
    if not token:
        raise ConfigError(f"the replica token file {path!r} is empty; write the token into it")
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ConfigError(
            f"the replica token file {path!r} must hold just the token: one line of visible "
            "ASCII with no spaces (a header cannot carry anything else)"
        )
    return token


def _bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _replica_channel_factory(config: ServerConfig) -> Callable[[str], grpc.aio.Channel]:
    options = [("grpc.max_receive_message_length", -1), *REPLICA_KEEPALIVE_OPTIONS]
    if not config.replica_tls_ca:
        return lambda target: grpc.aio.insecure_channel(target, options=options)
    root = _read(config.replica_tls_ca, "replica TLS CA")
    cert = _read(config.replica_tls_cert, "replica TLS cert") if config.replica_tls_cert else None
    key = _read(config.replica_tls_key, "replica TLS key") if config.replica_tls_key else None
    credentials = grpc.ssl_channel_credentials(root, key, cert)
    return lambda target: grpc.aio.secure_channel(target, credentials, options=options)
