"""A server killed while it swaps in a copy `admin compact --online` left (``storage.compaction``):
every acknowledged write survives, and the copy is swapped in or dropped, never half used. Run
once, in one process: the swap happens in the supervisor before any worker starts, so
``--workers 2`` adds nothing to it."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from sessionlog.storage import compaction, folder
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import append, log_bytes, say
from tests.e2e._proc import ServerProcess, free_port, run_cli

PAD = "x" * 2_000


def test_a_server_killed_while_it_swaps_a_copy_in_keeps_every_write(tmp_path: Path) -> None:
    """SIGKILL of a server while it brings a pending copy up to date at its start (the copy's
    data file is being written: its modification time moved): the next start drops the copy,
    which is no longer what was sealed, and serves every write acknowledged before; and a start
    killed at a sweep of other moments (before, during or after the swap) never loses one
    either."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    pending = data / compaction.PENDING
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            append(stub, "first", say(f"before the copy {PAD}"))
            copied = run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path)
            assert copied.returncode == 0, copied.stdout + copied.stderr
            for n in range(100):  # about 4 MB for the copy to catch up on
                append(stub, f"s{n:03d}", *[say(f"{n}.{i} {PAD}") for i in range(20)])
            kept = {sid: log_bytes(stub, sid) for sid in ["first", "s000", "s050", "s099"]}
        server.stop()

    sealed = (pending / folder.DATA_FILE).stat().st_mtime_ns
    killed = ServerProcess(args, tmp_path).start()
    assert killed.process is not None
    try:
        deadline = time.monotonic() + 60
        while (pending / folder.DATA_FILE).stat().st_mtime_ns == sealed:
            assert killed.process.poll() is None, killed.log()
            assert time.monotonic() < deadline, "the start never wrote to the pending copy"
            time.sleep(0.001)
        killed.kill()
    finally:
        if killed.process.poll() is None:
            killed.kill()
    assert "swapped in the compacted copy" not in killed.log()

    def serves_every_write() -> str:
        with ServerProcess(args, tmp_path) as server:
            server.wait_serving(address)
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                assert {sid: log_bytes(stub, sid) for sid in kept} == kept
                append(stub, "first", say("after the restart"))
                kept["first"] = log_bytes(stub, "first")
            server.stop()
            return server.log()

    assert "removed a compacted copy taken online" in serves_every_write()
    assert not pending.exists()

    for delay in (0.3, 1.0):  # a fresh copy each time, the start killed at another moment
        copied = run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path)
        assert copied.returncode == 0, copied.stdout + copied.stderr
        with ServerProcess(args, tmp_path) as server:
            time.sleep(delay)
            server.kill()
        serves_every_write()
        assert not pending.exists()  # swapped in or removed by the start after the kill
    verified = run_cli(["admin", "verify", "--data", str(data)], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
