"""The `sessionlog` command.

    sessionlog serve [--data DIR] [--listen HOST:PORT] [--map-size SIZE] [--durability MODE]
    sessionlog append | tail | surface | messages | get | sessions | fork | lease ...

The client subcommands live in ``cli_client``.

Every flag also reads an environment variable (SESSIONLOG_DATA, SESSIONLOG_LISTEN, ...); a flag
given on the command line wins over the variable. Errors are one line on stderr, never a
traceback: exit 2 for bad usage, 1 when the server cannot start.
"""

from __future__ import annotations

import os

# gRPC's core logs its own copy of errors we already report in one line (a busy port, say).
# Set before grpc is imported; an operator's own GRPC_VERBOSITY still wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

import lmdb

from sessionlog import fold
from sessionlog.cli_client import add_commands, run_client
from sessionlog.service.app import (
    DEFAULT_DATA_DIR,
    DEFAULT_LISTEN,
    BindError,
    ConfigError,
    ServerConfig,
    serve,
)
from sessionlog.storage.store import DEFAULT_MAP_SIZE


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), pointing at --help instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count: plain bytes, or with a K/M/G/T suffix (KiB, MB... all mean powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 8GiB, 512MiB or bytes)")
    unit = (match.group(2) or "").upper()[:1]
    return int(match.group(1)) * _UNITS[unit]


def _env(name: str, default: str) -> str:
    return os.environ.get(f"SESSIONLOG_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sessionlog",
        description="A gRPC event-log server for LLM agent sessions, stored in LMDB.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve_cmd = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the sessionlog server until SIGTERM or SIGINT (then stop gracefully).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve_cmd.add_argument(
        "--data",
        default=_env("DATA", DEFAULT_DATA_DIR),
        help="folder holding the LMDB environment; created if missing [env SESSIONLOG_DATA]",
    )
    serve_cmd.add_argument(
        "--listen",
        default=_env("LISTEN", DEFAULT_LISTEN),
        help="address to serve gRPC on, HOST:PORT ([::]:PORT for every interface) "
        "[env SESSIONLOG_LISTEN]",
    )
    serve_cmd.add_argument(
        "--map-size",
        type=parse_size,
        default=_env("MAP_SIZE", str(DEFAULT_MAP_SIZE)),
        help="largest size the data file may reach (e.g. 8GiB); a full map answers "
        "STORAGE_FULL, raise it and restart [env SESSIONLOG_MAP_SIZE]",
    )
    serve_cmd.add_argument(
        "--max-message-size",
        type=parse_size,
        default=_env("MAX_MESSAGE_SIZE", "4MiB"),
        help="largest gRPC message accepted or sent; clients must accept replies this large "
        "too (gRPC's default is 4 MiB) [env SESSIONLOG_MAX_MESSAGE_SIZE]",
    )
    serve_cmd.add_argument(
        "--max-event-size",
        type=parse_size,
        default=_env("MAX_EVENT_SIZE", "1MiB"),
        help="largest serialized event accepted (EVENT_TOO_LARGE above it) "
        "[env SESSIONLOG_MAX_EVENT_SIZE]",
    )
    serve_cmd.add_argument(
        "--durability",
        choices=("sync", "nosync"),
        default=_env("DURABILITY", "sync"),
        help="sync: acknowledge an append only after it is synced to disk. nosync: faster, but a "
        "machine crash may lose recently acknowledged appends [env SESSIONLOG_DURABILITY]",
    )
    serve_cmd.add_argument(
        "--replica-of",
        metavar="HOST:PORT",
        default=_env("REPLICA_OF", ""),
        help="run as a read replica that follows this primary's change feed; writes are "
        "refused with NOT_PRIMARY [env SESSIONLOG_REPLICA_OF]",
    )
    serve_cmd.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="least severe log level printed [env SESSIONLOG_LOG_LEVEL]",
    )
    serve_cmd.set_defaults(run=None)
    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return run_client(args)


def _size(value: int | str) -> int:
    """A size from a flag (already parsed) or from its environment default (still text)."""
    return value if isinstance(value, int) else parse_size(value)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s",
        stream=sys.stderr,
    )
    _install_context_filter()
    try:
        config = ServerConfig(
            data_dir=args.data,
            listen=args.listen,
            map_size=_size(args.map_size),
            durable=args.durability == "sync",
            max_message_bytes=_size(args.max_message_size),
            limits=fold.Limits(max_event_bytes=_size(args.max_event_size)),
            replica_of=args.replica_of,
        )
    except (ConfigError, argparse.ArgumentTypeError) as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config))
    except BindError as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return 1
    except (lmdb.Error, OSError) as exc:
        print(f"sessionlog: cannot open the data folder {args.data!r}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _install_context_filter() -> None:
    """Render the ``extra`` fields of a log call as key=value after the message."""

    def add_context(record: logging.LogRecord) -> bool:
        extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        extra.pop("context", None)
        record.context = "".join(f" {k}={v}" for k, v in extra.items())
        return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(add_context)


if __name__ == "__main__":
    sys.exit(main())
