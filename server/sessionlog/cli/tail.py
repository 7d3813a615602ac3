"""`sessionlog tail`: follow a session, every session under a prefix (--prefix, --filter), or
the change feed of every group (--every-group), resuming after a disconnect."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

from sessionlog.cli.client import (
    Subcommand,
    _client,
    _usage,
    natural,
)
from sessionlog.cli.reads import _pretty_event
from sessionlog.shard import feeds
from sessionlog_client import Client, Retry
from sessionlog_client.convert import (
    message_to_json,
)
from sessionlog_client.v1 import event_pb2


def add_commands(sub: Subcommand) -> None:
    """Register `tail` (``sub``: ``client.subcommands``)."""
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


FOREVER = Retry(give_up_after=float("inf"))
NO_RETRY = Retry(give_up_after=0.0)
FOLLOW_HEARTBEAT = 5.0


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
