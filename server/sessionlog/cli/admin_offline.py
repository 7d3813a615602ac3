"""The folder tools of `sessionlog admin` and `sessionlog replica` (as etcdutl is etcd's): they
open a data folder's LMDB directly, with no server in between.

    sessionlog admin stats  [--data DIR] [--json]        (``admin``: with --server, asks too)
    sessionlog admin backup DEST [--data DIR]
    sessionlog admin verify [--data DIR] [--json]
    sessionlog admin erasures [--data DIR] [--json]
    sessionlog admin restore BACKUP|FILE [--data DIR] [--force]      the server stopped
    sessionlog admin compact [--data DIR] [--json]                   the server stopped
    sessionlog admin compact --online [--data DIR] [--json]          beside it; swapped at start
    sessionlog replica resync [--data DIR]                           the replica stopped
    sessionlog replica rejoin --primary NEW [--data DIR]             the server stopped

The reading tools (stats, backup, verify, erasures) open the LMDB environment read-only, so
they run while the server writes: LMDB readers never block the writer, and a read transaction
sees one committed state. All check the data file before mapping it
(``storage.integrity.check_data_file``): a truncated file is one line and exit 1, never a SIGBUS.

``backup`` copies that state with compaction (LMDB's ``mdb_env_copy`` with the compact flag, in
one read transaction): the copy holds exactly the data committed when the transaction began,
with free pages left out, so it is often smaller than the source. A server started on the copy
sees every session as it was at that moment: dense seqs, the same stored bytes. Restore by
stopping the server and putting the copy's ``data.mdb`` in place of the data folder's.

``verify`` reads every record of every table and lists each one that is damaged or breaks an
invariant of ``storage.schema``, like fsck: exit 0 when it found nothing, 1 when it found damage.

The writing tools (restore, compact, replica resync and rejoin) take the folder's lock: they
refuse while a server owns it. A restored file starts a new history (see ``storage.identity``),
and resync sets the diverged store aside (nothing is deleted) so the replica rebuilds from its
primary. ``rejoin`` also asks the new primary (--primary) for its epoch history.

Exit codes: 0 success, 1 failure or refusal (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lmdb

from sessionlog import errors
from sessionlog.cli.client import channel, connection_options, server_address
from sessionlog.cluster.rejoin import RejoinRefused, rejoin
from sessionlog.storage import (
    changes,
    compaction,
    damage,
    folder,
    integrity,
    schema,
    snapshot,
)
from sessionlog.storage.integrity import DamagedStore
from sessionlog.storage.rebuild import RebuildRefused
from sessionlog.storage.usage import Usage, open_readonly, usage

DATA_FILE = "data.mdb"
OPEN_ERRORS = (lmdb.Error, DamagedStore, errors.DataCorrupted)
"""Why a data folder may not open: not a store, a truncated file, damaged tables."""
_DAMAGED_RECORD: tuple[type[Exception], ...] = (errors.DataCorrupted, *damage.DAMAGE)
"""What reading a damaged record raises."""


def add_actions(actions: Any, data_default: str, data_help: str) -> None:
    """Register the folder tools among `sessionlog admin`'s actions (``admin`` registers
    stats, which is a folder tool that may also ask a server)."""
    backup = actions.add_parser(
        "backup",
        help="folder: a consistent, compacted copy of the data folder, taken online",
        description="Copy the data folder's committed state, compacted, into DEST (a new or "
        "empty folder) while the server keeps running. Restore: stop the server, replace its "
        "data folder's data.mdb with DEST/data.mdb, start it.",
    )
    backup.add_argument("dest", metavar="DEST", help="a new or empty folder for the copy")
    backup.add_argument("--data", default=data_default, help=data_help)
    backup.set_defaults(run=_backup)

    restore = actions.add_parser(
        "restore",
        help="folder: put a backup in place as the data folder's store (the server must "
        "be stopped)",
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
        help="folder: read every record and list what is damaged (exit 1 when anything is)",
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
        help="folder: list the erasure audit: every DeleteSession, RedactEvents and EraseSessions",
        description="Print the erasure audit records of the data folder (beside a running "
        "server): position, time, kind, session, actor, reason and counts. Never content.",
    )
    erasures.add_argument("--data", default=data_default, help=data_help)
    erasures.add_argument("--json", action="store_true", help="one JSON object per line")
    erasures.set_defaults(run=_erasures)

    compact_parser = actions.add_parser(
        "compact",
        help="folder: rewrite the data file so erased bytes are gone from it (server stopped, "
        "or --online and swapped at the next start)",
        description="Rewrite the data folder's data.mdb as a logical copy of its records, "
        "then swap it in: what DeleteSession and RedactEvents erased no longer lingers in the "
        "file's free pages. Takes the folder lock: stop the server (or replica) first. The old "
        "file is deleted, not kept.",
    )
    compact_parser.add_argument("--data", default=data_default, help=data_help)
    compact_parser.add_argument(
        "--online",
        action="store_true",
        help="beside a running server: write the copy into DATA/compact-pending/; the server "
        "brings it up to date and swaps it in at its next start",
    )
    compact_parser.add_argument("--json", action="store_true", help="print one JSON object")
    compact_parser.set_defaults(run=_compact)


def add_replica_actions(actions: Any, data_default: str) -> None:
    """Register `sessionlog replica resync | rejoin`: folder tools for a stopped replica."""
    resync = actions.add_parser(
        "resync",
        help="folder: set a diverged replica's data aside so it rebuilds from its primary",
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
        help="folder: make a deposed primary a replica of the new one, discarding what "
        "only it holds",
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


def fail(message: str, command: str = "admin") -> int:
    print(f"sessionlog {command}: {message}", file=sys.stderr)
    return 1


def open_folder(data: str) -> tuple[lmdb.Environment, Any]:
    if Path(data).exists() and not Path(data).is_dir():
        raise lmdb.Error(
            f"{data!r} is a file, not a data folder: --data names the folder that holds "
            f"{DATA_FILE} (a snapshot file is read by restoring it into a folder first: "
            "sessionlog admin restore FILE --data DIR)"
        )
    try:  # a folder that held data but lost it says so, as `serve` does
        folder.check_not_emptied(Path(data), folder.read_marker(Path(data)))
    except folder.FolderDamaged as exc:
        raise lmdb.Error(str(exc)) from None
    if not (Path(data) / DATA_FILE).is_file():
        raise lmdb.Error(f"no sessionlog store in {data!r} (no {DATA_FILE}); check --data")
    return open_readonly(data)


def usage_json(used: Usage, data: str) -> dict[str, Any]:
    file_bytes = (Path(data) / DATA_FILE).stat().st_size
    return {
        "data": str(Path(data).absolute()),
        "sessions": used.sessions,
        "events": used.events,
        "position": used.position,
        "last_commit": iso(used.head_commit_ns) if used.head_commit_ns else None,
        "map_size": used.map_size,
        "used_bytes": used.used_bytes,
        "used_percent": round(used.used_fraction * 100, 3),
        "file_bytes": file_bytes,
        "readers": used.readers,
    }


def iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _backup(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        return fail(f"{str(dest)!r} exists and is not an empty folder; name a new one")
    if dest.resolve() == Path(args.data).resolve():
        return fail("DEST is the data folder itself; name another folder")
    try:
        env, tables = open_folder(args.data)
    except OPEN_ERRORS as exc:
        return fail(str(exc))
    started = time.monotonic()
    try:
        dest.mkdir(parents=True, exist_ok=True)
        source = snapshot.copy(env, tables, dest)
    except (lmdb.Error, OSError, errors.DataCorrupted) as exc:
        return fail(f"backup to {str(dest)!r} failed: {exc}")
    finally:
        env.close()
    _fsync(dest / DATA_FILE)
    _fsync(dest)
    problem = check_copy(dest, source)
    if problem:
        return fail(f"the copy in {str(dest)!r} does not match its source: {problem}")
    size = (dest / DATA_FILE).stat().st_size
    print(
        f"backed up {source.sessions} sessions, {source.events} events (change-feed position "
        f"{source.position}) to {dest}/{DATA_FILE}: {human(size)} in "
        f"{time.monotonic() - started:.2f} s"
    )
    return 0


def _restore(args: argparse.Namespace) -> int:
    data, backup = Path(args.data), Path(args.backup)
    source = backup if backup.is_file() else backup / DATA_FILE
    if not source.is_file():
        return fail(
            f"no backup in {str(backup)!r} (no {DATA_FILE}); name a folder admin backup wrote "
            "or a file admin snapshot save wrote"
        )
    try:
        env, tables = open_readonly(str(source), lock=False)
        try:
            copied = usage(env, tables)
        finally:
            env.close()
    except OPEN_ERRORS as exc:
        return fail(f"{str(source)!r} is not a usable sessionlog store: {exc}")
    try:
        lock = folder.acquire(data)
    except folder.FolderInUse as exc:
        return fail(str(exc))
    try:
        held = (data / DATA_FILE).exists() and (data / DATA_FILE).stat().st_size > 0
        if held and not args.force:
            return fail(
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
        return fail(f"restore into {str(data)!r} failed: {exc}")
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
        return fail(f"no data folder {str(data)!r}; name the replica's --data", "replica")
    try:
        lock = folder.acquire(data)
    except folder.FolderInUse as exc:
        return fail(str(exc), "replica")
    try:
        follows = _followed(data)
        if follows is None and not args.force:
            return fail(
                f"{str(data)!r} was last opened as a primary, not a replica: resync would set "
                "its whole store aside. Check --data, or add --force if this really is the "
                "replica to rebuild",
                "replica",
            )
        aside = folder.set_aside(data, "diverged")
    except OSError as exc:
        return fail(f"could not set the store in {str(data)!r} aside: {exc}", "replica")
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
        env, tables = open_folder(args.data)
    except OPEN_ERRORS as exc:
        return fail(str(exc))
    try:
        records = []
        if tables.erasures is not None:
            with env.begin() as txn:
                for key, value in txn.cursor(db=tables.erasures):
                    records.append((schema.read_u64(key), schema.ErasureRecord.decode(value)))
    except _DAMAGED_RECORD as exc:
        return fail(f"an erasure record is damaged ({exc}); run `sessionlog admin verify`")
    finally:
        env.close()
    for position, record in records:
        if args.json:
            print(json.dumps({"position": position, **asdict(record)}))
            continue
        what = f"seqs {', '.join(map(str, record.seqs))}" if record.seqs else "the session"
        print(
            f"{position:>8}  {iso(record.time_ns)}  {record.kind:<6}  {record.session_id}  "
            f"{what} ({record.event_count} events, {record.feed_records} feed records)  "
            f"by {record.actor or '-'}: {record.reason or '-'}"
        )
    return 0


def _compact(args: argparse.Namespace) -> int:
    """`admin compact`: see ``storage.compaction``."""
    data = Path(args.data)
    if not (data / DATA_FILE).is_file():
        return fail(f"no sessionlog store in {str(data)!r} (no {DATA_FILE}); check --data")
    if args.online:
        return _compact_online(data, args.json)
    try:
        lock = folder.acquire(data)
    except folder.FolderInUse as exc:
        return fail(f"{exc}; stop the server first")
    try:
        integrity.refuse_damaged(data)
        done = compaction.compact(data)
    except (DamagedStore, lmdb.Error, OSError) as exc:
        return fail(f"could not compact {str(data)!r}: {exc}")
    finally:
        lock.release()
    if args.json:
        print(json.dumps(asdict(done)))
    else:
        print(
            f"compacted {data}: {done.records} records copied, {human(done.bytes_before)} -> "
            f"{human(done.bytes_after)}"
        )
    return 0


def _compact_online(data: Path, as_json: bool) -> int:
    """`admin compact --online`: see ``storage.compaction.copy_online``."""
    try:
        done = compaction.copy_online(data)
    except (lmdb.Error, OSError) as exc:
        return fail(f"could not copy {str(data)!r}: {exc}")
    if as_json:
        print(json.dumps(asdict(done)))
    else:
        print(
            f"compacted copy of {data} written ({done.records} records, through change "
            f"{done.position}): {human(done.bytes_now)} now -> {human(done.bytes_copy)} in the "
            "copy; the server swaps it in at its next start (writes since the copy included)"
        )
    return 0


def _rejoin(args: argparse.Namespace) -> int:
    """`replica rejoin`: see ``cluster.rejoin``."""
    data = Path(args.data)
    try:
        with channel(argparse.Namespace(**{**vars(args), "server": args.primary})) as opened:
            done = rejoin(data, args.primary, opened, args.timeout)
    except folder.FolderInUse as exc:
        return fail(f"{exc}; stop the server first", "replica")
    except (RejoinRefused, RebuildRefused, *OPEN_ERRORS) as exc:
        return fail(str(exc), "replica")
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


def check_copy(dest: Path, source: Usage) -> str:
    """Open the copy (a folder or a data file) and compare its counts with the source
    transaction's; '' when equal."""
    try:
        env, tables = open_readonly(str(dest), lock=False)
    except OPEN_ERRORS as exc:
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


def _verify_store(args: argparse.Namespace) -> int:
    """`admin verify`: one line per problem, then a summary; exit 1 when anything is damaged."""
    try:
        problems, records = _walk_in_child(args.data)
    except OPEN_ERRORS as exc:
        return fail(str(exc))
    except BrokenProcessPool:
        return fail(
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
    env, tables = open_folder(data)
    try:
        return integrity.verify(env, tables, change_checks=[changes.ChecksumChain()])
    finally:
        env.close()
