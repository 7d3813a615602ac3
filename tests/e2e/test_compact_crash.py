"""A server killed while it swaps in a copy `admin compact --online` left (``storage.compaction``):
every acknowledged write survives, and the copy is swapped in or dropped, never half used. Run
once, in one process: the swap happens in the supervisor before any worker starts, so
``--workers 2`` adds nothing to it."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from sessionlog.storage import compaction, folder
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import append, log_bytes, say
from tests.e2e._proc import ServerProcess, free_port, run_cli

PAD = "x" * 2_000


TRIES = 5
"""Starts killed at their first write to the pending copy until one is killed before its swap:
the catch-up takes tens of milliseconds, and a busy machine can hold this process up as long
between seeing the write and the kill (a late kill swaps the copy in, as in the sweep below)."""


@pytest.mark.timeout(120 * TRIES)  # a try: starts, an online copy, 4 MB written
def test_a_server_killed_while_it_swaps_a_copy_in_keeps_every_write(tmp_path: Path) -> None:
    """SIGKILL of a server while it brings a pending copy up to date at its start (the copy's
    data file is being written: its modification time moved): the next start drops the copy,
    which is no longer what was sealed, and serves every write acknowledged before; and a start
    killed at a sweep of other moments (before, during or after the swap) never loses one
    either."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    pending = data / compaction.PENDING
    kept: dict[str, list[bytes]] = {}

    def copy_with_writes_after() -> None:
        """A copy taken online, then about 4 MB written for the next start to catch up on."""
        with ServerProcess(args, tmp_path) as server:
            server.wait_serving(address)
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                append(stub, "first", say(f"before the copy {PAD}"))
                copied = run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path)
                assert copied.returncode == 0, copied.stdout + copied.stderr
                for n in range(100):
                    append(stub, f"s{n:03d}", *[say(f"{n}.{i} {PAD}") for i in range(20)])
                kept.update(
                    {sid: log_bytes(stub, sid) for sid in ["first", "s000", "s050", "s099"]}
                )
            server.stop()

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

    for _ in range(TRIES):
        copy_with_writes_after()
        killed = killed_at_its_first_write(args, tmp_path, pending / folder.DATA_FILE)
        if (pending / folder.DATA_FILE).exists():
            break  # killed before the swap
        serves_every_write()
    else:
        raise AssertionError(f"none of {TRIES} starts was killed before it swapped the copy in")
    assert "swapped in the compacted copy" not in killed.log()
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


def killed_at_its_first_write(args: list[str], cwd: Path, copy: Path) -> ServerProcess:
    """A server started on the folder and SIGKILLed as soon as it writes to the pending copy's
    data file ``copy`` (its modification time moves, or it is gone: swapped in already)."""
    sealed = modified(copy)
    assert sealed is not None
    killed = ServerProcess(args, cwd).start()
    assert killed.process is not None
    try:
        deadline = time.monotonic() + 60
        while modified(copy) == sealed:
            assert killed.process.poll() is None, killed.log()
            assert time.monotonic() < deadline, "the start never wrote to the pending copy"
            time.sleep(0.001)
        killed.kill()
    finally:
        if killed.process.poll() is None:
            killed.kill()
    return killed


def modified(path: Path) -> int | None:
    """The file's modification time (ns), None once it is gone."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
