"""Assemble the gRPC side of a server: the grpc.aio server and its options, the services it
carries (SessionLogService, ReplicationService, health, reflection), TLS credentials, and the
channels a replica dials its primary with.

Only gRPC assembly lives here; which parts a running server has, and in what order they start
and stop, is the composition module's business (``sessionlog.server``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from sessionlog.config import ConfigError, ServerConfig
from sessionlog.service.admin_service import SERVICE_NAME as ADMIN_SERVICE_NAME
from sessionlog.service.replication import REPLICA_KEEPALIVE_OPTIONS
from sessionlog.service.replication import SERVICE_NAME as REPLICATION_SERVICE_NAME
from sessionlog.service.servicer import SERVICE_NAME

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

HEALTH_SERVICES = ("", SERVICE_NAME, REPLICATION_SERVICE_NAME)
"""The names health checks answer for: the server as a whole and each of its services."""


TRANSPORT_MARGIN_BYTES = 32 << 20
"""How far past --max-message-size the transport still reads a request, so that the handler
refuses it with REQUEST_TOO_LARGE (naming the limit and the setting) rather than gRPC with a bare
"Received message larger than max". The margin bounds what one call may buffer."""


def transport_limit(max_message_bytes: int) -> int:
    """The transport's receive limit for a server whose message limit is ``max_message_bytes``:
    the limit plus the larger of itself and TRANSPORT_MARGIN_BYTES, within gRPC's 2 GiB."""
    margin = max(max_message_bytes, TRANSPORT_MARGIN_BYTES)
    return min(max_message_bytes + margin, (2 << 30) - 1)


def grpc_server(
    config: ServerConfig,
    interceptors: list[grpc.aio.ServerInterceptor] | None,
    share_port: bool = False,
) -> grpc.aio.Server:
    """A grpc.aio server sized by the config. Replies are sized by the handlers themselves
    (BATCH_TOO_LARGE, RESPONSE_TOO_LARGE, Since batches); only the change feed may send more,
    to replicas that accept it. ``share_port``: bind with SO_REUSEPORT, beside the other
    workers of the same server (their supervisor has made sure no other server holds the port);
    otherwise a port in use is refused."""
    limit = config.max_message_bytes
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.so_reuseport", 1 if share_port else 0),
            # Above the limit by a margin: requests up to transport_limit() get
            # REQUEST_TOO_LARGE with ErrorInfo from the handlers; only larger ones meet gRPC's
            # own bare refusal.
            ("grpc.max_receive_message_length", transport_limit(limit)),
            ("grpc.max_send_message_length", -1),
            # gRPC sheds calls waiting to be accepted past 1,000 by default: a burst of
            # followers reconnecting after a restart must not be cancelled at random.
            ("grpc.server.max_pending_requests", config.max_streams + 1000),
            ("grpc.server.max_pending_requests_hard_limit", config.max_streams + 3000),
            *SERVER_KEEPALIVE_OPTIONS,
        ],
    )


def add_services(
    server: grpc.aio.Server, handlers: tuple[grpc.GenericRpcHandler, ...], health: HealthServicer
) -> None:
    """The services' raw-bytes handlers, health checks and reflection over all of them."""
    server.add_generic_rpc_handlers(handlers)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
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


async def set_health(health: HealthServicer, serving: bool) -> None:
    """Every health name SERVING, or every one NOT_SERVING."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for service in HEALTH_SERVICES:
        await health.set(service, status)


def read_file(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path!r}: {exc.strerror}") from None


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS (or mTLS) credentials when the config names a certificate; None: plaintext."""
    if not config.tls_cert:
        return None
    key = read_file(config.tls_key, "TLS key")
    chain = read_file(config.tls_cert, "TLS certificate")
    client_ca = read_file(config.tls_client_ca, "client CA") if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def replica_channel_factory(config: ServerConfig) -> Callable[[str], grpc.aio.Channel]:
    """How a replica dials its primary: plaintext, or TLS with the configured CA (and client
    certificate), with no receive limit (the feed sends what a primary holds)."""
    options = [("grpc.max_receive_message_length", -1), *REPLICA_KEEPALIVE_OPTIONS]
    credentials = _replica_credentials(config)
    if credentials is None:
        return lambda target: grpc.aio.insecure_channel(target, options=options)
    return lambda target: grpc.aio.secure_channel(target, credentials, options=options)


def replica_blocking_channel_factory(config: ServerConfig) -> Callable[[str], grpc.Channel]:
    """``replica_channel_factory`` for blocking calls (a cluster member's rejoin at start-up,
    which runs in a thread of its own before the event loop serves)."""
    options = [("grpc.max_receive_message_length", -1)]
    credentials = _replica_credentials(config)
    if credentials is None:
        return lambda target: grpc.insecure_channel(target, options=options)
    return lambda target: grpc.secure_channel(target, credentials, options=options)


def _replica_credentials(config: ServerConfig) -> grpc.ChannelCredentials | None:
    if not config.replica_tls_ca:
        return None
    root = read_file(config.replica_tls_ca, "replica TLS CA")
    cert = (
        read_file(config.replica_tls_cert, "replica TLS cert") if config.replica_tls_cert else None
    )
    key = read_file(config.replica_tls_key, "replica TLS key") if config.replica_tls_key else None
    return grpc.ssl_channel_credentials(root, key, cert)
