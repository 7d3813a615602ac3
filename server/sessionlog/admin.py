"""`sessionlog admin`: look at and back up a data folder, beside a running server or remotely.

    sessionlog admin stats  [--data DIR] [--server HOST:PORT] [--json]
    sessionlog admin backup DEST [--data DIR]
    sessionlog admin snapshot save FILE --server HOST:PORT
    sessionlog admin verify [--data DIR] [--json]
    sessionlog admin compact [--data DIR] [--json]
    sessionlog admin erasures [--data DIR] [--json]
    sessionlog admin erase --prefix P --server HOST:PORT [--reason R]
    sessionlog admin restore BACKUP|FILE [--data DIR] [--force]
    sessionlog admin promote --server REPLICA [--epoch N] [--fence OLD_PRIMARY]
    sessionlog admin fence --server HOST:PORT --epoch N [--primary NEW]
    sessionlog admin lease-audit [--server HOST:PORT] [--prefix P] [--json]
    sessionlog replica resync [--data DIR]
    sessionlog replica rejoin --primary NEW [--data DIR]

The local commands open the LMDB environment read-only, so they run while the server writes:
LMDB readers never block the writer, and a read transaction sees one committed state. All check
the data file before mapping it (``storage.integrity.check_data_file``): a truncated file is one
line and exit 1, never a SIGBUS.

``backup`` copies that state with compaction (LMDB's ``mdb_env_copy`` with the compact flag, in
one read transaction): the copy holds exactly the data committed when the transaction began,
with free pages left out, so it is often smaller than the source. A server started on the copy
sees every session as it was at that moment: dense seqs, the same stored bytes. Restore by
stopping the server and putting the copy's ``data.mdb`` in place of the data folder's.

``stats --server`` without ``--data`` and ``snapshot save`` ask the server instead
(AdminService, an admin token; TLS and token options as the client commands take them). The
snapshot is the same compacted copy as ``backup``, taken by the server and streamed; it arrives
in FILE.part and is renamed to FILE only once its size, SHA-256 and counts check out and it is
synced, so FILE is a whole copy or absent.

``lease-audit`` lists every session's lease takeovers and forced releases (AdminService's
ListLeaseAudit, every page, an admin token), one line each: session, number, kind, time, who
took or forced it, from whom.

``verify`` reads every record of every table and lists each one that is damaged or breaks an
invariant of ``storage.schema``, like fsck: exit 0 when it found nothing, 1 when it found damage.

``restore`` and ``replica resync`` write to the folder, so they take its lock: they refuse while
a server owns it. A restored file starts a new history (see ``storage.identity``), and resync
sets the diverged store aside (nothing is deleted) so the replica rebuilds from its primary.

Exit codes: 0 success, 1 failure or refusal (one line on stderr), 2 bad usage, 3 the --server
could not be reached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lmdb

from sessionlog import errors
from sessionlog.cli_client import _client, channel, connection_options, natural, server_address
from sessionlog.cluster.rejoin import RejoinRefused, rejoin
from sessionlog.defaults import DEFAULT_DATA_DIR
from sessionlog.storage import (
    changes,
    compaction,
    damage,
    folder,
    identity,
    integrity,
    schema,
    snapshot,
)
from sessionlog.storage.integrity import DamagedStore
from sessionlog.storage.rebuild import RebuildRefused
from sessionlog.storage.usage import Usage, open_readonly, usage
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog_client.convert import message_to_json

DATA_FILE = "data.mdb"
_OPEN_ERRORS = (lmdb.Error, DamagedStore, errors.DataCorrupted)
"""Why a data folder may not open: not a store, a truncated file, damaged tables."""
_DAMAGED_RECORD: tuple[type[Exception], ...] = (errors.DataCorrupted, *damage.DAMAGE)
"""What reading a damaged record raises."""


def add_commands(commands: Any) -> None:
    """Register `sessionlog admin stats | backup` on the `sessionlog` parser."""
    admin = commands.add_parser(
        "admin",
        help="data folder stats, online backups, and a check for damage",
        description="Operate on a data folder, also while a server is running on it.",
    )
    actions = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    data_default = os.environ.get("SESSIONLOG_DATA", DEFAULT_DATA_DIR)
    data_help = f"the server's data folder [env SESSIONLOG_DATA] (default {data_default})"

    stats = actions.add_parser(
        "stats",
        help="sessions, events, map usage; of a folder, or of a server with --server",
        description="Sessions, events, change-feed position and LMDB map usage of a data "
        "folder, and with --server that server's replication status as well. With --server and "
        "no --data, everything is asked of the server (AdminService, an admin token).",
        parents=[connection_options(None, "ask this server HOST:PORT (an admin token)")],
    )
    stats.add_argument("--data", help=data_help)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(run=_stats, data_default=data_default)

    backup = actions.add_parser(
        "backup",
        help="a consistent, compacted copy of the data folder, taken online",
        description="Copy the data folder's committed state, compacted, into DEST (a new or "
        "empty folder) while the server keeps running. Restore: stop the server, replace its "
        "data folder's data.mdb with DEST/data.mdb, start it.",
    )
    backup.add_argument("dest", metavar="DEST", help="a new or empty folder for the copy")
    backup.add_argument("--data", default=data_default, help=data_help)
    backup.set_defaults(run=_backup)

    snapshot_parser = actions.add_parser(
        "snapshot",
        help="save a running server's store over the network (snapshot save FILE)",
        description="Copies of a server's store, taken by the server while it runs.",
    )
    snapshot_actions = snapshot_parser.add_subparsers(
        dest="snapshot_command", metavar="ACTION", required=True
    )
    save = snapshot_actions.add_parser(
        "save",
        help="stream a consistent, compacted copy of the server's store into FILE",
        description="Ask --server for a consistent, compacted copy of its store (taken in one "
        "read transaction while writers go on) and write it to FILE, a data.mdb that admin "
        "restore installs. The copy goes to FILE.part first and becomes FILE only once its "
        "size and SHA-256 match and it is synced. Needs an admin token.",
        parents=[
            connection_options(
                os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051"),
                "server address HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
                timeout_default=3600.0,
            )
        ],
    )
    save.add_argument("file", metavar="FILE", help="where to write the copy (must not exist)")
    save.set_defaults(run=_snapshot_save)

    restore = actions.add_parser(
        "restore",
        help="put a backup in place as the data folder's store (the server must be stopped)",
        description="Install BACKUP/data.mdb (a folder written by admin backup), or BACKUP "
        "itself (a file written by admin snapshot save), as the data folder's data file. "
        "Refused while a server owns the folder. The restored store starts a new history id, "
        "so replicas of the old one notice. With --force, a store already in the folder is "
        "first moved aside into a subfolder (never deleted).",
    )
    restore.add_argument(
        "backup",
        metavar="BACKUP",
        help="a folder written by admin backup, or a file written by admin snapshot save",
    )
    restore.add_argument("--data", default=data_default, help=data_help)
    restore.add_argument(
        "--force", action="store_true", help="replace a store already in the folder (kept aside)"
    )
    restore.set_defaults(run=_restore)

    verify = actions.add_parser(
        "verify",
        help="read every record and list what is damaged (exit 1 when anything is)",
        description="Read every record of the data folder, beside a running server, and list "
        "each one that does not decode or breaks the store's invariants (dense seqs, session "
        "counts, the change feed and its chained checksums). Exit 0 when nothing is damaged, 1 "
        "when something is.",
    )
    verify.add_argument("--data", default=data_default, help=data_help)
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(run=_verify_store)

    erasures = actions.add_parser(
        "erasures",
        help="list the erasure audit: every DeleteSession, RedactEvents and EraseSessions",
        description="Print the erasure audit records of the data folder (beside a running "
        "server): position, time, kind, session, actor, reason and counts. Never content.",
    )
    erasures.add_argument("--data", default=data_default, help=data_help)
    erasures.add_argument("--json", action="store_true", help="one JSON object per line")
    erasures.set_defaults(run=_erasures)

    compact_parser = actions.add_parser(
        "compact",
        help="rewrite the data file so erased bytes are gone from it (server stopped)",
        description="Rewrite the data folder's data.mdb as a logical copy of its records, "
        "then swap it in: what DeleteSession and RedactEvents erased no longer lingers in the "
        "file's free pages. Takes the folder lock: stop the server (or replica) first. The old "
        "file is deleted, not kept.",
    )
    compact_parser.add_argument("--data", default=data_default, help=data_help)
    compact_parser.add_argument("--json", action="store_true", help="print one JSON object")
    compact_parser.set_defaults(run=_compact)

    server_default = os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051")
    promote = actions.add_parser(
        "promote",
        help="turn a running replica into the primary, with a new epoch",
        description="Ask --server, a running replica, to become the primary: it stops "
        "replicating, takes a new epoch (one above every epoch it knows, or --epoch), starts a "
        "new history id and takes writes. With --fence OLD, the old primary is then told of the "
        "new epoch at once and stops taking writes (it would learn of it from any reader that "
        "knows it; until then it may still take writes). Needs an admin token.",
        parents=[
            connection_options(
                server_default,
                "the replica to promote, HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
            )
        ],
    )
    promote.add_argument(
        "--epoch", type=int, default=0, help="the epoch to take (default: one above any known)"
    )
    promote.add_argument(
        "--fence",
        metavar="HOST:PORT",
        type=server_address,
        help="the old primary to fence once promoted (it then names --server as the primary)",
    )
    promote.add_argument("--json", action="store_true", help="print one JSON object")
    promote.set_defaults(run=_promote)

    fence = actions.add_parser(
        "fence",
        help="tell a server that a newer epoch exists: a primary stops taking writes for good",
        description="Send --server a newer epoch (--epoch) and its primary (--primary): a "
        "server that takes writes stops at once, durably (also after a restart), and answers "
        "NOT_PRIMARY naming --primary, until `sessionlog replica rejoin` makes it a replica. "
        "Needs an admin token.",
        parents=[
            connection_options(
                server_default,
                "the server to fence, HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
            )
        ],
    )
    fence.add_argument("--epoch", type=int, required=True, help="the newer epoch (above 0)")
    fence.add_argument(
        "--primary", default="", help="the primary of that epoch, HOST:PORT (may be omitted)"
    )
    fence.set_defaults(run=_fence)

    audit = actions.add_parser(
        "lease-audit",
        help="every session's lease takeovers and forced releases, from a server",
        description="List the lease audit of every session on --server (or of the sessions "
        "whose id starts with --prefix): each takeover of an expired lease and each forced "
        "release, in session id order, one line each. Needs an admin token without a session "
        "prefix.",
        parents=[
            connection_options(
                server_default,
                "the server to ask, HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
            )
        ],
    )
    audit.add_argument("--prefix", default="", help="only sessions whose id starts with this")
    audit.add_argument(
        "--page-size", type=natural, default=0, help="entries per call (default: the server's, 100)"
    )
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    audit.set_defaults(run=_lease_audit)
    erase = actions.add_parser(
        "erase",
        help="delete every session under --prefix matching --filter (AdminService.EraseSessions)",
        description="Erase every session under --prefix that matches --filter on --server, as "
        "DeleteSession with "
        "force does, in bounded batches, on the primary and (through the change feed) its "
        "replicas. Needs an admin token without a session prefix. Run `admin compact` on each "
        "folder afterwards to clear the erased bytes from the data file.",
        parents=[
            connection_options(
                server_default,
                "the primary, HOST:PORT [env SESSIONLOG_SERVER] (default %(default)s)",
            )
        ],
    )
    erase.add_argument("--prefix", default="", help="the session id prefix")
    erase.add_argument(
        "--filter",
        default="",
        help="a ListSessions filter, e.g. 'owner = \"ana\"' or 'labels.team = \"x\"' "
        "(--prefix, --filter or both)",
    )
    erase.add_argument("--reason", default="", help="kept in each erasure audit record")
    erase.add_argument("--json", action="store_true", help="print one JSON object")
    erase.set_defaults(run=_erase)


def add_replica_commands(commands: Any) -> None:
    """Register `sessionlog replica resync` on the `sessionlog` parser."""
    replica = commands.add_parser(
        "replica",
        help="replica maintenance (resync a diverged replica)",
        description="Maintenance of a replica's data folder.",
    )
    actions = replica.add_subparsers(dest="replica_command", metavar="ACTION", required=True)
    data_default = os.environ.get("SESSIONLOG_DATA", DEFAULT_DATA_DIR)
    resync = actions.add_parser(
        "resync",
        help="set a diverged replica's data aside so it rebuilds from its primary",
        description="Move the replica's store (data.mdb, its reader table and marker) into a "
        "subfolder named diverged-<time> of the data folder, kept for audit. The replica must be "
        "stopped; start it again with --replica-of and it copies its primary's whole change "
        "feed from the start.",
    )
    resync.add_argument(
        "--data",
        default=data_default,
        help=f"the replica's data folder [env SESSIONLOG_DATA] (default {data_default})",
    )
    resync.add_argument(
        "--force",
        action="store_true",
        help="set the store aside even though the folder was last opened as a primary",
    )
    resync.set_defaults(run=_resync)

    rejoin = actions.add_parser(
        "rejoin",
        help="make a deposed primary a replica of the new one, discarding what only it holds",
        description="With the server stopped: ask --primary (the new primary) for its epoch "
        "history, find the first position this folder's history does not share with it, check "
        "the change before it against the new primary's checksum, and rebuild the store from "
        "its own change records up to there. The old data file is moved into a subfolder "
        "rejoined-<time> (never deleted); every discarded record (position, epoch, session, "
        "seqs, request ids) is listed on stdout and in rejoin-report-<time>.json in the data "
        "folder, and the replica's status detail names them. Then start the server with "
        "--replica-of NEW.",
        parents=[
            connection_options(None, "unused: name the new primary with --primary"),
        ],
    )
    rejoin.add_argument(
        "--primary", required=True, type=server_address, help="the new primary, HOST:PORT"
    )
    rejoin.add_argument(
        "--data",
        default=data_default,
        help=f"the deposed server's data folder [env SESSIONLOG_DATA] (default {data_default})",
    )
    rejoin.add_argument("--json", action="store_true", help="print the report as one JSON object")
    rejoin.set_defaults(run=_rejoin)


def _fail(message: str, command: str = "admin") -> int:
    print(f"sessionlog {command}: {message}", file=sys.stderr)
    return 1


def _open(data: str) -> tuple[lmdb.Environment, Any]:
    try:  # a folder that held data but lost it says so, as `serve` does
        folder.check_not_emptied(Path(data), folder.read_marker(Path(data)))
    except folder.FolderDamaged as exc:
        raise lmdb.Error(str(exc)) from None
    if not (Path(data) / DATA_FILE).is_file():
        raise lmdb.Error(f"no sessionlog store in {data!r} (no {DATA_FILE}); check --data")
    return open_readonly(data)


def _usage_json(used: Usage, data: str) -> dict[str, Any]:
    file_bytes = (Path(data) / DATA_FILE).stat().st_size
    return {
        "data": str(Path(data).absolute()),
        "sessions": used.sessions,
        "events": used.events,
        "position": used.position,
        "last_commit": _iso(used.head_commit_ns) if used.head_commit_ns else None,
        "map_size": used.map_size,
        "used_bytes": used.used_bytes,
        "used_percent": round(used.used_fraction * 100, 3),
        "file_bytes": file_bytes,
        "readers": used.readers,
    }


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def _stats(args: argparse.Namespace) -> int:
    if args.server and args.data is None:
        report = _remote_usage(args)
    else:
        data = args.data or args.data_default
        try:
            env, tables = _open(data)
        except _OPEN_ERRORS as exc:
            return _fail(str(exc))
        try:
            report = _usage_json(usage(env, tables), data)
            with env.begin() as txn:
                report["history_id"], report["history_start"] = identity.read(txn, tables)
        except errors.DataCorrupted as exc:
            return _fail(str(exc))
        finally:
            env.close()
    if args.server:
        report["replication"] = _replication(args)
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
            print(f"{key:<30} {value} ({_human(value)})")
        else:
            print(f"{key:<30} {value}")


def _remote_usage(args: argparse.Namespace) -> dict[str, Any]:
    """The server's AdminService.GetStats in the keys of a local read (``_usage_json``)."""
    with channel(args) as opened:
        stub = apb_grpc.AdminServiceStub(opened)  # type: ignore[no-untyped-call]
        reply = stub.GetStats(apb.GetStatsRequest(), timeout=args.timeout)
    commit_ns = reply.last_commit_time.ToNanoseconds() if reply.HasField("last_commit_time") else 0
    return {
        "data": reply.data_dir,
        "sessions": reply.session_count,
        "events": reply.event_count,
        "position": reply.position,
        "last_commit": _iso(commit_ns) if commit_ns else None,
        "map_size": reply.map_size,
        "used_bytes": reply.used_bytes,
        "used_percent": round(reply.used_bytes / reply.map_size * 100, 3) if reply.map_size else 0,
        "file_bytes": reply.file_bytes,
        "readers": reply.readers,
        "history_id": reply.history_id,
        "history_start": reply.history_start,
        # a sharded server (--shard-map) says what it owns; a local read cannot know
        **(
            {
                "map_epoch": reply.map_epoch,
                "shard_group": reply.shard_group,
                "owned_slots": reply.owned_slots,
            }
            if reply.map_epoch
            else {}
        ),
    }


