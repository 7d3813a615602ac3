"""The client subcommands of `sessionlog`: talk to a running server from a terminal.

Exit codes scripts can rely on:
    0  success
    1  the server refused the request (the line names the reason, e.g. SEQ_CONFLICT)
    2  bad usage
    3  the server could not be reached (or went away)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc

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


def add_commands(commands: Any) -> None:
    """Register the client subcommands on the `sessionlog` parser."""
    common = connection_options(
        os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051"),
        "server address HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
    )

    def sub(name: str, help_text: str, run: Callable[[argparse.Namespace], int]) -> Any:
        parser = commands.add_parser(name, help=help_text, description=help_text, parents=[common])
        parser.set_defaults(run=run)
        return parser

    p = sub("append", "append one event to a session", _append)
    p.add_argument("session_id")
    p.add_argument(
        "type",
        help="event type, e.g. user_message, assistant_message, tool_result, turn_start",
    )
    p.add_argument("--content", help="shorthand for data {'content': CONTENT}")
    p.add_argument("--data", help="the event's data as a JSON object")
    p.add_argument("--replace", metavar="START:STOP", help="replace the range START..STOP")
    p.add_argument("--expected-seq", type=int, help="fail with SEQ_CONFLICT unless at this seq")
    p.add_argument("--request-id", default="", help="idempotency key")
    p.add_argument("--lease-holder", default="", help="the writer lease holder to write as")
    p.add_argument("--json", action="store_true", help="print the stored event as JSON")

    p = sub("tail", "print a session's events; follow new ones as they are appended", _tail)
    p.add_argument("session_id")
    p.add_argument("--from-seq", type=int, default=0, help="first seq to print (default 0)")
    p.add_argument("--no-follow", action="store_true", help="stop after the stored events")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    p = sub("surface", "print the events the model sees", _surface)
    p.add_argument("session_id")
    p.add_argument("--at-seq", type=int, help="as the surface was when the log ended here")
    p.add_argument("--json", action="store_true", help="print the response as JSON")

    p = sub("messages", "print the derived messages as a transcript", _messages)
    p.add_argument("session_id")
    p.add_argument("--at-seq", type=int, help="as the model saw them when the log ended here")
    p.add_argument("--json", action="store_true", help="print the response as JSON")

    p = sub("create", "create a session with initial events, atomically", _create)
    p.add_argument("session_id")
    p.add_argument(
        "--events",
        metavar="FILE",
        help='JSON list of events, e.g. [{"type": "system_message", "data": {"content": "hi"}}]'
        " ('-' reads stdin; default: no events)",
    )

    p = sub("seed", "create a session from chat messages (OpenAI format)", _seed)
    p.add_argument("session_id")
    p.add_argument(
        "messages",
        metavar="FILE",
        help='JSON list of messages, e.g. [{"role": "user", "content": "hi"}] (- reads stdin)',
    )

    p = sub("get", "describe a session (counts, parent, lease, lease audit)", _get)
    p.add_argument("session_id")

    p = sub("sessions", "list sessions in id order", _sessions)
    p.add_argument("--prefix", default="", help="only ids starting with this")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    p = sub("fork", "copy a session's events 0..AT_SEQ into a new session (rewind)", _fork)
    p.add_argument("parent_session_id")
    p.add_argument("--at-seq", type=int, help="last seq copied (default: the whole log)")
    p.add_argument("--to", default="", help="the new session's id (default: generated)")

    p = sub("lease", "acquire, renew or release a session's writer lease", _lease)
    p.add_argument("action", choices=("acquire", "renew", "release"))
    p.add_argument("session_id")
    p.add_argument("holder")
    p.add_argument("--ttl", type=float, default=30.0, help="seconds (acquire, renew)")
    p.add_argument("--force", action="store_true", help="release another holder's lease")

    p = sub("health", "check the server's gRPC health: exit 0 when SERVING, 1 otherwise", _health)
    p.add_argument("--service", default="", help="one service's health (default: the server's)")


def connection_options(
    server_default: str | None, server_help: str, timeout_default: float = 10.0
) -> argparse.ArgumentParser:
    """A parent parser with what every command that calls a server takes: --server, --timeout,
    --token and the TLS files; ``channel`` turns the parsed values into a channel."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=server_default, help=server_help)
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
    """Run a client subcommand, turning gRPC failures into one line and an exit code."""
    # Ctrl-C ends a command (exit 130) even when started from a shell or job that ignores
    # SIGINT, as background jobs do: Python keeps an inherited "ignore" otherwise.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code: int = args.run(args)
        return code
    except grpc.RpcError as error:
        return _report(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _report(error: grpc.RpcError) -> int:
    code = error.code()
    reason = _reason(error) or code.name
    details = " ".join((error.details() or "").split())  # one line, whatever the server said
    print(f"sessionlog: {reason}: {details}", file=sys.stderr)
    unreachable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return EXIT_UNREACHABLE if unreachable else EXIT_REFUSED


def _reason(error: grpc.RpcError) -> str:
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)
    if status is None:
        return ""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


