"""`sessionlog admin` and `sessionlog replica`: two kinds of actions under one name each, kept
apart in code as etcd keeps etcdutl (on the files) apart from etcdctl (to a running server).

Folder tools (``admin_offline``) open a data folder's LMDB directly: stats, backup, verify and
erasures read it beside a running server; restore, compact and replica resync/rejoin need the
server stopped (they take the folder's lock), or work on a copy.

Server calls (``admin_online``) ask a running server over gRPC with an admin token: snapshot
save, erase, promote, fence, lease-audit, and stats with --server and no --data.

``stats`` is both: a folder's figures, and with --server that server's replication status too
(or, with no --data, everything asked of the server).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from sessionlog import errors
from sessionlog.cli.admin_offline import (
    OPEN_ERRORS,
    add_replica_actions,
    fail,
    human,
    open_folder,
    usage_json,
)
from sessionlog.cli.admin_offline import add_actions as add_folder_tools
from sessionlog.cli.admin_online import add_actions as add_server_calls
from sessionlog.cli.admin_online import remote_usage, replication
from sessionlog.cli.client import connection_options
from sessionlog.defaults import DEFAULT_DATA_DIR
from sessionlog.storage import identity
from sessionlog.storage.usage import usage

KINDS = (
    "Folder tools open the data folder's LMDB directly (--data): stats, backup, verify and "
    "erasures read it beside a running server; restore and compact need the server stopped, or "
    "work on a copy. Server calls ask a running server over gRPC (--server, an admin token): "
    "snapshot save, promote, fence, lease-audit, erase, and stats with --server."
)


def add_commands(commands: Any) -> None:
    """Register `sessionlog admin`: its folder tools, then its server calls."""
    admin = commands.add_parser(
        "admin",
        help="data folder stats, online backups, and a check for damage",
        description="Operate on a data folder, also while a server is running on it, or on a "
        "running server. " + KINDS,
    )
    actions = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    data_default = os.environ.get("SESSIONLOG_DATA", DEFAULT_DATA_DIR)
    data_help = f"the server's data folder [env SESSIONLOG_DATA] (default {data_default})"

    stats = actions.add_parser(
        "stats",
        help="folder (and server): sessions, events, map usage; of a folder, or of a "
        "server with --server",
        description="Sessions, events, change-feed position and LMDB map usage of a data "
        "folder, and with --server that server's replication status as well. With --server and "
        "no --data, everything is asked of the server (AdminService, an admin token).",
        parents=[connection_options(None, "ask this server HOST:PORT (an admin token)")],
    )
    stats.add_argument("--data", help=data_help)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(run=_stats, data_default=data_default)

    add_folder_tools(actions, data_default, data_help)
    add_server_calls(actions)


def add_replica_commands(commands: Any) -> None:
    """Register `sessionlog replica resync | rejoin` (folder tools, the replica stopped)."""
    replica = commands.add_parser(
        "replica",
        help="replica maintenance (resync a diverged replica)",
        description="Maintenance of a replica's data folder (folder tools: the server stopped).",
    )
    actions = replica.add_subparsers(dest="replica_command", metavar="ACTION", required=True)
    add_replica_actions(actions, os.environ.get("SESSIONLOG_DATA", DEFAULT_DATA_DIR))


def _stats(args: argparse.Namespace) -> int:
    if args.server and args.data is None:
        report = remote_usage(args)
    else:
        data = args.data or args.data_default
        try:
            env, tables = open_folder(data)
        except OPEN_ERRORS as exc:
            return fail(str(exc))
        try:
            report = usage_json(usage(env, tables), data)
            with env.begin() as txn:
                report["history_id"], report["history_start"] = identity.read(txn, tables)
        except errors.DataCorrupted as exc:
            return fail(str(exc))
        finally:
            env.close()
    if args.server:
        report["replication"] = replication(args)
    _print_report(report, args.json)
    return 0


def _print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        if key == "replication":
            for name, field in value.items():
                if name == "cluster":
                    for part, item in field.items():
                        print(f"{'cluster ' + part:<30} {item}")
                else:
                    print(f"{'replication ' + name:<30} {field}")
        elif key in ("map_size", "used_bytes", "file_bytes"):
            print(f"{key:<30} {value} ({human(value)})")
        else:
            print(f"{key:<30} {value}")