def _replication(args: argparse.Namespace) -> dict[str, Any]:
    """The server's GetReplicationStatus as a dict (grpc errors go to the CLI's handler)."""
    with channel(args) as opened:
        stub = rpb_grpc.ReplicationServiceStub(opened)  # type: ignore[no-untyped-call]
        reply = stub.GetReplicationStatus(rpb.GetReplicationStatusRequest(), timeout=args.timeout)
    state = rpb.ReplicationState.Name(reply.state)[len("REPLICATION_STATE_") :].lower()
    out: dict[str, Any] = {"role": reply.role, "position": reply.position, "epoch": reply.epoch}
    if reply.state == rpb.REPLICATION_STATE_FENCED:
        out.update(state=state, primary=reply.primary, detail=reply.detail)
    if reply.role == "replica":
        out.update(
            state=state,
            primary=reply.primary,
            primary_position=reply.primary_position,
            lag_positions=reply.lag_positions,
            lag_seconds=reply.lag.ToNanoseconds() / 1e9,
            connected=reply.connected,
            caught_up=reply.caught_up,
            history_id=reply.history_id,
            primary_history_id=reply.primary_history_id,
            detail=reply.detail,
        )
    if reply.HasField("cluster"):
        group = reply.cluster
        out["cluster"] = {
            "group": group.group,
            "member": group.member,
            "role": rpb.ClusterRole.Name(group.role)[len("CLUSTER_ROLE_") :].lower(),
            "leader": group.leader,
            "epoch": group.epoch,
            "reason": group.reason,
            "lease": group.lease,
            "lease_remaining_seconds": group.lease_remaining.ToNanoseconds() / 1e9,
            "etcd_endpoint": group.etcd_endpoint,
            "blocked_by": list(group.blocked_by),
            "deposed": group.deposed,
        }
    return out


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _backup(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        return _fail(f"{str(dest)!r} exists and is not an empty folder; name a new one")
    if dest.resolve() == Path(args.data).resolve():
        return _fail("DEST is the data folder itself; name another folder")
    try:
        env, tables = _open(args.data)
    except _OPEN_ERRORS as exc:
        return _fail(str(exc))
    started = time.monotonic()
    try:
        dest.mkdir(parents=True, exist_ok=True)
        source = snapshot.copy(env, tables, dest)
    except (lmdb.Error, OSError, errors.DataCorrupted) as exc:
        return _fail(f"backup to {str(dest)!r} failed: {exc}")
    finally:
        env.close()
    _fsync(dest / DATA_FILE)
    _fsync(dest)
    problem = _verify(dest, source)
    if problem:
        return _fail(f"the copy in {str(dest)!r} does not match its source: {problem}")
    size = (dest / DATA_FILE).stat().st_size
    print(
        f"backed up {source.sessions} sessions, {source.events} events (change-feed position "
        f"{source.position}) to {dest}/{DATA_FILE}: {_human(size)} in "
        f"{time.monotonic() - started:.2f} s"
    )
    return 0


def _restore(args: argparse.Namespace) -> int:
    data, backup = Path(args.data), Path(args.backup)
    source = backup if backup.is_file() else backup / DATA_FILE
    if not source.is_file():
        return _fail(
            f"no backup in {str(backup)!r} (no {DATA_FILE}); name a folder admin backup wrote "
            "or a file admin snapshot save wrote"
        )
    try:
        env, tables = open_readonly(str(source), lock=False)
        try:
            copied = usage(env, tables)
        finally:
            env.close()
    except _OPEN_ERRORS as exc:
        return _fail(f"{str(source)!r} is not a usable sessionlog store: {exc}")
    try:
        lock = folder.acquire(data)
    except folder.FolderInUse as exc:
        return _fail(str(exc))
    try:
        held = (data / DATA_FILE).exists() and (data / DATA_FILE).stat().st_size > 0
        if held and not args.force:
            return _fail(
                f"{str(data)!r} already holds a store; add --force to replace it (it is moved "
                "aside, not deleted)"
            )
        aside = folder.set_aside(data, "before-restore") if held else None
        folder.install_data_file(data, source)
        snapshot.stamp(data, copied.map_size)
        folder.write_marker(
            data, folder.Marker(created=folder.now_iso(), instance="", previous_instance="")
        )
    except (lmdb.Error, OSError) as exc:
        return _fail(f"restore into {str(data)!r} failed: {exc}")
    finally:
        lock.release()
    print(
        f"restored {copied.sessions} sessions, {copied.events} events (change-feed position "
        f"{copied.position}) into {data}/{DATA_FILE}"
        + (f"; the store it replaced is in {aside}" if aside else "")
        + ". The next start gives this folder a new history id."
    )
    return 0


def _resync(args: argparse.Namespace) -> int:
    data = Path(args.data)
    if not data.is_dir():
        return _fail(f"no data folder {str(data)!r}; name the replica's --data", "replica")
    try:
        lock = folder.acquire(data)
    except folder.FolderInUse as exc:
        return _fail(str(exc), "replica")
    try:
        follows = _followed(data)
        if follows is None and not args.force:
            return _fail(
                f"{str(data)!r} was last opened as a primary, not a replica: resync would set "
                "its whole store aside. Check --data, or add --force if this really is the "
                "replica to rebuild",
                "replica",
            )
        aside = folder.set_aside(data, "diverged")
    except OSError as exc:
        return _fail(f"could not set the store in {str(data)!r} aside: {exc}", "replica")
    finally:
        lock.release()
    if aside is None:
        print(f"{data} holds no store: a replica started on it copies its primary from the start")
    else:
        print(
            f"moved the replica's store to {aside} (delete it when no longer needed); start the "
            "replica again with --replica-of and it rebuilds from its primary's change feed"
        )
    return 0


def _erasures(args: argparse.Namespace) -> int:
    """`admin erasures`: the erasure audit, oldest first."""
    try:
        env, tables = _open(args.data)
    except _OPEN_ERRORS as exc:
        return _fail(str(exc))
    try:
        records = []
        if tables.erasures is not None:
            with env.begin() as txn:
                for key, value in txn.cursor(db=tables.erasures):
                    records.append((schema.read_u64(key), schema.ErasureRecord.decode(value)))
    except _DAMAGED_RECORD as exc:
        return _fail(f"an erasure record is damaged ({exc}); run `sessionlog admin verify`")
    finally:
        env.close()
    for position, record in records:
        if args.json:
            print(json.dumps({"position": position, **asdict(record)}))
            continue
        what = f"seqs {', '.join(map(str, record.seqs))}" if record.seqs else "the session"
        print(
            f"{position:>8}  {_iso(record.time_ns)}  {record.kind:<6}  {record.session_id}  "
            f"{what} ({record.event_count} events, {record.feed_records} feed records)  "
            f"by {record.actor or '-'}: {record.reason or '-'}"
        )
    return 0


def _compact(args: argparse.Namespace) -> int:
    """`admin compact`: see ``storage.compaction``."""
    data = Path(args.data)
    if not (data / DATA_FILE).is_file():
        return _fail(f"no sessionlog store in {str(data)!r} (no {DATA_FILE}); check --data")
    try:
        lock = folder.acquire(data)
    except folder.FolderInUse as exc:
        return _fail(f"{exc}; stop the server first")
    try:
        integrity.refuse_damaged(data)
        done = compaction.compact(data)
    except (DamagedStore, lmdb.Error, OSError) as exc:
        return _fail(f"could not compact {str(data)!r}: {exc}")
    finally:
        lock.release()
    if args.json:
        print(json.dumps(asdict(done)))
    else:
        print(
            f"compacted {data}: {done.records} records copied, {_human(done.bytes_before)} -> "
            f"{_human(done.bytes_after)}"
        )
    return 0


def _erase(args: argparse.Namespace) -> int:
    """`admin erase`: EraseSessions on --server."""
    request = apb.EraseSessionsRequest(prefix=args.prefix, filter=args.filter, reason=args.reason)
    with channel(args) as opened:
        stub = apb_grpc.AdminServiceStub(opened)  # type: ignore[no-untyped-call]
        reply = stub.EraseSessions(request, timeout=args.timeout)
    if args.json:
        print(
            json.dumps(
                {
                    "sessions": reply.session_count,
                    "events": reply.event_count,
                    "position": reply.position,
                }
            )
        )
    else:
        print(
            f"erased {reply.session_count} sessions ({reply.event_count} events) "
            f"{_erase_scope(args.prefix, args.filter)}; the last erase is at position "
            f"{reply.position}"
        )
    return 0


def _erase_scope(prefix: str | None, query: str | None) -> str:
    """What an erase covered, in words: its prefix, its filter, or both."""
    said = [f"under {prefix!r}"] if prefix else []
    if query:
        said.append(f"matching {query!r}")
    return " and ".join(said) or "under ''"


def _promote(args: argparse.Namespace) -> int:
    """`admin promote`: Promote on --server, then (with --fence) Fence on the old primary."""
    with channel(args) as opened:
        stub = apb_grpc.AdminServiceStub(opened)  # type: ignore[no-untyped-call]
        reply = stub.Promote(apb.PromoteRequest(epoch=args.epoch), timeout=args.timeout)
    report: dict[str, Any] = {
        "server": args.server,
        "epoch": reply.epoch,
        "first_position": reply.first_position,
        "history_id": reply.history_id,
        "previous_primary": reply.previous_primary,
    }
    if args.fence:
        report["fenced"] = args.fence
        report["old_primary_stopped_writes"] = _send_fence(
            args, args.fence, reply.epoch, args.server
        )
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"promoted {args.server}: the primary from epoch {reply.epoch} on (first position "
            f"{reply.first_position}, history id {reply.history_id}; it followed "
            f"{reply.previous_primary or 'no primary'})"
        )
        if args.fence:
            stopped = report["old_primary_stopped_writes"]
            print(
                f"fenced {args.fence} at epoch {reply.epoch}: "
                + ("it stopped taking writes" if stopped else "it was not taking writes")
            )
    return 0


