"""kill -9 while a server indexes the change feed of a store from before the index
(``storage.feed_index.catch_up``, in batches of SESSIONLOG_FEED_INDEX_BATCH records): the server
that starts again finishes it, `admin verify` finds the index whole, and a delete then leaves no
record that names its session."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import lmdb

from sessionlog.defaults import NOSYNC
from sessionlog.storage import feed_index, schema
from sessionlog.storage.store import StoreConfig
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import log
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli
from tests.integration.helpers import opened, user
from tests.integration.test_feed_index import forget_the_index

RECORDS = 3_000


def progress(data: Path) -> tuple[int, int]:
    """(indexed, newest) positions, read beside the server (LMDB readers share the file)."""
    env = lmdb.open(str(data), readonly=True, max_dbs=len(schema.ALL_DBS))
    try:
        tables = Tables(env)
        with env.begin() as txn:
            indexed = feed_index.indexed(txn, tables) if tables.feed_index is not None else 0
            return indexed, feed_index.newest(txn, tables)
    finally:
        env.close()


def test_a_server_killed_while_it_indexes_the_feed_finishes_it_after_a_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with opened(data, StoreConfig(durability=NOSYNC)) as store:
        store.append("victim", [user("secret one"), user("secret two")])
        for n in range(RECORDS):
            store.append(f"s{n % 50}", [user(f"e{n}")])
        store.append("victim", [user("secret three")])
    forget_the_index(data)
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    env = clean_env(SESSIONLOG_FEED_INDEX_BATCH="20")
    server = ServerProcess(args, tmp_path, env=env).start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            indexed, newest = progress(data)
            if 0 < indexed < newest:
                break
            time.sleep(0.005)
    finally:
        server.kill()
    assert 0 < indexed < newest, "killed half-way through the index"
    assert progress(data)[0] < newest
    server = ServerProcess(args, tmp_path).start()
    try:
        server.wait_serving(address)
        assert progress(data)[0] == progress(data)[1]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert len(log(stub, "victim")) == 3
            stub.DeleteSession(pb.DeleteSessionRequest(session_id="victim"), timeout=10)
    finally:
        server.stop()
    done = run_cli(["admin", "verify", "--data", str(data)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    reading = lmdb.open(str(data), readonly=True, max_dbs=len(schema.ALL_DBS))
    try:
        tables = Tables(reading)
        with reading.begin() as txn:
            feed = [rpb.Change.FromString(bytes(v)) for _, v in txn.cursor(db=tables.changes)]
    finally:
        reading.close()
    named = [c for c in feed if c.session_id == "victim"]
    assert [c.kind for c in named] == [rpb.CHANGE_KIND_DELETE]
