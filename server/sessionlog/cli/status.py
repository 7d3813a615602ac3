"""`sessionlog health | replication status`: the client commands that ask about a server
rather than a session."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import grpc

from sessionlog.cli.client import (
    Subcommand,
    _client,
    _common_flags,
    _print_json,
)
from sessionlog_client.convert import (
    message_to_json,
)

HEALTH_NAMES = ("", "sessionlog.v1.SessionLogService", "sessionlog.v1.ReplicationService")
"""The service names a server's health service answers for ("": the server as a whole); the
server's own list is ``service.app.HEALTH_SERVICES``, which the CLI does not import."""


def add_commands(commands: Any, sub: Subcommand) -> None:
    """Register `health` and `replication status` (``sub``: ``client.subcommands``)."""
    p = sub("health", "check the server's gRPC health: exit 0 when SERVING, 1 otherwise", _health)
    p.add_argument("--service", default="", help="one service's health (default: the server's)")

    replication = commands.add_parser(
        "replication", help="replication of a server", description="Replication of a server."
    )
    actions = replication.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "status",
        help="role, state, positions, lag, link and history ids of a primary or replica",
        description="GetReplicationStatus: role, state, positions, lag, connected, history ids "
        "and detail (needs a token without a session prefix).",
        parents=[_common_flags()],
    )
    p.set_defaults(run=_replication_status)


def _health(args: argparse.Namespace) -> int:
    """One line: the serving status, or why there is none. For container health checks, so any
    answer but SERVING (unreachable, unknown service, refused) exits 1."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with _client(args) as client:
        stub = health_pb2_grpc.HealthStub(client.channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=args.timeout,
                metadata=client.connection.call_metadata(),
            )
        except grpc.RpcError as error:
            details = " ".join((error.details() or "").split())
            if error.code() == grpc.StatusCode.NOT_FOUND and not details:
                details = (
                    f"no health status for service {args.service!r}; a sessionlog server "
                    f"answers for {', '.join(repr(name) for name in HEALTH_NAMES)}"
                )
            print(f"{args.server}: {error.code().name}: {details or 'no details'}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if args.json:
        _print_json({"status": status})
    else:
        print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _replication_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.replication_status()
    status = message_to_json(reply)
    if args.json:
        _print_json(status)
    else:
        width = max(len(name) for name in status)
        for name, value in status.items():
            print(f"{name:<{width}}  {'' if value is None else value}")
    return 0