def _fence(args: argparse.Namespace) -> int:
    stopped = _send_fence(args, args.server, args.epoch, args.primary)
    print(
        f"fenced {args.server} at epoch {args.epoch}: "
        + ("it stopped taking writes" if stopped else "it was not taking writes")
    )
    return 0


def _lease_audit(args: argparse.Namespace) -> int:
    """`admin lease-audit`: every page of ListLeaseAudit, printed as it arrives."""
    with _client(args) as client:
        for page in client.list_lease_audit(prefix=args.prefix, page_size=args.page_size):
            for listed in page.entries:
                entry = message_to_json(listed.entry)  # kind as "takeover" or "forced_release"
                if args.json:
                    line = {"session_id": listed.session_id, "index": listed.index, **entry}
                    print(json.dumps(line, ensure_ascii=False), flush=True)
                    continue
                print(
                    f"{listed.session_id}\t#{listed.index}\t{entry['kind']}\t"
                    f"{entry.get('time', '')}\t{entry['actor']} from {entry['previous_holder']} "
                    f"(token {entry['previous_token']})",
                    flush=True,
                )
    return 0


def _send_fence(args: argparse.Namespace, target: str, epoch: int, primary: str) -> bool:
    """AdminService.Fence on ``target`` (with the connection options of ``args``)."""
    with channel(argparse.Namespace(**{**vars(args), "server": target})) as opened:
        stub = apb_grpc.AdminServiceStub(opened)  # type: ignore[no-untyped-call]
        reply = stub.Fence(apb.FenceRequest(epoch=epoch, primary=primary), timeout=args.timeout)
    return bool(reply.stopped_writes)


