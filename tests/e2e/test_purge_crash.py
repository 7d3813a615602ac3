"""kill -9 while a long session's rows are being freed: the session stays gone, and the server
that starts again on the folder finishes the purge where the mark says (``storage.purge``); and
a replica following the chunks ends byte for byte with its primary.

Small chunks (the SESSIONLOG_PURGE_* variables) make a 2,000-event session take a couple of
hundred chunks, so the kill lands in the middle of them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import lmdb
import pytest

from sessionlog.storage import purge, schema
from sessionlog.storage.tables import Tables
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import append, failure, log, say
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli
from tests.e2e._replication_cluster import (
    Cluster,
    changes_raw,
    since_raw,
    wait_for,
    wait_position,
)

pytestmark = pytest.mark.workers


def small_chunks() -> dict[str, str]:
    """The server's environment: a session of 500 events is long, a chunk frees 10 keys, and
    rides one group per millisecond at most while writes flow."""
    return clean_env(
        SESSIONLOG_PURGE_FROM="500",
        SESSIONLOG_PURGE_CHUNK_KEYS="10",
        SESSIONLOG_PURGE_CHUNK_RECORDS="2",
        SESSIONLOG_PURGE_PACE_MILLISECONDS="1",
    )


def marks(data: Path) -> list[purge.Purge]:
    """The purge marks of the folder, read beside the server (LMDB readers share the file)."""
    env = lmdb.open(str(data), readonly=True, max_dbs=len(schema.ALL_DBS))
    try:
        tables = Tables(env)
        with env.begin() as txn:
            return purge.pending(txn, tables)
    finally:
        env.close()


def verified(data: Path) -> str:
    done = run_cli(["admin", "verify", "--data", str(data)], data.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


def test_a_killed_purge_resumes_after_a_restart(tmp_path: Path) -> None:
    """Deleted, then killed mid-purge: the folder verifies with the mark left half-way, the
    session is still gone after the restart, the purge ends, and the other session is whole."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    server = ServerProcess(args, tmp_path, env=small_chunks()).start()
    try:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for batch in range(20):
                append(stub, "long", *[say(f"secret {batch}.{n}") for n in range(100)])
                append(stub, "other", say(f"kept {batch}"))
            stub.DeleteSession(pb.DeleteSessionRequest(session_id="long"), timeout=10)
            assert log(stub, "long") == []
            again = failure(stub.DeleteSession, pb.DeleteSessionRequest(session_id="long"))
            assert again.code() == grpc.StatusCode.NOT_FOUND
            deadline = time.monotonic() + 20
            while not any(m.scanned for m in marks(data)) and time.monotonic() < deadline:
                time.sleep(0.01)
        server.kill()
    finally:
        server.kill()
    [left] = marks(data)
    assert left.session_id == "long"
    assert left.scanned > 0
    verified(data)

    with ServerProcess(args, tmp_path, env=small_chunks()) as again:
        again.wait_serving(address)
        deadline = time.monotonic() + 60
        while marks(data) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marks(data) == []
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert log(stub, "long") == []
            assert [e.data["content"] for e in log(stub, "other")] == [
                f"kept {b}" for b in range(20)
            ]
        again.stop()
    assert "secret" not in verified(data)


def test_a_replica_frees_the_same_rows_in_the_same_chunks(tmp_path: Path) -> None:
    """A replica following a primary while it deletes a session of 10,500 events (over the
    default threshold) ends with the primary's change feed byte for byte, no mark left, and
    verifies clean; the session is gone on it at once, like on the primary."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "live")
        stub = primary.stub()
        for batch in range(21):
            append(stub, "long", *[say(f"secret {batch}.{n}") for n in range(500)])
        append(stub, "keep", say("kept"))
        stub.DeleteSession(pb.DeleteSessionRequest(session_id="long"), timeout=30)
        wait_position(replica, int(primary.status().position))
        assert log(replica.stub(), "long") == []
        wait_for("the purge", lambda: not marks(primary.data), 60)
        head = int(primary.status().position)
        wait_position(replica, head)
        assert marks(replica.data) == []
        assert changes_raw(replica.channel) == changes_raw(primary.channel)
        assert since_raw(replica.channel, "keep") == since_raw(primary.channel, "keep")
        for node in (primary, replica):
            assert node.stop() == 0
            assert "secret" not in verified(node.data)


def test_a_purge_ends_while_another_session_is_appended_to_without_pause(tmp_path: Path) -> None:
    """The server's purge runs to its end beside a client that appends to another session
    back to back the whole time (its chunks ride with those appends), and every append is
    acknowledged and kept."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    with ServerProcess(args, tmp_path, env=small_chunks()) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for batch in range(20):
                append(stub, "long", *[say(f"secret {batch}.{n}") for n in range(100)])
            stop = threading.Event()
            acknowledged: list[int] = []

            def appender() -> None:
                while not stop.is_set():
                    append(stub, "busy", say(f"busy {len(acknowledged)}"))
                    acknowledged.append(1)

            thread = threading.Thread(target=appender)
            thread.start()
            try:
                time.sleep(0.2)
                at_delete = len(acknowledged)
                stub.DeleteSession(pb.DeleteSessionRequest(session_id="long"), timeout=10)
                deadline = time.monotonic() + 60
                while marks(data) and time.monotonic() < deadline:
                    time.sleep(0.05)
                during = len(acknowledged)
            finally:
                stop.set()
                thread.join(30)
            assert marks(data) == []
            assert during > at_delete  # appends went on while the chunks ran
            assert [e.data["content"] for e in log(stub, "busy")] == [
                f"busy {n}" for n in range(len(acknowledged))
            ]
        server.stop()
    assert "secret" not in verified(data)
