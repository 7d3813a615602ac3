"""Remote administration over AdminService: `admin stats --server` and `admin snapshot save`
against a real `sessionlog serve` process with auth on, an admin token doing what a local read of
the folder does, and every other token refused."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from sessionlog.cli.admin_online import SnapshotRefused, receive_snapshot
from sessionlog.cli.client import channel as client_channel
from sessionlog.storage.snapshot import TEMPORARY_PREFIX
from sessionlog.testing import error_info
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, free_port, run_cli
from tests.e2e.test_admin import MAP_SIZE, event, raw_events, serving, session_ids
from tests.e2e.test_auth import ADMIN, READER, TENANT_ADMIN, tokens_file

TIMEOUT = 10.0
WRITERS = 3
WRITE_SECONDS = 10.0


@contextmanager
def serving_with_auth(cwd: Path, data: str) -> Iterator[str]:
    """A `sessionlog serve` process on ``data`` with the shared tokens file (health open)."""
    tokens = tokens_file(cwd / "tokens.toml")
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", data, "--listen", address, "--map-size", str(MAP_SIZE)]
    args += ["--auth-tokens", str(tokens), "--auth-open-health"]
    with ServerProcess(args, cwd, name="admin-remote") as process:
        process.wait_serving(address)
        yield address


def open_channel(address: str, token: str) -> grpc.Channel:
    """A channel that sends ``token`` on every call, built as the CLI builds its own."""
    return client_channel(argparse.Namespace(server=address, token=token, tls_ca=""))


def admin_stub(channel: grpc.Channel) -> apb_grpc.AdminServiceStub:
    return apb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]


def fill(address: str, sessions: int, events: int, content_bytes: int = 200) -> None:
    """Append ``events`` events (with ``content_bytes`` of content) to each of ``sessions``."""
    with open_channel(address, ADMIN) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for s in range(sessions):
            batch = []
            for i in range(events):
                made = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
                made.data.update({"content": f"{s}.{i} " + "x" * content_bytes})
                batch.append(made)
            stub.Append(pb.AppendRequest(session_id=f"fill-{s}", events=batch), timeout=TIMEOUT)


def temporary_folders(where: Path) -> list[Path]:
    return sorted(where.glob(TEMPORARY_PREFIX + "*"))


def test_remote_stats_equal_the_local_read_of_the_same_folder(tmp_path: Path) -> None:
    """`admin stats --server` with no --data prints, from the server alone, the same fields and
    values as `admin stats --data` of the folder that server writes to."""
    with serving_with_auth(tmp_path, "data") as address:
        fill(address, sessions=3, events=4)
        remote = run_cli(
            ["admin", "stats", "--server", address, "--token", ADMIN, "--json"], tmp_path
        )
        local = run_cli(
            ["admin", "stats", "--data", "data", "--server", address, "--token", ADMIN, "--json"],
            tmp_path,
        )
        text = run_cli(["admin", "stats", "--server", address, "--token", ADMIN], tmp_path)
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    over_grpc, on_disk = json.loads(remote.stdout), json.loads(local.stdout)
    # The local read takes a reader slot of its own; every other number is the folder's.
    assert over_grpc.pop("readers") >= 1
    assert on_disk.pop("readers") >= 1
    assert over_grpc == on_disk
    assert over_grpc["sessions"] == 3
    assert over_grpc["events"] == 12
    assert over_grpc["data"] == str((tmp_path / "data").absolute())
    assert over_grpc["replication"]["role"] == "primary"
    assert text.returncode == 0, text.stderr
    lines = dict(line.split(None, 1) for line in text.stdout.splitlines())
    assert lines["events"] == "12"
    assert lines["map_size"].startswith(f"{MAP_SIZE} ")


def test_snapshot_during_writes_restores_consistent_prefixes(tmp_path: Path) -> None:
    """A snapshot saved over gRPC while writers append is a file `admin restore` installs in a
    new folder, where a server holds a dense prefix of every session with the source's bytes
    (every append acknowledged before the snapshot began included) under a new history id."""
    acknowledged: dict[str, int] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    def write(n: int) -> None:
        session_id = f"writer-{n}"
        try:
            with open_channel(address, ADMIN) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                deadline = time.monotonic() + WRITE_SECONDS
                for i in range(5000):
                    if stop.is_set() or time.monotonic() > deadline:
                        return
                    reply = stub.Append(
                        pb.AppendRequest(session_id=session_id, events=[event(i), event(i + 1)]),
                        timeout=TIMEOUT,
                    )
                    acknowledged[session_id] = reply.next_seq
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    with serving_with_auth(tmp_path, "data") as address:
        threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + WRITE_SECONDS
        while sum(acknowledged.values()) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = dict(acknowledged)
        saved = run_cli(
            ["admin", "snapshot", "save", "snap.mdb", "--server", address, "--token", ADMIN],
            tmp_path,
        )
        during = dict(acknowledged)
        stop.set()
        for thread in threads:
            thread.join(WRITE_SECONDS + TIMEOUT)
        assert not failures, failures
        with open_channel(address, ADMIN) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            source_events = {s: raw_events(channel, s) for s in session_ids(stub)}
            status = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
            source_history = status.GetReplicationStatus(
                rpb.GetReplicationStatusRequest(), timeout=TIMEOUT
            ).history_id
    assert saved.returncode == 0, saved.stderr
    assert "SHA-256 verified" in saved.stdout
    assert sum(during.values()) > sum(before.values()), "no write ran during the snapshot"
    assert not (tmp_path / "snap.mdb.part").exists()
    assert temporary_folders(tmp_path) == []

    restored = run_cli(["admin", "restore", "snap.mdb", "--data", "restored"], tmp_path)
    assert restored.returncode == 0, restored.stderr
    with serving(tmp_path, "restored", "restored") as copy, grpc.insecure_channel(copy) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        backed_up = {s: raw_events(channel, s) for s in session_ids(stub)}
        status = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
        copy_history = status.GetReplicationStatus(
            rpb.GetReplicationStatusRequest(), timeout=TIMEOUT
        ).history_id
    assert copy_history
    assert copy_history != source_history
    assert set(before) <= set(backed_up) <= set(source_events)
    for session_id, events in backed_up.items():
        seqs = [event_pb2.Event.FromString(raw).seq for raw in events]
        assert seqs == list(range(len(events))), f"{session_id}: seqs not dense"
        assert events == source_events[session_id][: len(events)], f"{session_id}: bytes differ"
        assert len(events) >= before.get(session_id, 0), f"{session_id}: acknowledged lost"


@pytest.mark.parametrize(
    ("token", "why"),
    [(READER, "lacks the admin"), (TENANT_ADMIN, "limited to sessions")],
    ids=["reader", "tenant-admin"],
)
def test_tokens_without_whole_store_admin_are_denied(tmp_path: Path, token: str, why: str) -> None:
    """A read token and an admin token limited to a session prefix get PERMISSION_DENIED from
    both RPCs, over gRPC and from the CLI (exit 1, no file written)."""
    with serving_with_auth(tmp_path, "data") as address:
        fill(address, sessions=1, events=2)
        with open_channel(address, token) as channel:
            stub = admin_stub(channel)
            calls: dict[str, Callable[[], object]] = {
                "GetStats": lambda: stub.GetStats(apb.GetStatsRequest(), timeout=TIMEOUT),
                "SaveSnapshot": lambda: list(
                    stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=TIMEOUT)
                ),
            }
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                assert error_info(refused.value).reason == "PERMISSION_DENIED", name
                assert why in (refused.value.details() or ""), name
        stats = run_cli(["admin", "stats", "--server", address, "--token", token], tmp_path)
        save = run_cli(
            ["admin", "snapshot", "save", "s.mdb", "--server", address, "--token", token],
            tmp_path,
        )
    for result in (stats, save):
        assert result.returncode == 1
        assert "PERMISSION_DENIED" in result.stderr
    assert not (tmp_path / "s.mdb").exists()
    assert not (tmp_path / "s.mdb.part").exists()
    assert temporary_folders(tmp_path) == []


def test_a_client_that_cancels_mid_stream_leaves_no_temporary_copy(tmp_path: Path) -> None:
    """A client that reads the info and one chunk of a multi-chunk snapshot, then cancels, or
    cancels before anything arrived (while the copy may still be made), leaves no temporary copy
    beside the data folder, and the server goes on serving snapshots."""
    with serving_with_auth(tmp_path, "data") as address:
        fill(address, sessions=4, events=100, content_bytes=10_000)  # about 4 MiB
        with open_channel(address, ADMIN) as channel:
            stream = admin_stub(channel).SaveSnapshot(apb.SaveSnapshotRequest(), timeout=TIMEOUT)
            info = next(stream).info
            chunk = next(stream).chunk
            during = temporary_folders(tmp_path)
            stream.cancel()
            assert info.size_bytes > 3 * len(chunk) > 0
            assert len(during) == 1, "the copy is made beside the data folder"
            deadline = time.monotonic() + TIMEOUT
            while temporary_folders(tmp_path) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert temporary_folders(tmp_path) == []
            # Cancelled at once, this call's folder may not be made yet when cancel() returns
            # (or ever): the server is known to be past it only once a later call has run.
            admin_stub(channel).SaveSnapshot(apb.SaveSnapshotRequest(), timeout=TIMEOUT).cancel()
            whole = list(
                admin_stub(channel).SaveSnapshot(apb.SaveSnapshotRequest(), timeout=TIMEOUT)
            )
            deadline = time.monotonic() + TIMEOUT
            while temporary_folders(tmp_path) and time.monotonic() < deadline:
                time.sleep(0.02)
    assert whole[-1].WhichOneof("kind") == "sha256"
    assert sum(len(r.chunk) for r in whole) == whole[0].info.size_bytes
    assert temporary_folders(tmp_path) == []


def test_a_damaged_or_short_download_is_refused(tmp_path: Path) -> None:
    """receive_snapshot accepts a server's stream as sent, and refuses the same stream with one
    byte flipped on the way (SHA-256), or with its last chunk lost (size)."""
    with serving_with_auth(tmp_path, "data") as address:
        fill(address, sessions=2, events=50, content_bytes=20_000)  # about 2 MiB
        with open_channel(address, ADMIN) as channel:
            responses = list(
                admin_stub(channel).SaveSnapshot(apb.SaveSnapshotRequest(), timeout=TIMEOUT)
            )
    chunks = [i for i, r in enumerate(responses) if r.WhichOneof("kind") == "chunk"]
    assert len(chunks) >= 2

    intact = receive_snapshot(responses, tmp_path / "intact.part")
    assert intact.size_bytes == (tmp_path / "intact.part").stat().st_size

    flipped = [apb.SaveSnapshotResponse.FromString(r.SerializeToString()) for r in responses]
    damaged = bytearray(flipped[chunks[0]].chunk)
    damaged[len(damaged) // 2] ^= 0x01
    flipped[chunks[0]].chunk = bytes(damaged)
    with pytest.raises(SnapshotRefused, match="SHA-256"):
        receive_snapshot(flipped, tmp_path / "flipped.part")

    short = [r for i, r in enumerate(responses) if i != chunks[-1]]
    with pytest.raises(SnapshotRefused, match="bytes arrived"):
        receive_snapshot(short, tmp_path / "short.part")


def test_a_server_takes_at_most_two_snapshots_at_once(tmp_path: Path) -> None:
    """Two snapshots whose clients read slowly hold the server's two snapshot slots (each a copy
    of the store on disk): a third is refused RESOURCE_EXHAUSTED TOO_MANY_SNAPSHOTS and leaves no
    copy behind; once one of the two ends, a new one is taken."""
    with serving_with_auth(tmp_path, "data") as address:
        fill(address, sessions=24, events=100, content_bytes=10_000)  # about 24 MiB
        with open_channel(address, ADMIN) as channel:
            stub = admin_stub(channel)
            first = stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=60)
            second = stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=60)
            assert next(first).info.size_bytes > 20 << 20
            assert next(second).info.size_bytes > 20 << 20
            assert len(temporary_folders(tmp_path)) == 2
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=TIMEOUT))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(refused.value)
            assert info.reason == "TOO_MANY_SNAPSHOTS"
            assert info.metadata["limit"] == "2"
            assert "retry when one has finished" in (refused.value.details() or "")
            assert len(temporary_folders(tmp_path)) == 2
            first.cancel()
            deadline = time.monotonic() + TIMEOUT
            while len(temporary_folders(tmp_path)) > 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            whole = list(stub.SaveSnapshot(apb.SaveSnapshotRequest(), timeout=60))
            assert whole[-1].WhichOneof("kind") == "sha256"
            second.cancel()
    assert temporary_folders(tmp_path) == []


def test_a_start_removes_the_temporary_copies_a_killed_server_left(tmp_path: Path) -> None:
    """Temporary snapshot folders beside the data folder that no process holds and that are a
    minute old are what a killed server left: the next start removes them, with a line each.
    One another process holds (flock), and one made a moment ago, stay."""
    old = time.time() - 3600
    folders = {}
    for name in ("left", "held", "young"):
        folder = folders[name] = tmp_path / f"{TEMPORARY_PREFIX}{name}"
        folder.mkdir()
        (folder / "data.mdb").write_bytes(b"x" * 4096)
        if name != "young":
            os.utime(folder, (old, old))
    held = os.open(folders["held"], os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        tokens = tokens_file(tmp_path / "tokens.toml")
        address = f"127.0.0.1:{free_port()}"
        args = ["--data", "data", "--listen", address, "--auth-tokens", str(tokens)]
        with ServerProcess([*args, "--auth-open-health"], tmp_path, name="stale") as process:
            process.wait_serving(address)
            log = process.log()
    finally:
        os.close(held)
    assert not folders["left"].exists()
    assert folders["held"].exists()
    assert folders["young"].exists()
    assert "left behind" in log
    assert str(folders["left"]) in log