def _rejoin(args: argparse.Namespace) -> int:
    """`replica rejoin`: see ``cluster.rejoin``."""
    data = Path(args.data)
    try:
        with channel(argparse.Namespace(**{**vars(args), "server": args.primary})) as opened:
            done = rejoin(data, args.primary, opened, args.timeout)
    except folder.FolderInUse as exc:
        return _fail(f"{exc}; stop the server first", "replica")
    except (RejoinRefused, RebuildRefused, *_OPEN_ERRORS) as exc:
        return _fail(str(exc), "replica")
    if args.json:
        print(json.dumps({"report": str(done.report), **done.rebuilt.to_json()}))
        return 0
    for record in done.rebuilt.discarded:
        seqs = f"seqs {record.seqs[0]}..{record.seqs[-1]}" if record.seqs else "no events"
        ids = f", request ids {', '.join(record.request_ids)}" if record.request_ids else ""
        print(
            f"discarded position {record.position} (epoch {record.epoch}, {record.kind}"
            f"{' of ' + record.session_id if record.session_id else ''}: {seqs}{ids})"
        )
    print(done.note)
    print(
        f"the old store is in {done.rebuilt.set_aside}; the report is {done.report}. Start the "
        f"server with --replica-of {args.primary}"
    )
    return 0


def _followed(data: Path) -> str | None:
    """The primary a folder last followed as a replica; None for a primary (or no store)."""
    if not (data / DATA_FILE).is_file() or (data / DATA_FILE).stat().st_size == 0:
        return ""  # nothing to lose: a resync of an empty folder is harmless
    try:
        env, tables = open_readonly(str(data))
    except (lmdb.Error, DamagedStore, errors.DataCorrupted):
        return ""  # too damaged to tell: setting it aside loses nothing that could be served
    try:
        with env.begin() as txn:
            raw = txn.get(schema.FOLLOWS, db=tables.counters)
    finally:
        env.close()
    return None if raw is None else bytes(raw).decode()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _verify(dest: Path, source: Usage) -> str:
    """Open the copy (a folder or a data file) and compare its counts with the source
    transaction's; '' when equal."""
    try:
        env, tables = open_readonly(str(dest), lock=False)
    except _OPEN_ERRORS as exc:
        return str(exc)
    try:
        copy = usage(env, tables)
    finally:
        env.close()
    for name in ("sessions", "events", "position"):
        if getattr(copy, name) != getattr(source, name):
            return (
                f"{name}: {getattr(copy, name)} in the copy, {getattr(source, name)} in the source"
            )
    return ""


