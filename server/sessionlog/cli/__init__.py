"""The `sessionlog` command.

    sessionlog serve [--config FILE] [--data DIR] [--listen HOST:PORT] ... [--print-config]
    sessionlog append | tail | surface | messages | create | seed | get | sessions | fork | lease
    sessionlog health | replication status ...
    sessionlog admin stats | backup | restore | verify ...
    sessionlog replica resync | rejoin ...
    sessionlog cluster slot | map | haproxy | haproxy-sync | move-slot ...
    sessionlog dev cluster

A module per command group: ``serve``; the client commands, on ``client``'s flags, connection
and output: ``writes`` (append, hide, delete, redact), ``tail``, ``reads`` (surface, state,
usage, messages, items), ``sessions`` (create, seed, get, sessions, label, update, fork,
lease), ``transfer`` (export, import), ``status`` (health, replication status); ``admin``
(admin and replica: its folder tools in ``admin_offline``, its server calls in
``admin_online``); ``cluster`` (slots, shard maps, HAProxy); ``dev`` (dev cluster). Nothing
below imports this package: the CLI sits on top of the server's layers and of the Python client.

The settings of `serve` live in ``config`` (flags, SESSIONLOG_* variables, a TOML file).
Errors are one line on stderr, never a traceback: exit 2 for bad usage, 1 when the server
cannot start.
"""

from __future__ import annotations

import os

# gRPC's core logs its own copy of errors we already report in one line (a busy port, say).
# Set before grpc is imported; an operator's own GRPC_VERBOSITY still wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import NoReturn

from sessionlog.cli import (
    admin,
    cluster,
    dev,
    reads,
    serve,
    sessions,
    status,
    tail,
    transfer,
    writes,
)
from sessionlog.cli.client import run_client, subcommands


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), pointing at --help instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sessionlog",
        description="A gRPC event-log server for LLM agent sessions, stored in LMDB.",
    )
    parser.add_argument("--version", action="version", version=f"sessionlog {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.add_command(commands)
    sub = subcommands(commands)
    for group in (writes, tail, reads, sessions, transfer):
        group.add_commands(sub)
    status.add_commands(commands, sub)
    admin.add_commands(commands)
    admin.add_replica_commands(commands)
    dev.add_commands(commands)
    cluster.add_commands(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("sessionlog-server")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return serve.run(args)
        return run_client(args)
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """stdout's reader went away (``| head``): end quietly, as Unix tools do. stdout now points
    at /dev/null so that the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0
