"""Rejoin: a deposed primary becomes a replica of the new primary, losing only what it alone has.

    sessionlog replica rejoin --primary NEW [--data DIR]

Offline (the folder lock is taken, as ``replica resync`` takes it). The new primary's epoch
history says where its feed and this folder's part: the first position S whose epoch differs
between the two histories (``leadership.divergence``): records before S were written in the
same epochs by the same primaries, records from S on exist only here. The new primary then
checks its change at S - 1 against this folder's checksum (the ``after_checksum`` check a
replica's stream makes), and the store is rebuilt from its own records 1..S-1
(``storage.rebuild``), the old data file set aside. Every discarded record (S .. the head:
position, epoch, session, seqs, request ids) goes into a JSON report in the data folder, into
the folder's ``rejoined`` note (which the replica's status detail shows), and into the lines
the command prints. The folder is left a replica of NEW: start it with ``--replica-of NEW``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import lmdb
from google.rpc import error_details_pb2, status_pb2

from sessionlog.storage import changes, folder, leadership, rebuild, schema
from sessionlog.storage.leadership import Leadership
from sessionlog.storage.tables import Tables
from sessionlog.storage.usage import open_readonly
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc

log = logging.getLogger(__name__)


class RejoinRefused(Exception):
    """The folder cannot rejoin that primary; the message says why and what to do."""


@dataclass
class Rejoined:
    primary: str
    cut: int
    """The first position discarded (the head + 1 when nothing was)."""
    rebuilt: rebuild.Rebuilt
    report: Path
    note: str


def rejoin(
    data: Path,
    primary: str,
    channel: grpc.Channel,
    timeout: float,
    metadata: tuple[tuple[str, str], ...] = (),
) -> Rejoined:
    """Make the folder ``data`` a replica of ``primary`` (reached over ``channel``, each call
    with ``metadata``: a bearer token, say)."""
    if not (data / folder.DATA_FILE).is_file():
        raise RejoinRefused(f"no store in {str(data)!r}; check --data")
    lock = folder.acquire(data)
    try:
        mine, head, checksums = _local(data)
        status = _status(channel, timeout, primary, metadata)
        theirs = tuple((e.epoch, e.first_position) for e in status.epoch_history)
        if status.epoch < mine.epoch:
            raise RejoinRefused(
                f"{primary} is at epoch {status.epoch}, older than epoch {mine.epoch} this folder "
                "knows: it is not the current primary. Name the current one"
            )
        cut = leadership.divergence(mine.history, theirs, min(head, status.position) + 1)
        _check_same_before(channel, timeout, primary, cut, checksums(cut - 1), metadata)
        record = Leadership(
            epoch=max(mine.epoch, status.epoch),
            role=leadership.REPLICA,
            primary=primary,
            history=tuple(entry for entry in mine.history if entry[1] < cut),
        )
        target = rebuild.report_path(data)
        holder: dict[str, str] = {}

        def finish(txn: lmdb.Transaction, tables: Tables) -> None:
            leadership.write(txn, tables, record)
            txn.put(schema.FOLLOWS, primary.encode(), db=tables.counters)
            txn.put(schema.REJOINED, holder["note"].encode(), db=tables.counters)

        discarded = _discarded_preview(data, cut, head)
        holder["note"] = json.dumps(_note(primary, cut, discarded, target))
        rebuilt = rebuild.rebuild_through(data, cut - 1, finish)
        rebuild.write_report(target, _report(primary, status, mine, cut, rebuilt))
    finally:
        lock.release()
    note = rebuild.describe(json.loads(holder["note"]))
    log.warning(
        "rejoined as a replica: %s",
        note,
        extra={"primary": primary, "cut": cut, "discarded": len(rebuilt.discarded)},
    )
    return Rejoined(primary, cut, rebuilt, target, note)


def _local(data: Path) -> tuple[Leadership, int, Any]:
    """The folder's leadership record, head, and a way to read its checksum at a position."""
    env, tables = open_readonly(str(data))
    try:
        with env.begin() as txn:
            record = leadership.read(txn, tables)
            head = changes.head(txn, tables)[0]
            fingerprints = {head: changes.tail(txn, tables)[1]}
    finally:
        env.close()

    def checksum(position: int) -> bytes:
        if position <= 0:
            return b""
        if position in fingerprints:
            return fingerprints[position]
        env, tables = open_readonly(str(data))
        try:
            with env.begin() as txn:
                return changes.fingerprint_at(txn, tables, position) or b""
        finally:
            env.close()

    return record, head, checksum


