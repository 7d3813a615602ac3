"""The `sessionlog` command.

    sessionlog serve [--config FILE] [--data DIR] [--listen HOST:PORT] ... [--print-config]
    sessionlog append | tail | surface | messages | create | seed | get | sessions | fork | lease
    sessionlog health | replication status ...
    sessionlog admin stats | backup | restore | verify ...
    sessionlog replica resync | rejoin ...
    sessionlog dev cluster

The client subcommands live in ``cli_client``.

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
import asyncio
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import NoReturn

from sessionlog import admin, config, dev, logs, transfer
from sessionlog.cli_client import add_commands, run_client
from sessionlog.config import ConfigError, worker_count
from sessionlog.shard import commands as shard_commands
from sessionlog.startup import run_event_loop, start_failure


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
    serve_cmd = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the sessionlog server until SIGTERM or SIGINT (then stop gracefully). "
        "Every flag also reads an environment variable and a key of the --config TOML file; "
        "precedence: flag > env > file > default.",
    )
    config.add_flags(serve_cmd)
    serve_cmd.set_defaults(run=None)
    add_commands(commands, built_on=[transfer.add_commands])
    admin.add_commands(commands)
    admin.add_replica_commands(commands)
    dev.add_commands(commands)
    shard_commands.add_commands(commands)
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
            return _serve(args)
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


def _serve(args: argparse.Namespace) -> int:
    try:
        resolved = config.resolve(args)
        server_config = config.server_config(resolved)
    except ConfigError as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.render(resolved))
        return 0
    level, fmt = resolved.values["log_level"], resolved.values["log_format"]
    logs.configure(level, fmt)
    # The server is imported here, not above: the client commands start without it.
    from sessionlog.server import RestartInPlace, serve
    from sessionlog.workers.supervisor import Supervisor

    try:
        if worker_count(server_config) == 1:
            run_event_loop(serve(server_config))
        else:
            asyncio.run(Supervisor(server_config, level, fmt).run())
    except KeyboardInterrupt:
        return 130
    except RestartInPlace:
        # The same command line in a fresh process (same PID): the server stopped cleanly,
        # its folder and ports are free, and Python opens nothing that survives an exec.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)
    except Exception as exc:
        message = start_failure(exc, server_config.data_dir)
        if message is None:
            raise
        print(f"sessionlog: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
