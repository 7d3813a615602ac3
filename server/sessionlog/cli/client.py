"""The client subcommands of `sessionlog`: talk to a running server from a terminal.

Built on the Python client (``sessionlog_client``): its channel options, token, TLS, error
classes and resuming follow; this module only parses arguments and prints.

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import retention
from sessionlog.shard import feeds
from sessionlog.terminal import escaped
from sessionlog_client import Client, DeadlineExceeded, Retry, errors
from sessionlog_client import _items as backend_items
from sessionlog_client._status import to_error
from sessionlog_client.convert import (
    event_from_dict,
    event_type,
    message_to_dict,
    message_to_json,
    struct_to_dict,
    type_name,
)
from sessionlog_client.v1 import event_pb2, message_pb2
from sessionlog_client.v1 import session_log_service_pb2 as pb

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

ROLE_COLOURS = {
    message_pb2.ROLE_SYSTEM: "\033[35m",
    message_pb2.ROLE_USER: "\033[32m",
    message_pb2.ROLE_ASSISTANT: "\033[36m",
    message_pb2.ROLE_TOOL: "\033[33m",
}
RESET = "\033[0m"

# Event types that are messages: appending one with no content is almost always a mistake.
MESSAGE_TYPES = frozenset(
    {
        event_pb2.EVENT_TYPE_SYSTEM_MESSAGE,
        event_pb2.EVENT_TYPE_USER_MESSAGE,
        event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE,
        event_pb2.EVENT_TYPE_TOOL_RESULT,
    }
)
FOREVER = Retry(give_up_after=float("inf"))
RETRY_FOR = 10.0
"""--retry-for's default: about a failover (etcd's lease TTL and a promotion) and the default
--timeout of one call."""
NO_RETRY = Retry(give_up_after=0.0)
FOLLOW_HEARTBEAT = 5.0
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


def add_commands(commands: Any, built_on: Sequence[Callable[[Any], None]] = ()) -> None:
    """Register the client subcommands on the `sessionlog` parser; ``built_on`` registers the
    groups built on this module's helpers (``transfer``), given its subcommand maker, where
    their commands go in the list (``cli.build_parser`` passes them: this module imports none
    of them)."""
    common = _common_flags()

    def sub(name: str, help_text: str, run: Callable[[argparse.Namespace], int]) -> Any:
        parser = commands.add_parser(name, help=help_text, description=help_text, parents=[common])
        parser.set_defaults(run=run)
        return parser

    p = sub("append", "append events to a session (one, or many from --events)", _append)
    p.add_argument("session_id")
    p.add_argument(
        "type",
        nargs="?",
        help="event type, e.g. user_message, assistant_message, tool_result, turn_start",
    )
    p.add_argument("--content", help="shorthand for data {'content': CONTENT}")
    p.add_argument("--data", help="the event's data as a JSON object")
    p.add_argument("--replace", metavar="START:STOP", help="replace the range START..STOP")
    p.add_argument(
        "--events",
        metavar="FILE",
        help='events as JSON lines (or a JSON list), e.g. {"type": "user_message", "data": '
        '{"content": "hi"}} (also "replace": [START, STOP], "time"); - reads stdin. '
        "All are appended in one atomic batch",
    )
    p.add_argument("--expected-seq", type=natural, help="fail with SEQ_CONFLICT unless at this seq")
    p.add_argument(
        "--request-id",
        help="idempotency key: running the command again with it gets the first result "
        "(default: a fresh one, kept across the client's own retries)",
    )
    p.add_argument("--lease-holder", default="", help="the writer lease holder to write as")

    p = sub(
        "hide",
        "hide the surface positions START..STOP (inclusive) from the model's view, adding no "
        "message; the events stay in the log",
        _hide,
    )
    p.add_argument("session_id")
    p.add_argument("start", type=int, help="first position hidden")
    p.add_argument("stop", type=int, help="last position hidden (may run past the end)")
    p.add_argument("--reason", help="kept in the hide event's data as 'reason'")
    p.add_argument("--expected-seq", type=natural, help="fail with SEQ_CONFLICT unless at this seq")

    p = sub(
        "delete",
        "erase a session for good: its events, request records, lease and audit, on the primary "
        "and its replicas (see README 'Erasure'; run `admin compact` to clear the data file)",
        _delete,
    )
    p.add_argument("session_id")
    p.add_argument("--expected-seq", type=natural, help="fail with SEQ_CONFLICT unless at this seq")
    p.add_argument("--lease-holder", default="", help="the writer lease holder to delete as")
    p.add_argument(
        "--force", action="store_true", help="delete under another holder's live lease (admin)"
    )
    p.add_argument("--reason", default="", help="kept in the erasure audit record")

    p = sub(
        "redact",
        "erase the data of events SEQ... of a session, keeping their seq, type and time",
        _redact,
    )
    p.add_argument("session_id")
    p.add_argument("seqs", type=int, nargs="+", metavar="SEQ", help="the events to redact")
    p.add_argument("--reason", default="", help="kept on each redacted event and in the audit")
    p.add_argument("--lease-holder", default="", help="the writer lease holder to redact as")

    p = sub(
        "tail",
        "print a session's events and follow new ones; resumes by itself after a restart",
        _tail,
    )
    p.add_argument("session_id", nargs="?", help="the session (or --prefix)")
    p.add_argument("--from-seq", type=natural, help="first seq to print (default 0)")
    p.add_argument("--last", type=natural, metavar="N", help="start with the last N stored events")
    p.add_argument("--no-follow", action="store_true", help="stop after the stored events")
    p.add_argument(
        "--no-resume",
        action="store_true",
        help="exit (code 3) when the connection is lost, instead of resuming from the next seq",
    )
    p.add_argument(
        "--prefix",
        help="follow every session whose id starts with PREFIX (FollowSessions; a tenant token "
        "follows its own sessions)",
    )
    p.add_argument(
        "--filter",
        metavar="EXPR",
        help="with --prefix (or alone): only sessions whose record matches this ListSessions "
        "filter, e.g. 'labels.team = \"core\"'",
    )
    p.add_argument(
        "--from-position",
        type=int,
        default=1,
        help="with --prefix: the change-feed position to start at (default 1, the beginning; "
        "each printed line names its position: resume with that position + 1)",
    )
    p.add_argument(
        "--every-group",
        action="store_true",
        help="with --prefix, on a sharded cluster: follow every group's change feed (the groups "
        "from GetShardMap of --server), each from its own cursor; each line names its group",
    )
    p.add_argument(
        "--cursor",
        action="append",
        default=[],
        metavar="GROUP=POSITION",
        help="with --every-group: the position to start GROUP's feed at (default 1; repeat it "
        "for each group)",
    )

    p = sub("surface", "print the events the model sees", _surface)
    p.add_argument("session_id")
    p.add_argument("--at-seq", type=natural, help="as the surface was when the log ended here")

    p = sub("state", "print the session's state (its events' state deltas, folded)", _state)
    p.add_argument("session_id")
    p.add_argument("--at-seq", type=natural, help="as the state was when the log ended here")

    p = sub("usage", "print the session's token usage per model (the usage ledger)", _usage_cmd)
    p.add_argument("session_id")
    p.add_argument("--at-seq", type=natural, help="as the totals were when the log ended here")
    p.add_argument(
        "--tree",
        action="store_true",
        help="add the session's fork descendants, each counting only its own events",
    )

    p = sub("messages", "print the derived messages as a transcript", _messages)
    p.add_argument("session_id")
    p.add_argument("--at-seq", type=natural, help="as the model saw them when the log ended here")
    p.add_argument(
        "--last",
        type=natural,
        metavar="N",
        help="only the last N messages, read from the end of the log (summaries are then not "
        "marked with the range they replace: that would read the whole surface)",
    )

    p = sub(
        "items",
        "print what the framework backends stored, in view (hides applied): one JSON line per "
        'event, {"seq", "item"} for an OpenAI Agents item, {"seq", "message", "part"} for a '
        "Pydantic AI part (message only on a message's first part), "
        '{"seq", "event"} for a Google ADK event',
        _items,
    )
    p.add_argument("session_id")
    p.add_argument("--last", type=natural, metavar="N", help="only the last N lines")

    p = sub("create", "create a session with initial events, atomically", _create)
    p.add_argument("session_id")
    _record_flags(p)
    _retention_flags(p, update=False)
    p.add_argument(
        "--parent",
        default="",
        metavar="SESSION",
        help="make it a sub-agent child of SESSION (it starts empty, linked to the parent)",
    )
    p.add_argument(
        "--parent-seq", type=natural, help="with --parent: the seq of the tool call that spawned it"
    )
    p.add_argument(
        "--events",
        metavar="FILE",
        help='events as a JSON list or JSON lines, e.g. [{"type": "system_message", "data": '
        '{"content": "hi"}}] (- reads stdin; default: no events)',
    )
    p.add_argument(
        "--request-id",
        help="idempotency key: running the command again with it gets the first result "
        "(default: a fresh one, kept across the client's own retries)",
    )

    p = sub("seed", "create a session from chat messages (OpenAI format)", _seed)
    p.add_argument("session_id")
    p.add_argument(
        "messages",
        metavar="FILE",
        help='JSON list of messages, e.g. [{"role": "user", "content": "hi"}] (- reads stdin)',
    )
    p.add_argument(
        "--request-id",
        help="idempotency key: running the command again with it gets the first result "
        "(default: a fresh one, kept across the client's own retries)",
    )

    p = sub("get", "describe a session (counts, parent, lease, lease audit)", _get)
    p.add_argument("session_id")

    p = sub("sessions", "list sessions (id order, or newest update first), filtered", _sessions)
    p.add_argument("--prefix", default="", help="only ids starting with this")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument(
        "--filter",
        default="",
        help='AIP-160 subset, terms joined by AND: labels.KEY = "V", labels.KEY:*, owner = "X", '
        'status = "X", parent = "ID", update_time > "RFC3339", pinned = true, '
        'expire_time < "RFC3339"',
    )
    p.add_argument(
        "--order-by",
        default="",
        choices=("", "session_id", "update_time desc"),
        help='"session_id" (default) or "update_time desc" (newest update first)',
    )

    p = sub(
        "label",
        "set labels on a session: KEY=VALUE sets, KEY- removes; other labels stay",
        _label,
    )
    p.add_argument("session_id")
    p.add_argument("labels", nargs="+", metavar="KEY=VALUE|KEY-")

    p = sub(
        "update",
        "set a session's title, owner, status or labels (only the fields given change)",
        _update,
    )
    p.add_argument("session_id")
    _record_flags(p)
    p.add_argument(
        "--remove-label", action="append", default=[], metavar="KEY", help="remove this label"
    )
    _retention_flags(p, update=True)

    p = sub("fork", "copy a session's events 0..AT_SEQ into a new session (rewind)", _fork)
    p.add_argument("parent_session_id")
    p.add_argument("--at-seq", type=natural, help="last seq copied (default: the whole log)")
    p.add_argument("--to", default="", help="the new session's id (default: generated)")
    p.add_argument(
        "--request-id",
        help="idempotency key: running the command again with it gets the first result "
        "(default: a fresh one, kept across the client's own retries)",
    )

    p = sub("lease", "acquire, renew or release a session's writer lease", _lease)
    p.add_argument("action", choices=("acquire", "renew", "release"))
    p.add_argument("session_id")
    p.add_argument("holder")
    p.add_argument("--ttl", type=float, default=30.0, help="seconds (acquire, renew)")
    p.add_argument("--force", action="store_true", help="release another holder's lease")

    for add in built_on:
        add(sub)

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
        parents=[common],
    )
    p.set_defaults(run=_replication_status)


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


def _event_type(name: str) -> event_pb2.EventType:
    try:
        return event_type(name)
    except ValueError as exc:
        _usage(str(exc))


# -- append ----------------------------------------------------------------------------------------


def _append(args: argparse.Namespace) -> int:
    events = _batch(args) if args.events else [_one_event(args)]
    with _client(args) as client:
        reply = client.append(
            args.session_id,
            events,
            expected_seq=args.expected_seq,
            request_id=args.request_id,
            lease_holder=args.lease_holder,
        )
    if args.json:
        _print_json(message_to_json(reply))
    else:
        for stored in reply.events:
            print(f"appended seq {stored.seq}; next seq {reply.next_seq}")
    return 0


def _hide(args: argparse.Namespace) -> int:
    if args.start < 0 or args.stop < 0:
        _usage("START and STOP are seqs: 0 or more")
    with _client(args) as client:
        reply = client.hide(
            args.session_id,
            args.start,
            args.stop,
            reason=args.reason,
            expected_seq=args.expected_seq,
        )
    if args.json:
        _print_json(message_to_json(reply))
    else:
        print(
            f"hid {args.start}..{args.stop} at seq {reply.events[0].seq}; next seq {reply.next_seq}"
        )
    return 0


def _delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.delete_session(
            args.session_id,
            expected_seq=args.expected_seq,
            lease_holder=args.lease_holder,
            force=args.force,
            reason=args.reason,
        )
    if args.json:
        _print_json(message_to_json(reply))
    else:
        print(
            f"deleted {args.session_id} ({reply.event_count} events) at position {reply.position}"
        )
    return 0


def _redact(args: argparse.Namespace) -> int:
    if any(seq < 0 for seq in args.seqs):
        _usage("SEQ is a seq: 0 or more")
    with _client(args) as client:
        reply = client.redact_events(
            args.session_id, args.seqs, reason=args.reason, lease_holder=args.lease_holder
        )
    if args.json:
        _print_json(message_to_json(reply))
    elif reply.seqs:
        print(f"redacted seqs {', '.join(map(str, reply.seqs))} at position {reply.position}")
    else:
        print("nothing to redact: every named event was already redacted")
    return 0


def _batch(args: argparse.Namespace) -> list[event_pb2.Event]:
    if args.type or args.content is not None or args.data or args.replace:
        _usage("--events FILE takes the events from the file: give no TYPE, --content, --data")
    items = _json_items(args.events, "events")
    if not items:
        _usage(f"no events in {args.events!r}")
    return [_event_from_item(item, number) for number, item in enumerate(items, start=1)]


def _event_from_item(item: dict[str, Any], number: int) -> event_pb2.Event:
    try:
        built: event_pb2.Event = event_from_dict(item)
    except (ValueError, TypeError) as exc:
        _usage(f"event {number}: {exc}")
    return built


def _one_event(args: argparse.Namespace) -> event_pb2.Event:
    if not args.type:
        _usage("append needs an event TYPE (e.g. user_message) or --events FILE")
    event = event_pb2.Event(type=_event_type(args.type))
    if args.content is None and args.data is None and event.type in MESSAGE_TYPES:
        _usage(f"{args.type} needs --content TEXT or --data JSON (or --events FILE)")
    if args.data:
        try:
            data = json.loads(args.data)
        except json.JSONDecodeError as exc:
            _usage(f"--data is not JSON: {exc}")
        if not isinstance(data, dict):
            _usage("--data must be a JSON object")
        event.data.update(data)
    if args.content is not None:
        event.data.update({"content": args.content})
    if args.replace:
        start, _, stop = args.replace.partition(":")
        try:
            event.surface_op.replace.start_seq = int(start)
            event.surface_op.replace.stop_seq = int(stop)
        except ValueError:
            _usage("--replace takes START:STOP, e.g. 0:5")
    return event


# -- tail ------------------------------------------------------------------------------------------


def _tail(args: argparse.Namespace) -> int:
    if args.prefix is None and args.filter is not None and args.session_id is None:
        args.prefix = ""  # a filter alone follows every session it matches
    if (args.session_id is None) == (args.prefix is None):
        _usage("tail takes a SESSION_ID or --prefix PREFIX (one of them)")
    if args.from_seq is not None and args.last is not None:
        _usage("give --from-seq or --last, not both")
    if args.prefix is not None:
        return _tail_groups(args) if args.every_group else _tail_prefix(args)
    retry = NO_RETRY if args.no_resume else FOREVER
    with _client(args, retry=retry) as client:
        seq = args.from_seq or 0
        if args.last is not None:
            count = client.get_session(args.session_id).session.event_count
            seq = max(0, count - max(0, args.last))
        if args.no_follow:
            events: Iterator[event_pb2.Event] = client.since(args.session_id, seq)
        else:
            events = client.follow(args.session_id, seq, heartbeat=FOLLOW_HEARTBEAT)
        for event in events:
            print(_json_line(event) if args.json else _pretty_event(event), flush=True)
    return 0


def _tail_prefix(args: argparse.Namespace) -> int:
    """Every event of every session under the prefix, from the change feed, resuming from the
    next position after a lost connection (unless --no-resume)."""
    retry = NO_RETRY if args.no_resume else FOREVER
    with _client(args, retry=retry) as client:
        for position, session_id, event in _feed_events(client, args):
            if event is None:  # the session was deleted
                if args.json:
                    line = {"position": position, "session_id": session_id, "deleted": True}
                    print(json.dumps(line, ensure_ascii=False), flush=True)
                else:
                    print(f"{position:>6}  {session_id}  deleted", flush=True)
            elif args.json:
                line = {"position": position, "session_id": session_id, **message_to_json(event)}
                print(json.dumps(line, ensure_ascii=False), flush=True)
            else:
                print(f"{position:>6}  {session_id}  {_pretty_event(event)}", flush=True)
    return 0


def _tail_groups(args: argparse.Namespace) -> int:
    """``_tail_prefix`` over every group's feed, a cursor per group (``shard.feeds``)."""
    cursors: dict[str, int] = {}
    for text in args.cursor:
        group, sep, position = text.partition("=")
        if not sep or not group or not position.isdigit():
            _usage(f"--cursor takes GROUP=POSITION, not {text!r}")
        cursors[group] = int(position)
    retry = NO_RETRY if args.no_resume else FOREVER
    with _client(args) as client:
        groups = feeds.groups_of(client, args.timeout)
    if not groups:
        _usage(
            f"{args.server} holds no shard map (not sharded): use tail --prefix without "
            "--every-group"
        )
    unknown = sorted(set(cursors) - {name for name, _ in groups})
    if unknown:
        known = ", ".join(name for name, _ in groups)
        _usage(f"--cursor names no group of the shard map: {', '.join(unknown)} (groups: {known})")

    def connect(address: str) -> Client:
        return _client(argparse.Namespace(**{**vars(args), "server": address}), retry)

    lines = feeds.follow_groups(
        groups,
        connect,
        retry.backoff,
        prefix=args.prefix,
        filter_text=args.filter or "",
        follow=not args.no_follow,
        cursors=cursors,
    )
    for line in lines:
        if args.json:
            shown = {"group": line.group, "position": line.position, "session_id": line.session_id}
            what = {"deleted": True} if line.event is None else message_to_json(line.event)
            print(json.dumps({**shown, **what}, ensure_ascii=False))
        else:
            event = "deleted" if line.event is None else _pretty_event(line.event)
            print(f"{line.group}  {line.position:>6}  {line.session_id}  {event}", flush=True)
    return 0


