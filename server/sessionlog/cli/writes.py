"""`sessionlog append | hide | delete | redact`: the client commands that write to a session's
log, and the event parsing they share with `create`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sessionlog.cli.client import (
    Subcommand,
    _client,
    _print_json,
    _usage,
    natural,
)
from sessionlog_client.convert import (
    event_from_dict,
    event_type,
    message_to_json,
)
from sessionlog_client.v1 import event_pb2


def add_commands(sub: Subcommand) -> None:
    """Register `append`, `hide`, `delete`, `redact` (``sub``: ``client.subcommands``)."""
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
    p.add_argument("--title", help="set the session's title in the same commit as the events")
    p.add_argument(
        "--expected-uid",
        default="",
        help="fail with SESSION_UID_MISMATCH unless the session's uid is this (a session deleted "
        "and written again has another)",
    )

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
        "and its replicas (see the docs' Erasure page; run `admin compact` to clear the data file)",
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


# Event types that are messages: appending one with no content is almost always a mistake.
MESSAGE_TYPES = frozenset(
    {
        event_pb2.EVENT_TYPE_SYSTEM_MESSAGE,
        event_pb2.EVENT_TYPE_USER_MESSAGE,
        event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE,
        event_pb2.EVENT_TYPE_TOOL_RESULT,
    }
)


def _append(args: argparse.Namespace) -> int:
    events = _batch(args) if args.events else [_one_event(args)]
    with _client(args) as client:
        reply = client.append(
            args.session_id,
            events,
            expected_seq=args.expected_seq,
            request_id=args.request_id,
            lease_holder=args.lease_holder,
            title=args.title,
            expected_uid=args.expected_uid,
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


def _event_type(name: str) -> event_pb2.EventType:
    try:
        return event_type(name)
    except ValueError as exc:
        _usage(str(exc))


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
