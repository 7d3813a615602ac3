"""What the client commands of `sessionlog` share (they talk to a running server from a
terminal; each group is its own module: writes, tail, reads, sessions, transfer, status): the
flags every one takes, the connection, the exit codes, one-line errors and JSON output.

Built on the Python client (``sessionlog_client``): its channel options, token, TLS, error
classes and resuming follow; the commands only parse arguments and print.

Exit codes scripts can rely on:
    0  success
    1  the server refused the request (the line names the reason, e.g. SEQ_CONFLICT), or
       ``get`` found no such session
    2  bad usage
    3  the server could not be reached (or went away)

``--json`` prints JSON for scripts on every command (``message_to_json``: 64-bit integers as
numbers, enums by short name, whole numbers in event data as ints); streams and lists print
one object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import grpc

from sessionlog_client import Client, DeadlineExceeded, Retry, errors
from sessionlog_client._status import to_error

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

RETRY_FOR = 10.0
"""--retry-for's default: about a failover (etcd's lease TTL and a promotion) and the default
--timeout of one call."""
_HOST_PORT = re.compile(r"(\[[^\]]+\]|[^:\[\]/]+):(\d{1,5})")


def server_address(value: str) -> str:
    """--server: HOST:PORT ([v6]:PORT), or a gRPC target with a scheme (``unix:``, ``dns:``).
    A bare host is refused: gRPC would silently try port 443."""
    if ":/" in value or value.startswith("unix:"):
        return value
    match = _HOST_PORT.fullmatch(value)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise argparse.ArgumentTypeError(
            f"--server takes HOST:PORT, e.g. 127.0.0.1:50051 (got {value!r})"
        )
    return value


Subcommand = Callable[[str, str, Callable[[argparse.Namespace], int]], Any]
"""Adds one client command to the `sessionlog` parser: its name, help and run function, with the
flags every client command takes (``subcommands``)."""


def subcommands(commands: Any) -> Subcommand:
    """The maker of client commands on the `sessionlog` parser's ``commands``: each group module
    (writes, tail, reads, sessions, transfer, status) registers its commands with it."""
    common = _common_flags()

    def sub(name: str, help_text: str, run: Callable[[argparse.Namespace], int]) -> Any:
        parser = commands.add_parser(name, help=help_text, description=help_text, parents=[common])
        parser.set_defaults(run=run)
        return parser

    return sub


def _common_flags() -> argparse.ArgumentParser:
    common = connection_options(
        os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051"),
        "server address HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
    )
    common.add_argument(
        "--retry-for",
        type=seconds,
        default=RETRY_FOR,
        metavar="SECONDS",
        help="how long a call retries while a server it reached, or a proxy in front of it, has "
        "no answer for it yet (UNAVAILABLE, a proxy's 502/503/504: no primary right now); a write "
        "keeps one request id across its tries; 0: never (default %(default)s)",
    )
    common.add_argument(
        "--json", action="store_true", help="JSON for scripts (one object per line for lists)"
    )
    common.add_argument(
        "--no-color",
        action="store_true",
        help="no colours even on a terminal (so does a non-empty NO_COLOR variable)",
    )
    return common


def connection_options(
    server_default: str | None, server_help: str, timeout_default: float = 10.0
) -> argparse.ArgumentParser:
    """A parent parser with what every command that calls a server takes: --server, --timeout,
    --token and the TLS files; ``channel`` turns the parsed values into a channel."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", type=server_address, default=server_default, help=server_help)
    common.add_argument(
        "--timeout",
        type=float,
        default=timeout_default,
        help="deadline of each call in seconds (default %(default)s)",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("SESSIONLOG_TOKEN", ""),
        help="bearer token, for a server with --auth-tokens [env SESSIONLOG_TOKEN]",
    )
    common.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=os.environ.get("SESSIONLOG_TLS_CA", ""),
        help="PEM CA to verify a TLS server with (TLS when set) [env SESSIONLOG_TLS_CA]",
    )
    common.add_argument(
        "--tls-cert",
        metavar="FILE",
        default=os.environ.get("SESSIONLOG_TLS_CERT", ""),
        help="PEM client certificate, for a server that requires mTLS [env SESSIONLOG_TLS_CERT]",
    )
    common.add_argument(
        "--tls-key",
        metavar="FILE",
        default=os.environ.get("SESSIONLOG_TLS_KEY", ""),
        help="PEM key of --tls-cert [env SESSIONLOG_TLS_KEY]",
    )
    return common