def _status(
    channel: grpc.Channel, timeout: float, primary: str, metadata: tuple[tuple[str, str], ...]
) -> rpb.GetReplicationStatusResponse:
    stub = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
    status: rpb.GetReplicationStatusResponse = stub.GetReplicationStatus(
        rpb.GetReplicationStatusRequest(), timeout=timeout, metadata=metadata or None
    )
    if status.state != rpb.REPLICATION_STATE_PRIMARY:
        state = rpb.ReplicationState.Name(status.state).removeprefix("REPLICATION_STATE_")
        raise RejoinRefused(
            f"{primary} does not take writes (it is {state.lower()}): name the current primary"
        )
    return status


def _check_same_before(
    channel: grpc.Channel,
    timeout: float,
    primary: str,
    cut: int,
    checksum: bytes,
    metadata: tuple[tuple[str, str], ...],
) -> None:
    """The new primary's check that its change at ``cut - 1`` is this folder's (a replica's
    ``after_checksum``): HISTORY_DIVERGED means the histories part earlier than the epochs say."""
    if cut <= 1:
        return
    stub = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
    request = rpb.ChangesRequest(start_position=cut, after_checksum=checksum)
    stream = stub.Changes(request, timeout=timeout, metadata=metadata or None)
    try:
        next(iter(stream), None)
    except grpc.RpcError as error:
        if "HISTORY_DIVERGED" not in _reasons(error):
            raise
        raise RejoinRefused(
            f"{primary}'s change at position {cut - 1} is not this folder's, although the epoch "
            "histories agree up to there: the stores part earlier. Nothing was changed; set "
            "this store aside with `sessionlog replica resync` and copy the primary instead"
        ) from None
    finally:
        stream.cancel()


def _reasons(error: grpc.RpcError) -> str:
    found = []
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    found.append(info.reason)
    return " ".join(found)


def _discarded_preview(data: Path, cut: int, head: int) -> list[rebuild.Discarded]:
    env, tables = open_readonly(str(data))
    try:
        with env.begin() as txn:
            return [rebuild.discarded_at(txn, tables, p) for p in range(cut, head + 1)]
    finally:
        env.close()


def _note(
    primary: str, cut: int, discarded: list[rebuild.Discarded], report: Path
) -> dict[str, Any]:
    sessions = sorted({d.session_id for d in discarded if d.session_id})
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "primary": primary,
        "kept_through": cut - 1,
        "discarded": len(discarded),
        "first_discarded": cut if discarded else 0,
        "last_discarded": discarded[-1].position if discarded else 0,
        "events": sum(len(d.seqs) for d in discarded),
        "sessions": sessions,
        "report": report.name,
    }


def _report(
    primary: str,
    status: rpb.GetReplicationStatusResponse,
    mine: Leadership,
    cut: int,
    rebuilt: rebuild.Rebuilt,
) -> dict[str, object]:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "primary": primary,
        "primary_epoch": status.epoch,
        "primary_position": status.position,
        "primary_epoch_history": [[e.epoch, e.first_position] for e in status.epoch_history],
        "epoch_before": mine.epoch,
        "epoch_history_before": [list(entry) for entry in mine.history],
        "kept_through": cut - 1,
        "set_aside": rebuilt.set_aside,
        "discarded": [vars(d) for d in rebuilt.discarded],
    }