class SnapshotRefused(Exception):
    """A snapshot stream that is not a whole, intact copy; the message says what is wrong."""


def _snapshot_save(args: argparse.Namespace) -> int:
    """`admin snapshot save FILE`: the stream into FILE.part, checked, synced, renamed to FILE."""
    dest = Path(args.file)
    if dest.exists():
        return _fail(f"{str(dest)!r} exists; name a new file (nothing is overwritten)")
    if not dest.parent.is_dir():
        return _fail(f"no folder {str(dest.parent)!r} to write {dest.name!r} in")
    part = dest.with_name(dest.name + ".part")
    started = time.monotonic()
    try:
        with channel(args) as opened:
            stub = apb_grpc.AdminServiceStub(opened)  # type: ignore[no-untyped-call]
            stream = stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=args.timeout)
            info = receive_snapshot(stream, part)
        problem = _verify(part, _expected(info))
        if problem:
            raise SnapshotRefused(f"the copy does not open as the store it claims to be: {problem}")
        os.replace(part, dest)
        folder.fsync_dir(dest.absolute().parent)
    except SnapshotRefused as exc:
        return _fail(f"snapshot from {args.server} refused, nothing saved: {exc}")
    except OSError as exc:
        return _fail(f"could not write {str(part)!r}: {exc}")
    finally:
        part.unlink(missing_ok=True)
    print(
        f"saved {info.session_count} sessions, {info.event_count} events (change-feed position "
        f"{info.position}) from {args.server} to {dest}: {_human(info.size_bytes)} in "
        f"{time.monotonic() - started:.2f} s, SHA-256 verified"
    )
    return 0


