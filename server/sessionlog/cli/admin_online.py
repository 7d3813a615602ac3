"""The server calls of `sessionlog admin` (as etcdctl is etcd's): each asks a running server over
gRPC (AdminService or ReplicationService, an admin token; TLS and token options as the client
commands take them) and opens no data folder, except the file a snapshot is saved to.

    sessionlog admin stats --server HOST:PORT [--json]   (``admin``: without --data)
    sessionlog admin snapshot save FILE --server HOST:PORT
    sessionlog admin erase --prefix P --server HOST:PORT [--reason R]
    sessionlog admin promote --server REPLICA [--epoch N] [--fence OLD_PRIMARY]
    sessionlog admin fence --server HOST:PORT --epoch N [--primary NEW]
    sessionlog admin lease-audit [--server HOST:PORT] [--prefix P] [--json]

``snapshot save`` is the same compacted copy as ``admin backup``, taken by the server and
streamed; it arrives in FILE.part and is renamed to FILE only once its size, SHA-256 and counts
check out and it is synced, so FILE is a whole copy or absent.

``lease-audit`` lists every session's lease takeovers and forced releases (AdminService's
ListLeaseAudit, every page, an admin token), one line each: session, number, kind, time, who
took or forced it, from whom.

Exit codes: 0 success, 1 failure or refusal (one line on stderr), 2 bad usage, 3 the --server
could not be reached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sessionlog.cli.admin_offline import check_copy, fail, human, iso
from sessionlog.cli.client import _client, channel, connection_options, natural, server_address
from sessionlog.storage import folder
from sessionlog.storage.usage import Usage
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog_client.convert import message_to_json


def add_actions(actions: Any) -> None:
    """Register the server calls among `sessionlog admin`'s actions."""
    snapshot_parser = actions.add_parser(
        "snapshot",
        help="server: save a running server's store over the network (snapshot save FILE)",
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

    server_default = os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051")
    promote = actions.add_parser(
        "promote",
        help="server: turn a running replica into the primary, with a new epoch",
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
        help="server: tell a server that a newer epoch exists: a primary stops taking "
        "writes for good",
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
        help="server: every session's lease takeovers and forced releases, from a server",
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
        help="server: delete every session under --prefix matching --filter "
        "(AdminService.EraseSessions)",
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


def remote_usage(args: argparse.Namespace) -> dict[str, Any]:
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
        "last_commit": iso(commit_ns) if commit_ns else None,
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


def replication(args: argparse.Namespace) -> dict[str, Any]:
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
            "sync_set": list(reply.sync_set),
            "deposed": group.deposed,
        }
    return out


class SnapshotRefused(Exception):
    """A snapshot stream that is not a whole, intact copy; the message says what is wrong."""


def _snapshot_save(args: argparse.Namespace) -> int:
    """`admin snapshot save FILE`: the stream into FILE.part, checked, synced, renamed to FILE."""
    dest = Path(args.file)
    if dest.exists():
        return fail(f"{str(dest)!r} exists; name a new file (nothing is overwritten)")
    if not dest.parent.is_dir():
        return fail(f"no folder {str(dest.parent)!r} to write {dest.name!r} in")
    part = dest.with_name(dest.name + ".part")
    started = time.monotonic()
    try:
        with channel(args) as opened:
            stub = apb_grpc.AdminServiceStub(opened)  # type: ignore[no-untyped-call]
            stream = stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=args.timeout)
            info = receive_snapshot(stream, part)
        problem = check_copy(part, _expected(info))
        if problem:
            raise SnapshotRefused(f"the copy does not open as the store it claims to be: {problem}")
        os.replace(part, dest)
        folder.fsync_dir(dest.absolute().parent)
    except SnapshotRefused as exc:
        return fail(f"snapshot from {args.server} refused, nothing saved: {exc}")
    except OSError as exc:
        return fail(f"could not write {str(part)!r}: {exc}")
    finally:
        part.unlink(missing_ok=True)
    print(
        f"saved {info.session_count} sessions, {info.event_count} events (change-feed position "
        f"{info.position}) from {args.server} to {dest}: {human(info.size_bytes)} in "
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
            f"erased {_many(reply.session_count, 'session')} "
            f"({_many(reply.event_count, 'event')}) "
            f"{_erase_scope(args.prefix, args.filter)}; the last erase is at position "
            f"{reply.position}"
        )
    return 0


def _many(count: int, thing: str) -> str:
    """``1 session``, ``2 sessions``."""
    return f"{count} {thing}" if count == 1 else f"{count} {thing}s"


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
