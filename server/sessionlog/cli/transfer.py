"""`sessionlog export` and `sessionlog import` (``sessionlog.transfer`` holds the file format,
its check and the sending; this module parses the arguments and prints)."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from sessionlog import fold
from sessionlog.cli.client import (
    EXIT_REFUSED,
    EXIT_USAGE,
    Subcommand,
    _client,
    _print_json,
    _usage,
    natural,
)
from sessionlog.config import parse_size
from sessionlog.transfer import (
    BadLine,
    NotTheSameImport,
    export_jsonl,
    import_jsonl,
    numbered,
    sorted_keys,
)
from sessionlog_client.convert import message_to_json


def add_commands(sub: Subcommand) -> None:
    """Register `export` and `import` (``sub``: ``client.subcommands``)."""
    p = sub(
        "export",
        "write a session to a file: its record and every event as JSON lines (an exact copy "
        "that `sessionlog import` restores), or its messages in the OpenAI chat format",
        _export,
    )
    p.add_argument("session_id")
    p.add_argument(
        "--format",
        choices=("jsonl", "openai"),
        default="jsonl",
        help="jsonl: the record, then one line per event (default); openai: the derived "
        "messages as a JSON list of chat-completions messages",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")

    p = sub(
        "import",
        "create a session from a `sessionlog export --format jsonl` file, keeping its ids, "
        "seqs and times; checked whole before anything is written (a bad file imports "
        "nothing), then streamed in chunks",
        _import,
    )
    p.add_argument("file", metavar="FILE", help="the export file (- reads stdin)")
    p.add_argument(
        "--session-id", default="", help="import under this id (default: the exported one)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an import that stopped midway: send the file's events from the "
        "target session's next seq (its last stored event must be the file's at that seq)",
    )
    p.add_argument(
        "--max-event-size",
        type=parse_size,
        default=fold.DEFAULT_LIMITS.max_event_bytes,
        metavar="SIZE",
        help="the server's --max-event-size, when not the default: the file is checked "
        "against it before anything is sent",
    )
    p.add_argument(
        "--max-data-depth",
        type=natural,
        default=fold.DEFAULT_LIMITS.max_data_depth,
        metavar="N",
        help="the server's --max-data-depth, when not the default (as --max-event-size)",
    )


# -- export ---------------------------------------------------------------------------------------


def _export(args: argparse.Namespace) -> int:
    with _client(args) as client, ExitStack() as files:
        out: IO[str] = sys.stdout
        if args.output:
            try:
                out = files.enter_context(Path(args.output).open("w", encoding="utf-8"))
            except OSError as exc:
                _usage(f"cannot write {args.output!r}: {exc}")
        if args.format == "openai":
            # Each message's fields in their order, the objects inside them sorted (as _json).
            messages = client.chat_messages(args.session_id)
            same = [{key: sorted_keys(value) for key, value in m.items()} for m in messages]
            json.dump(same, out, ensure_ascii=False, indent=2)
            out.write("\n")
            return 0
        try:
            count = export_jsonl(client, args.session_id, out)
        except LookupError as exc:
            print(f"sessionlog: {exc}", file=sys.stderr)
            return EXIT_REFUSED
    if args.output:
        print(f"exported {count} events of {args.session_id} to {args.output}", file=sys.stderr)
    return 0


# -- import ---------------------------------------------------------------------------------------


def _import(args: argparse.Namespace) -> int:
    limits = fold.Limits(max_event_bytes=args.max_event_size, max_data_depth=args.max_data_depth)
    try:
        # bytes, decoded line by line: a byte that is not UTF-8 is a BadLine naming its line
        source = sys.stdin.buffer if args.file == "-" else Path(args.file).open("rb")  # noqa: SIM115
    except OSError as exc:
        _usage(f"cannot read {args.file!r}: {exc}")
    with source, _client(args) as client:
        try:
            reply = import_jsonl(
                client, numbered(source), args.session_id, resume=args.resume, limits=limits
            )
        except BadLine as exc:  # raised only by the check, before anything is sent
            said = str(exc)
            if "nothing was imported" not in said:
                said += " (nothing was imported)"
            print(f"sessionlog: {args.file}: {said}", file=sys.stderr)
            return EXIT_USAGE
        except NotTheSameImport as exc:
            print(f"sessionlog: {args.file}: {exc}", file=sys.stderr)
            return EXIT_REFUSED
    if args.json:
        _print_json(message_to_json(reply))
    else:
        print(f"imported {reply.session_id} with {reply.event_count} events")
    return 0