def _usage(message: str) -> NoReturn:
    """A bad argument value: one line on stderr and exit 2, like argparse's own usage errors."""
    print(f"sessionlog: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


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


def _stub(args: argparse.Namespace) -> pb_grpc.SessionLogServiceStub:
    return pb_grpc.SessionLogServiceStub(channel(args))  # type: ignore[no-untyped-call]


def _json(message: Message) -> str:
    """One line of JSON; zero values included (the first event's seq is 0, and scripts read it)."""
    return json_format.MessageToJson(
        message,
        indent=None,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def _event_type(name: str) -> event_pb2.EventType:
    key = name.upper()
    if not key.startswith("EVENT_TYPE_"):
        key = f"EVENT_TYPE_{key}"
    try:
        value: event_pb2.EventType = event_pb2.EventType.Value(key)  # type: ignore[assignment]
    except ValueError:
        names = ", ".join(n[len("EVENT_TYPE_") :].lower() for n in event_pb2.EventType.keys()[1:])
        _usage(f"unknown event type {name!r}; one of: {names}")
    return value


def _append(args: argparse.Namespace) -> int:
    event = event_pb2.Event(type=_event_type(args.type))
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
    request = pb.AppendRequest(
        session_id=args.session_id,
        events=[event],
        request_id=args.request_id,
        lease_holder=args.lease_holder,
    )
    if args.expected_seq is not None:
        request.expected_seq = args.expected_seq
    reply = _stub(args).Append(request, timeout=args.timeout)
    if args.json:
        print(_json(reply))
    else:
        for stored in reply.events:
            print(f"appended seq {stored.seq}; next seq {reply.next_seq}")
    return 0


def _tail(args: argparse.Namespace) -> int:
    request = pb.SinceRequest(
        session_id=args.session_id, seq=args.from_seq, follow=not args.no_follow
    )
    stream = _stub(args).Since(request)
    try:
        for event in _events(stream):
            print(_json(event) if args.json else _pretty_event(event), flush=True)
    finally:
        stream.cancel()
    return 0


def _events(stream: Iterator[pb.SinceResponse]) -> Iterator[event_pb2.Event]:
    for response in stream:
        yield from response.events


def _pretty_event(event: event_pb2.Event) -> str:
    kind = event_pb2.EventType.Name(event.type)[len("EVENT_TYPE_") :].lower()
    when = event.time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
    op = ""
    if event.surface_op.WhichOneof("kind") == "replace":
        r = event.surface_op.replace
        op = f" replaces {r.start_seq}..{r.stop_seq}"
    data = json_format.MessageToDict(event.data) if event.data.fields else {}
    return f"{event.seq:>6}  {when}  {kind}{op}  {json.dumps(data, ensure_ascii=False)}"


def _surface(args: argparse.Namespace) -> int:
    request = pb.SurfaceRequest(session_id=args.session_id)
    if args.at_seq is not None:
        request.at_seq = args.at_seq
    reply = _stub(args).Surface(request, timeout=args.timeout)
    if args.json:
        print(_json(reply))
    else:
        for event in reply.events:
            print(_pretty_event(event))
    return 0


def _messages(args: argparse.Namespace) -> int:
    request = pb.DeriveMessagesRequest(session_id=args.session_id)
    if args.at_seq is not None:
        request.at_seq = args.at_seq
    stub = _stub(args)
    reply = stub.DeriveMessages(request, timeout=args.timeout)
    if args.json:
        print(_json(reply))
        return 0
    for line in _transcript(reply, _replaced_ranges(stub, args, reply), sys.stdout.isatty()):
        print(line)
    return 0


def _replaced_ranges(
    stub: pb_grpc.SessionLogServiceStub, args: argparse.Namespace, reply: pb.DeriveMessagesResponse
) -> dict[int, tuple[int, int]]:
    """The replace range of each message that comes from a replace event (a summary), by seq.
    DeriveMessages names no ranges; the surface at the same length does, and a seq's range never
    changes, so the two calls agree even if events are appended in between."""
    if not reply.replace_generation or not reply.event_count:
        return {}
    request = pb.SurfaceRequest(session_id=args.session_id, at_seq=reply.event_count - 1)
    surface = stub.Surface(request, timeout=args.timeout)
    return {
        e.seq: (e.surface_op.replace.start_seq, e.surface_op.replace.stop_seq)
        for e in surface.events
        if e.surface_op.WhichOneof("kind") == "replace"
    }


def _transcript(
    reply: pb.DeriveMessagesResponse, replaced: dict[int, tuple[int, int]], colour: bool
) -> Iterator[str]:
    """One line per message, then one per tool call: ``[seq] role (name) [replaces seqs A-B]:
    content``, ``-> name(arguments)  [call ID]``; a tool result names the call it answers."""
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
        yield f"[{seq}] {label}{extra}:{' ' if content else ''}{content}"
        for call in message.tool_calls:
            name, arguments, call_id = _tool_call(json_format.MessageToDict(call))
            if call_id:
                calls[call_id] = (name, seq)
            yield f"      -> {name}({arguments})" + (f"  [call {call_id}]" if call_id else "")


def _tool_call(call: dict[str, Any]) -> tuple[str, str, str]:
    """(name, arguments, id) of a tool call in OpenAI's shape ({id, function: {name, arguments}})
    or a flat one. Arguments given as a JSON string print as written, in the caller's key order;
    an object went through a protobuf Struct, which keeps no key order, so it prints compact with
    sorted keys (and whole numbers, which a Struct holds as doubles, without ".0")."""
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name", call.get("name"))
    arguments = function.get("arguments", call.get("arguments", call.get("input")))
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(_whole(arguments), ensure_ascii=False, sort_keys=True)
    call_id = call.get("id")
    return (
        name if isinstance(name, str) else "tool",
        arguments,
        call_id if isinstance(call_id, str) else "",
    )


def _whole(value: Any) -> Any:
    """``value`` with integral floats as ints, nested lists and objects included."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def _health(args: argparse.Namespace) -> int:
    """One line: the serving status, or why there is none. For container health checks, so any
    answer but SERVING (unreachable, unknown service, refused) exits 1."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel(args) as opened:
        stub = health_pb2_grpc.HealthStub(opened)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=args.timeout,
            )
        except grpc.RpcError as error:
            details = " ".join((error.details() or "").split())
            print(f"{args.server}: {error.code().name}: {details or 'no details'}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _json_list(source: str, what: str) -> list[Any]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        items = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        _usage(f"cannot read {what} from {source!r}: {exc}")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        _usage(f"{what} must be a JSON list of objects")
    return items


def _create(args: argparse.Namespace) -> int:
    events = []
    for item in _json_list(args.events, "events") if args.events else []:
        event = event_pb2.Event(type=_event_type(str(item.get("type", ""))))
        data = item.get("data", {})
        if not isinstance(data, dict):
            _usage("each event's data must be a JSON object")
        event.data.update(data)
        events.append(event)
    reply = _stub(args).CreateSession(
        pb.CreateSessionRequest(session_id=args.session_id, events=events), timeout=args.timeout
    )
    print(f"created {reply.session.session_id} with {reply.session.event_count} events")
    return 0


_ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}


def _seed(args: argparse.Namespace) -> int:
    messages = []
    for item in _json_list(args.messages, "messages"):
        message = message_pb2.Message(role=_ROLES.get(str(item.get("role")), 0))  # type: ignore[arg-type]
        for key in ("content", "reasoning_content", "tool_call_id", "name"):
            if isinstance(item.get(key), str):
                setattr(message, key, item[key])
        for call in item.get("tool_calls") or []:
            message.tool_calls.add().update(call)
        messages.append(message)
    reply = _stub(args).SeedSession(
        pb.SeedSessionRequest(session_id=args.session_id, messages=messages),
        timeout=args.timeout,
    )
    dropped = f"; dropped {len(reply.drops)} of unknown role" if reply.drops else ""
    print(f"seeded {reply.session.session_id} with {reply.session.event_count} events{dropped}")
    return 0


def _get(args: argparse.Namespace) -> int:
    reply = _stub(args).GetSession(
        pb.GetSessionRequest(session_id=args.session_id), timeout=args.timeout
    )
    print(json_format.MessageToJson(reply, preserving_proto_field_name=True))
    return 0


def _sessions(args: argparse.Namespace) -> int:
    stub = _stub(args)
    token, shown = "", 0
    while shown < args.limit:
        reply = stub.ListSessions(
            pb.ListSessionsRequest(
                page_size=min(1000, args.limit - shown), page_token=token, prefix=args.prefix
            ),
            timeout=args.timeout,
        )
        for session in reply.sessions:
            if args.json:
                print(_json(session))
            else:
                print(f"{session.session_id}\t{session.event_count} events")
        shown += len(reply.sessions)
        token = reply.next_page_token
        if not token:
            break
    return 0


def _fork(args: argparse.Namespace) -> int:
    request = pb.ForkSessionRequest(parent_session_id=args.parent_session_id, session_id=args.to)
    if args.at_seq is not None:
        request.at_seq = args.at_seq
    reply = _stub(args).ForkSession(request, timeout=args.timeout)
    print(reply.session.session_id)
    return 0


def _lease(args: argparse.Namespace) -> int:
    stub = _stub(args)
    ttl = Duration()
    ttl.FromNanoseconds(int(args.ttl * 1e9))
    reply: Message
    if args.action == "acquire":
        reply = stub.AcquireLease(
            pb.AcquireLeaseRequest(session_id=args.session_id, holder=args.holder, ttl=ttl),
            timeout=args.timeout,
        )
    elif args.action == "renew":
        reply = stub.RenewLease(
            pb.RenewLeaseRequest(session_id=args.session_id, holder=args.holder, ttl=ttl),
            timeout=args.timeout,
        )
    else:
        reply = stub.ReleaseLease(
            pb.ReleaseLeaseRequest(
                session_id=args.session_id, holder=args.holder, force=args.force
            ),
            timeout=args.timeout,
        )
    print(_json(reply))
    return 0