def receive_snapshot(responses: Iterable[apb.SaveSnapshotResponse], part: Path) -> apb.SnapshotInfo:
    """Write a SaveSnapshot stream into ``part`` and fsync it; SnapshotRefused unless the stream
    was info, then chunks adding up to info.size_bytes, then their SHA-256."""
    with part.open("wb") as out:
        stream = iter(responses)
        first = next(stream, None)
        if first is None or first.WhichOneof("kind") != "info":
            raise SnapshotRefused("the stream did not start with the snapshot's info")
        info = first.info
        digest, size = hashlib.sha256(), 0
        for response in stream:
            kind = response.WhichOneof("kind")
            if kind == "chunk":
                size += len(response.chunk)
                if size > info.size_bytes:
                    raise SnapshotRefused(f"more than the {info.size_bytes} bytes announced")
                digest.update(response.chunk)
                out.write(response.chunk)
            elif kind == "sha256":
                if size != info.size_bytes:
                    raise SnapshotRefused(
                        f"{size} bytes arrived of the {info.size_bytes} announced"
                    )
                if response.sha256 != digest.digest():
                    raise SnapshotRefused(
                        "the SHA-256 of the bytes received is not the server's: damaged on the way"
                    )
                out.flush()
                os.fsync(out.fileno())
                return info
            else:
                raise SnapshotRefused(f"an unexpected response ({kind}) in the stream")
    raise SnapshotRefused(f"the stream ended after {size} of {info.size_bytes} bytes, unfinished")