def _feed_events(
    client: Client, args: argparse.Namespace
) -> Iterator[tuple[int, str, event_pb2.Event | None]]:
    """The events of the followed sessions' changes (FollowSessions, which resumes after the
    last position it heard when the connection drops); a REDACT change gives its redacted
    events again (as now stored), a DELETE change None."""
    changes = client.follow_sessions(
        prefix=args.prefix,
        filter=args.filter or "",
        after=max(0, args.from_position - 1),
        follow=not args.no_follow,
        heartbeat=FOLLOW_HEARTBEAT,
    )
    with changes:
        for change in changes:
            if change.deleted:
                yield change.position, change.session_id, None
            for event in change.events:
                yield change.position, change.session_id, event


def _json_line(event: event_pb2.Event) -> str:
    return json.dumps(message_to_json(event), ensure_ascii=False)


def _pretty_event(event: event_pb2.Event) -> str:
    kind = type_name(event.type)
    when = event.time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
    op = ""
    if event.surface_op.WhichOneof("kind") == "replace":
        r = event.surface_op.replace
        verb = "hides" if event.type == event_pb2.EVENT_TYPE_HIDE else "replaces"
        op = f" {verb} {r.start_seq}..{r.stop_seq}"
    data = struct_to_dict(event.data)
    shown = "[redacted]" if event.HasField("redacted") else json.dumps(data, ensure_ascii=False)
    line = f"{event.seq:>6}  {when}  {kind}{op}  {shown}"
    if event.HasField("state_delta"):
        delta = json.dumps(struct_to_dict(event.state_delta), ensure_ascii=False)
        line += f"  state {delta}"
    if event.HasField("usage"):
        u = event.usage
        line += f"  usage {u.model} {u.input_tokens} in / {u.output_tokens} out"
    return escaped(line)


