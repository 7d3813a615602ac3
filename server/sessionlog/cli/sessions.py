"""`sessionlog create | seed | get | sessions | label | update | fork | lease`: the client
commands on session records (ids, labels, retention, forks, the writer lease)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import retention
from sessionlog.cli.client import (
    EXIT_REFUSED,
    Subcommand,
    _client,
    _print_json,
    _usage,
    natural,
)
from sessionlog.cli.reads import _tokens
from sessionlog.cli.writes import _event_from_item, _json_items
from sessionlog.terminal import escaped
from sessionlog_client.convert import (
    message_to_json,
    struct_to_dict,
)


def add_commands(sub: Subcommand) -> None:
    """Register `create`, `seed`, `get`, `sessions`, `label`, `update`, `fork` and `lease`
    (``sub``: ``client.subcommands``)."""
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
    p.add_argument(
        "--state",
        action="store_true",
        help="also each session's state (as `sessionlog state` prints it), read in the listing",
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
            with_state=args.state,
        )
        for page in pages:
            for session in page.sessions[: args.limit - shown]:
                if args.json:
                    _print_json(message_to_json(session))
                    shown += 1
                    continue
                line = _session_line(session)
                if args.state and session.HasField("state"):
                    state = json.dumps(struct_to_dict(session.state), ensure_ascii=False)
                    line += "\tstate " + escaped(state)
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