def _expected(info: apb.SnapshotInfo) -> Usage:
    """What the copy must hold by its info, in the shape ``_verify`` compares."""
    return Usage(
        sessions=info.session_count,
        events=info.event_count,
        position=info.position,
        head_commit_ns=0,
        map_size=info.map_size,
        used_bytes=0,
        page_size=0,
        readers=0,
    )


def _verify_store(args: argparse.Namespace) -> int:
    """`admin verify`: one line per problem, then a summary; exit 1 when anything is damaged."""
    try:
        problems, records = _walk_in_child(args.data)
    except _OPEN_ERRORS as exc:
        return _fail(str(exc))
    except BrokenProcessPool:
        return _fail(
            f"LMDB aborted while reading {args.data!r}: a page of the data file is damaged past "
            f"what it can report; {integrity.RUNBOOK}"
        )
    read = sum(records.values())
    if args.json:
        report = {
            "data": str(Path(args.data).absolute()),
            "damaged": bool(problems),
            "problems": [vars(problem) for problem in problems],
            "records": records,
        }
        print(json.dumps(report))
    else:
        for problem in problems:
            print(problem)
        tally = ", ".join(f"{name} {count}" for name, count in records.items())
        verdict = f"{len(problems)} problems" if problems else "no damage found"
        print(f"{verdict} in {read} records ({tally})")
    return 1 if problems else 0


def _walk_in_child(data: str) -> tuple[list[integrity.Problem], dict[str, int]]:
    """integrity.verify in a child process: some damage makes LMDB abort the process that
    reads it (an assertion on a page of the wrong kind), and verify must still answer."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(_walk, data).result()


def _walk(data: str) -> tuple[list[integrity.Problem], dict[str, int]]:
    env, tables = _open(data)
    try:
        return integrity.verify(env, tables, change_checks=[changes.ChecksumChain()])
    finally:
        env.close()