# -- reads -----------------------------------------------------------------------------------------


def _surface(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.surface(args.session_id, at_seq=args.at_seq)
    if args.json:
        _print_json(message_to_json(reply))
    else:
        for event in reply.events:
            print(_pretty_event(event))
    return 0


def _state(args: argparse.Namespace) -> int:
    with _client(args) as client:
        state, count = client.get_state_with_count(args.session_id, at_seq=args.at_seq)
    if args.json:
        _print_json({"state": state, "event_count": count})
    else:
        print(json.dumps(state, ensure_ascii=False, indent=2, sort_keys=True))
    return 0


USAGE_COLUMNS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")


def _usage_cmd(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.get_usage(args.session_id, at_seq=args.at_seq, include_descendants=args.tree)
    if args.json:
        _print_json(message_to_json(reply))
        return 0
    print(f"{reply.event_count} events")
    _print_usage_table(reply.usage)
    if list(reply.own_usage) != list(reply.usage) and not args.tree:
        print("own (without the events copied from its parent):")
        _print_usage_table(reply.own_usage)
    if reply.descendant_session_ids:
        print("descendants: " + ", ".join(reply.descendant_session_ids))
    return 0


def _print_usage_table(usages: Any) -> None:
    """One row per model and a total: input (cached), output (reasoning), events."""
    rows = [(u.model, *(getattr(u, c) for c in USAGE_COLUMNS), u.event_count) for u in usages]
    if not rows:
        print("no usage recorded")
        return
    if len(rows) > 1:
        rows.append(("total", *(sum(r[i] for r in rows) for i in range(1, 6))))
    width = max(len("model"), *(len(r[0]) for r in rows))
    header = ("model", "input", "cached", "output", "reasoning", "events")
    print(f"{header[0]:<{width}}" + "".join(f"  {h:>10}" for h in header[1:]))
    for row in rows:
        print(f"{row[0]:<{width}}" + "".join(f"  {n:>10}" for n in row[1:]))


def _tokens(usages: Any) -> tuple[int, int]:
    """(input, output) tokens summed over models."""
    return sum(u.input_tokens for u in usages), sum(u.output_tokens for u in usages)


def _messages(args: argparse.Namespace) -> int:
    if args.last is not None and args.last < 0:
        _usage("--last takes a number of messages: 0 or more")
    with _client(args) as client:
        if args.last is not None:
            reply = client.last_messages(args.session_id, args.last, at_seq=args.at_seq)
            replaced: dict[int, tuple[int, int]] = {}
        else:
            reply = client.derive_messages(args.session_id, at_seq=args.at_seq)
            replaced = {} if args.json else _replaced_ranges(client, args.session_id, reply)
    if args.json:
        _print_json(_messages_json(reply))
        return 0
    for line in _transcript(reply, replaced, _colour(args)):
        print(line)
    return 0


_STORED_KEYS = ("item", "message", "part", "event")
"""What sessionlog_client.openai_agents, .pydantic_ai and .google_adk keep in an event (as
KEY_json)."""


def _items(args: argparse.Namespace) -> int:
    with _client(args) as client, client.since(args.session_id) as stream:
        shown = backend_items.in_view(list(stream))
    lines = []
    for event in shown:
        line: dict[str, Any] = {}
        for key in _STORED_KEYS:
            found, value = backend_items.get_exact(event, key)
            if found:
                line[key] = value
        if line:
            lines.append({"seq": event.seq, **line})
    if args.last is not None:
        lines = lines[-args.last :] if args.last > 0 else []
    for entry in lines:
        print(json.dumps(entry, ensure_ascii=False))
    return 0


def _replaced_ranges(
    client: Client, session_id: str, reply: pb.DeriveMessagesResponse
) -> dict[int, tuple[int, int]]:
    """The replace range of each message that comes from a replace event (a summary), by seq.
    DeriveMessages names no ranges; the surface at the same length does, and a seq's range never
    changes, so the two calls agree even if events are appended in between."""
    if not reply.replace_generation or not reply.event_count:
        return {}
    surface = client.surface(session_id, at_seq=reply.event_count - 1)
    return {
        e.seq: (e.surface_op.replace.start_seq, e.surface_op.replace.stop_seq)
        for e in surface.events
        if e.surface_op.WhichOneof("kind") == "replace"
    }


def _transcript(
    reply: pb.DeriveMessagesResponse, replaced: dict[int, tuple[int, int]], colour: bool
) -> Iterator[str]:
    """One line per message, then one per tool call: ``[seq] role (name) [replaces seqs A-B]:
    content``, ``-> name(arguments)  [call ID]``; a tool result names the call it answers. What
    the messages hold is ``terminal.escaped``: only the role's colour reaches the terminal."""
    calls: dict[str, tuple[str, int]] = {}  # call id -> (function name, seq of its message)
    for seq, message in zip(reply.seqs, reply.messages, strict=True):
        role = message_pb2.Role.Name(message.role)[len("ROLE_") :].lower()
        label = f"{ROLE_COLOURS[message.role]}{role}{RESET}" if colour else role
        extra = f" ({message.name})" if message.HasField("name") else ""
        if seq in replaced:
            start, stop = replaced[seq]
            extra += f" [replaces {f'seq {start}' if start == stop else f'seqs {start}-{stop}'}]"
        if message.HasField("tool_call_id"):
            answered = calls.get(message.tool_call_id)
            origin = f"{answered[0]} from [{answered[1]}], " if answered else ""
            extra += f" [answers {origin}call {message.tool_call_id}]"
        content = message.content if message.HasField("content") else ""
        yield f"[{seq}] {label}" + escaped(f"{extra}:{' ' if content else ''}{content}")
        for call in message.tool_calls:
            name, arguments, call_id = _tool_call(struct_to_dict(call))
            if call_id:
                calls[call_id] = (name, seq)
            yield escaped(
                f"      -> {name}({arguments})" + (f"  [call {call_id}]" if call_id else "")
            )


def _tool_call(call: dict[str, Any]) -> tuple[str, str, str]:
    """(name, arguments, id) of a tool call in OpenAI's shape ({id, function: {name, arguments}})
    or a flat one. Arguments given as a JSON string print as written, in the caller's key order;
    an object went through a protobuf Struct, which keeps no key order, so it prints compact with
    sorted keys (whole numbers without ".0": see ``struct_to_dict``)."""
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name", call.get("name"))
    arguments = function.get("arguments", call.get("arguments", call.get("input")))
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    call_id = call.get("id")
    return (
        name if isinstance(name, str) else "tool",
        arguments,
        call_id if isinstance(call_id, str) else "",
    )


def _messages_json(reply: pb.DeriveMessagesResponse) -> dict[str, Any]:
    """The derived messages in the chat format the clients use (``message_to_dict`` with its
    extras: reasoning_content, metadata, created_at), each with the seq it came from."""
    messages = []
    for seq, message in zip(reply.seqs, reply.messages, strict=True):
        chat = message_to_dict(message, extra=True)
        if "created_at" in chat:
            chat["created_at"] = message.created_at.ToJsonString()
        messages.append({"seq": seq, **chat})
    return {
        "messages": messages,
        "event_count": reply.event_count,
        "replace_generation": reply.replace_generation,
    }


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


# -- sessions --------------------------------------------------------------------------------------


def _json_items(source: str, what: str) -> list[dict[str, Any]]:
    """A JSON list of objects, or JSON lines (one object per line, blank lines skipped)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        _usage(f"cannot read {what} from {source!r}: {exc}")
    try:
        items = json.loads(text) if text.lstrip().startswith("[") else _json_lines(text)
    except json.JSONDecodeError as exc:
        _usage(f"cannot read {what} from {source!r}: {exc}")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        _usage(f"{what} must be JSON objects, as a list or one per line")
    return items


def _json_lines(text: str) -> list[Any]:
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise json.JSONDecodeError(f"line {number}: {exc.msg}", exc.doc, exc.pos) from None
    return items


def _record_flags(parser: Any) -> None:
    parser.add_argument("--title", help="the session's title")
    parser.add_argument("--owner", help="who the session belongs to")
    parser.add_argument("--status", help="a status of your choosing, e.g. running or done")
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a label (repeat it)"
    )


def _retention_flags(parser: Any, *, update: bool) -> None:
    expiry = parser.add_mutually_exclusive_group()
    expiry.add_argument(
        "--ttl",
        metavar="DURATION",
        help="the server deletes the session this long from now (90s, 12h, 7d, 2w)",
    )
    expiry.add_argument(
        "--expire-time",
        metavar="RFC3339",
        help="the server deletes the session at this time"
        + (' ("never" clears the expiry)' if update else ' ("never": none)'),
    )
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument(
        "--pin",
        dest="pinned",
        action="store_const",
        const=True,
        help="keep the session whatever its expiry and the server's retention policy say",
    )
    if update:
        pin.add_argument(
            "--unpin", dest="pinned", action="store_const", const=False, help="undo --pin"
        )


def _retention_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The client's ttl / expire_time / pinned arguments from the retention flags given."""
    fields: dict[str, Any] = {}
    if args.ttl is not None:
        try:
            fields["ttl"] = retention.parse_duration(args.ttl) / retention.NS
        except ValueError as exc:
            _usage(f"--ttl: {exc}")
    if args.expire_time == "never":
        fields["expire_time"] = None
    elif args.expire_time is not None:
        try:
            Timestamp().FromJsonString(args.expire_time)
        except ValueError:
            _usage(
                "--expire-time wants an RFC 3339 time with a zone, such as "
                f'"2030-01-02T15:04:05Z" (or "never"), not {args.expire_time[:40]!r}'
            )
        fields["expire_time"] = args.expire_time
    if args.pinned is not None:
        fields["pinned"] = args.pinned
    return fields


def _label_pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            _usage(f"a label is KEY=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


def _create(args: argparse.Namespace) -> int:
    items = _json_items(args.events, "events") if args.events else []
    events = [_event_from_item(item, number) for number, item in enumerate(items, start=1)]
    if args.parent_seq is not None and not args.parent:
        _usage("--parent-seq needs --parent")
    with _client(args) as client:
        reply = client.create_session(
            args.session_id,
            events,
            request_id=args.request_id,
            title=args.title or "",
            labels=_label_pairs(args.label),
            owner=args.owner or "",
            status=args.status or "",
            parent_session_id=args.parent,
            parent_seq=args.parent_seq,
            **_retention_fields(args),
        )
    if args.json:
        _print_json(message_to_json(reply))
    else:
        print(f"created {reply.session.session_id} with {reply.session.event_count} events")
    return 0


def _seed(args: argparse.Namespace) -> int:
    messages = _json_items(args.messages, "messages")
    with _client(args) as client:
        reply = client.seed_session(args.session_id, messages, request_id=args.request_id)
    if args.json:
        _print_json(message_to_json(reply))
        return 0
    dropped = f"; dropped {len(reply.drops)} of unknown role" if reply.drops else ""
    print(f"seeded {reply.session.session_id} with {reply.session.event_count} events{dropped}")
    return 0


def _get(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.get_session(args.session_id)
    if not reply.session.exists:
        print(f"sessionlog: NOT_FOUND: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_REFUSED
    described = message_to_json(reply)
    if args.json:
        _print_json(described)
        return 0
    for name, value in described["session"].items():
        print(f"{name:<18}  {escaped(_text(value))}")
    for entry in described["lease_audit"]:
        print(f"{'lease audit':<18}  {escaped(_text(entry))}")
    return 0


def _text(value: Any) -> str:
    """A value of a described session as text: objects as compact JSON, others as they are."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _sessions(args: argparse.Namespace) -> int:
    """One line per session; the ones with usage say their tokens, and a total line follows."""
    shown = 0
    spent = [0, 0]
    with _client(args) as client:
        pages = client.list_sessions(
            prefix=args.prefix,
            page_size=min(1000, max(1, args.limit)),
            filter=args.filter,
            order_by=args.order_by,
        )
        for page in pages:
            for session in page.sessions[: args.limit - shown]:
                if args.json:
                    _print_json(message_to_json(session))
                    shown += 1
                    continue
                line = _session_line(session)
                if session.usage:
                    tokens = _tokens(session.usage)
                    spent = [spent[0] + tokens[0], spent[1] + tokens[1]]
                    line += f"\t{tokens[0]} in / {tokens[1]} out tokens"
                print(line)
                shown += 1
            if shown >= args.limit:
                break
    if any(spent):
        print(f"total\t{shown} sessions\t{spent[0]} in / {spent[1]} out tokens")
    return 0


def _session_line(session: Any) -> str:
    """id and events, then the title, labels, expiry and pin when it has them (tab-separated)."""
    parts = [session.session_id, f"{session.event_count} events"]
    if session.title:
        parts.append(json.dumps(session.title, ensure_ascii=False))
    labels = ",".join(f"{k}={v}" for k, v in sorted(session.labels.items()))
    if labels:
        parts.append(labels)
    if session.HasField("expire_time"):
        parts.append(f"expires {session.expire_time.ToJsonString()}")
    if session.pinned:
        parts.append("pinned")
    return escaped("\t".join(parts))


def _label(args: argparse.Namespace) -> int:
    removed = [item[:-1] for item in args.labels if item.endswith("-") and "=" not in item]
    pairs = _label_pairs([item for item in args.labels if item[:-1] not in removed])
    with _client(args) as client:
        session = client.update_session(args.session_id, set_labels=pairs, remove_labels=removed)
    return _print_session(args, session)


def _update(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("title", "owner", "status")
        if getattr(args, name) is not None
    }
    pairs = _label_pairs(args.label)
    fields.update(_retention_fields(args))
    if not fields and not pairs and not args.remove_label:
        _usage(
            "name a field to set: --title, --owner, --status, --label, --remove-label, --ttl, "
            "--expire-time, --pin or --unpin"
        )
    with _client(args) as client:
        session = client.update_session(
            args.session_id, set_labels=pairs, remove_labels=args.remove_label, **fields
        )
    return _print_session(args, session)


def _print_session(args: argparse.Namespace, session: Any) -> int:
    if args.json:
        _print_json(message_to_json(session))
    else:
        print(_session_line(session))
    return 0


def _fork(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.fork_session(
            args.parent_session_id,
            at_seq=args.at_seq,
            session_id=args.to,
            request_id=args.request_id,
        )
    if args.json:
        _print_json(message_to_json(reply))
    else:
        print(reply.session.session_id)
    return 0


def _lease(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "acquire":
            reply: Any = client.acquire_lease(args.session_id, args.holder, ttl=args.ttl)
        elif args.action == "renew":
            reply = client.renew_lease(args.session_id, args.holder, ttl=args.ttl)
        else:
            reply = client.release_lease(args.session_id, args.holder, force=args.force)
    if args.json:
        _print_json(message_to_json(reply))
    elif args.action == "release":
        print(f"released the lease of {args.session_id} (token {reply.released.token})")
    else:
        lease = reply.lease
        print(
            f"{lease.holder} holds the lease of {args.session_id}: token {lease.token}, "
            f"expires {lease.expire_time.ToJsonString()}"
        )
    return 0
