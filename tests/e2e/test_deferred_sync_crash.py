"""--durability group under SIGKILL between a commit's two syncs, then a simulated power cut.

A real `sessionlog serve --durability group` takes appends from several client threads. Once
some are acknowledged, the writer is told (SESSIONLOG_TEST_PAUSE_BEFORE_SYNC) to stop right
where it would next sync its last commit's meta page: that commit's data pages are synced, its
meta page is only in the page cache, and its replies are held. The test kills the process there
(SIGKILL), then does what a power cut could do to a page that was never synced: it undoes the
newest meta page (LMDB opens the previous commit instead). The restarted server must still hold
every acknowledged append, byte for byte at its seq; the writes undone were never acknowledged.
With --workers N every writer that commits after the trigger pauses before acknowledging that
commit, and the test waits until the acknowledgements stop: the newest commit's meta page is
then the only one not synced (each commit's data sync flushes the file, earlier meta pages with
it).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import lmdb
import pytest

from sessionlog.storage import schema, writer
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import log_bytes, user
from tests.e2e._proc import ServerProcess, clean_env, free_port

pytestmark = pytest.mark.workers

CLIENTS = 6
ACKED_BEFORE_PAUSE = 60
WAIT_SECONDS = 60.0
TXNID_OFFSET = 16 + 4 + 4 + 8 + 8 + 2 * 48 + 8
"""Where a meta page keeps its txnid (LMDB 0.9, 64-bit): past the page header (16 bytes), the
magic, version, address and map size, the two database records and the last page number."""


@dataclass
class Client:
    """One client thread's appends to its own session: what was acknowledged, what failed."""

    session_id: str
    acked: dict[int, bytes] = field(default_factory=dict)
    """seq -> the stored bytes the reply carried."""
    failed: int = 0


def _append_until_refused(address: str, client: Client, stop: threading.Event) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        i = 0
        while not stop.is_set():
            request = pb.AppendRequest(session_id=client.session_id, events=[user(f"e{i}", i=i)])
            try:
                reply = stub.Append(request, timeout=WAIT_SECONDS)
            except grpc.RpcError:
                client.failed += 1  # the server was killed under this call: outcome unknown
                return
            for raw in reply.events:
                client.acked[_seq_of(raw)] = raw.SerializeToString()
            i += 1


def _acked(clients: list[Client]) -> int:
    return sum(len(client.acked) for client in clients)


def _settled(clients: list[Client]) -> bool:
    """No acknowledgement for half a second: every writer that was taking appends has paused
    (a writer paused before syncing its newest commit; an idle one had synced its last)."""
    before = _acked(clients)
    time.sleep(0.5)
    return _acked(clients) == before


def _wait(done: Callable[[], bool], server: ServerProcess, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not done():
        assert time.monotonic() < deadline, f"waited in vain for {what}:\n{server.log()}"
        time.sleep(0.02)


def _seq_of(event: object) -> int:
    seq: int = event.seq  # type: ignore[attr-defined]
    return seq


def _last_txnid(data: Path) -> int:
    env = lmdb.open(str(data), readonly=True, lock=False, max_dbs=len(schema.ALL_DBS))
    try:
        txnid: int = env.info()["last_txnid"]
        return txnid
    finally:
        env.close()


def _undo_newest_meta(data: Path) -> tuple[int, int]:
    """Undo the newer of LMDB's two meta pages, as if its write never reached the disk: the
    page then still holds the commit two before it, so its txnid goes two back (its roots stay,
    but LMDB only ever reads the newer page's, which is now the commit before). Returns (the
    newest txnid, the one LMDB opens now)."""
    env = lmdb.open(str(data), readonly=True, lock=False, max_dbs=len(schema.ALL_DBS))
    page = env.stat()["psize"]
    env.close()
    path = data / "data.mdb"
    with path.open("r+b") as file:
        txnids = []
        for index in (0, 1):
            file.seek(index * page + TXNID_OFFSET)
            txnids.append(struct.unpack("<Q", file.read(8))[0])
        newest = 0 if txnids[0] > txnids[1] else 1
        file.seek(newest * page + TXNID_OFFSET)
        file.write(struct.pack("<Q", max(txnids) - 2))
    (data / "lock.mdb").unlink(missing_ok=True)
    return max(txnids), min(txnids)


def test_acknowledged_appends_survive_a_kill_and_a_lost_meta_page(tmp_path: Path) -> None:
    """SIGKILL while a commit's meta page is unsynced, that page then undone: every append the
    server acknowledged is read back after a restart; only unacknowledged ones are gone."""
    data = tmp_path / "data"
    trigger = tmp_path / "pause"
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address, "--durability", "group"]
    clients = [Client(f"crash-{i}") for i in range(CLIENTS)]
    stop = threading.Event()
    paused_env = clean_env()
    paused_env[writer.PAUSE_ENV] = str(trigger)
    server = ServerProcess(args, tmp_path, env=paused_env)
    with server:
        server.wait_serving(address)
        threads = [
            threading.Thread(target=_append_until_refused, args=(address, client, stop))
            for client in clients
        ]
        for thread in threads:
            thread.start()
        _wait(lambda: _acked(clients) >= ACKED_BEFORE_PAUSE, server, "appends acknowledged")
        trigger.touch()  # each writer that commits from now on stops before its covering sync
        _wait(lambda: Path(f"{trigger}.paused").exists(), server, "a writer paused")
        _wait(lambda: _settled(clients), server, "the acknowledgements stopped")
        server.kill()
        stop.set()
        for thread in threads:
            thread.join(WAIT_SECONDS)
    assert _acked(clients) >= ACKED_BEFORE_PAUSE
    assert sum(client.failed for client in clients) >= 1, "no call was cut off by the kill"

    killed_at = _last_txnid(data)
    newest, opened = _undo_newest_meta(data)
    assert newest == killed_at
    assert _last_txnid(data) == opened < killed_at  # the power cut undid the last commit

    restart = ServerProcess(args[:-2], tmp_path, env=clean_env())
    with restart, grpc.insecure_channel(address) as channel:
        restart.wait_serving(address)
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for client in clients:
            stored = log_bytes(stub, client.session_id)
            for seq, raw in client.acked.items():
                assert seq < len(stored), f"{client.session_id}: acknowledged seq {seq} lost"
                assert stored[seq] == raw, f"{client.session_id}: seq {seq} changed"
            assert len(stored) >= len(client.acked)
        restart.stop()
