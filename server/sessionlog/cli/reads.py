"""`sessionlog surface | state | usage | messages | items`: the client commands that read one
session, and how events and messages print."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from sessionlog.cli.client import (
    Subcommand,
    _client,
    _colour,
    _print_json,
    _usage,
    natural,
)
from sessionlog.terminal import escaped
from sessionlog_client import Client
from sessionlog_client import _items as backend_items
from sessionlog_client.convert import (
    message_to_dict,
    message_to_json,
    struct_to_dict,
    type_name,
)
from sessionlog_client.v1 import event_pb2, message_pb2
from sessionlog_client.v1 import session_log_service_pb2 as pb


def add_commands(sub: Subcommand) -> None:
    """Register `surface`, `state`, `usage`, `messages`, `items` (``client.subcommands``)."""
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


ROLE_COLOURS = {
    message_pb2.ROLE_SYSTEM: "\033[35m",
    message_pb2.ROLE_USER: "\033[32m",
    message_pb2.ROLE_ASSISTANT: "\033[36m",
    message_pb2.ROLE_TOOL: "\033[33m",
}
RESET = "\033[0m"


def _surface(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.surface(args.session_id, at_seq=args.at_seq)
    if args.json:
        _print_json(message_to_json(reply))
    else:
        for event in reply.events:
            print(_pretty_event(event))
    return 0


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