def run_client(args: argparse.Namespace) -> int:
    """Run a client subcommand, turning failures into one line and an exit code."""
    # Ctrl-C ends a command (exit 130) even when started from a shell or job that ignores
    # SIGINT, as background jobs do: Python keeps an inherited "ignore" otherwise.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code: int = args.run(args)
        return code
    except errors.SessionLogError as error:
        return _report(error)
    except grpc.RpcError as error:  # a call made on the client's channel directly
        return _report(to_error(error))
    except KeyboardInterrupt:
        return 130


def _report(error: errors.SessionLogError) -> int:
    details = " ".join(error.message.split())  # one line, whatever the server said
    print(f"sessionlog: {error.reason}: {details}", file=sys.stderr)
    unreachable = isinstance(error, errors.Unavailable | DeadlineExceeded | errors.StorageIoError)
    return EXIT_UNREACHABLE if unreachable else EXIT_REFUSED


def natural(text: str) -> int:
    """An argparse type for a seq, a count or a page size: a whole number, 0 or more (a
    negative one would fail later, in the request, with a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a number 0 or more")
    return value


def seconds(text: str) -> float:
    """An argparse type for a duration: a number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds 0 or more")
    return value


def _usage(message: str) -> NoReturn:
    """A bad argument value: one line on stderr and exit 2, like argparse's own usage errors."""
    print(f"sessionlog: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _client(args: argparse.Namespace, retry: Retry | None = None) -> Client:
    """A client of --server: TLS when --tls-ca is given, the token on every call. One-shot
    commands retry what the client retries for --retry-for seconds (none for a command without
    the flag), so one started during a failover waits it out; a wrong address (one that never
    answered) still fails at once, naming it."""
    if retry is None:
        retry = Retry(give_up_after=getattr(args, "retry_for", 0.0))
    tls: dict[str, Any] = {}
    if args.tls_ca:
        tls = {
            "root_certificates": _read_file(args.tls_ca),
            "certificate_chain": _read_file(args.tls_cert) if args.tls_cert else None,
            "private_key": _read_file(args.tls_key) if args.tls_key else None,
        }
    return Client(
        args.server,
        timeout=args.timeout,
        token=args.token or None,
        retry=retry,
        # Accept replies as large as any server limit (--max-message-size).
        max_message_bytes=2**31 - 1,
        **tls,
    )


def channel(args: argparse.Namespace) -> grpc.Channel:
    """A channel to --server: TLS when --tls-ca is given, the bearer token on every call."""
    # Accept replies as large as any server limit (--max-message-size), not gRPC's 4 MiB.
    options = [("grpc.max_receive_message_length", -1)]
    if args.tls_ca:
        try:
            root = Path(args.tls_ca).read_bytes()
            cert = Path(args.tls_cert).read_bytes() if args.tls_cert else None
            key = Path(args.tls_key).read_bytes() if args.tls_key else None
        except OSError as exc:
            _usage(f"cannot read a TLS file: {exc}")
        credentials = grpc.ssl_channel_credentials(root, key, cert)
        channel = grpc.secure_channel(args.server, credentials, options=options)
    else:
        channel = grpc.insecure_channel(args.server, options=options)
    if args.token:
        channel = grpc.intercept_channel(channel, _Bearer(args.token))
    return channel


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer TOKEN`` to every call."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        _usage(f"cannot read a TLS file: {exc}")


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False))


def _colour(args: argparse.Namespace) -> bool:
    """Colour only on a terminal, and never with --no-color or a non-empty NO_COLOR."""
    return sys.stdout.isatty() and not args.no_color and not os.environ.get("NO_COLOR")
