"""`sessionlog admin compact --online` beside a running server: the copy is taken while the
server writes, and the restarted server brings it up to date and swaps it in
(``storage.compaction``): smaller file, every write kept, the folder verifies."""

from __future__ import annotations

import fcntl
import json
import subprocess
from pathlib import Path
from subprocess import PIPE

import grpc
import pytest

from sessionlog.storage import compaction, folder
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import append, log_bytes, say
from tests.e2e._proc import SESSIONLOG, ServerProcess, clean_env, free_port, run_cli

pytestmark = pytest.mark.workers

PAD = "x" * 2_000


def test_an_online_copy_is_swapped_in_at_the_next_start_with_the_writes_after_it(
    tmp_path: Path,
) -> None:
    """Write, delete most of it, copy online, write and delete more, restart: the data file
    shrinks, the sessions read as before the restart, and `admin verify` finds nothing."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for n in range(60):
                append(stub, f"s{n:02d}", *[say(f"{n}.{i} {PAD}") for i in range(20)])
            for n in range(10, 60):
                stub.DeleteSession(pb.DeleteSessionRequest(session_id=f"s{n:02d}"), timeout=30)
            copied = run_cli(
                ["admin", "compact", "--online", "--json", "--data", str(data)], tmp_path
            )
            assert copied.returncode == 0, copied.stdout + copied.stderr
            pending = json.loads(copied.stdout)
            assert pending["bytes_copy"] < pending["bytes_now"]
            assert (data / compaction.PENDING / folder.DATA_FILE).is_file()
            append(stub, "s00", say("after the copy"))  # in the feed after the copy
            append(stub, "late", say("a session begun after the copy"))
            stub.DeleteSession(pb.DeleteSessionRequest(session_id="s09"), timeout=30)
            kept = {sid: log_bytes(stub, sid) for sid in [f"s{n:02d}" for n in range(9)]}
            kept["late"] = log_bytes(stub, "late")
        server.stop()
    before = (data / folder.DATA_FILE).stat().st_size

    with ServerProcess(args, tmp_path) as again:
        again.wait_serving(address)
        assert "swapped in the compacted copy taken online" in again.log()
        after = (data / folder.DATA_FILE).stat().st_size
        assert after < before / 2, (before, after)
        assert not (data / compaction.PENDING).exists()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert {sid: log_bytes(stub, sid) for sid in kept} == kept
            assert log_bytes(stub, "s09") == []
            append(stub, "s00", say("and after the swap"))
        again.stop()
    verified = run_cli(["admin", "verify", "--data", str(data)], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    print(f"online compaction: {before:,} -> {after:,} bytes")  # for the docs (-s)


def test_a_copy_of_another_history_is_dropped_at_start(tmp_path: Path) -> None:
    """A pending copy whose newest record the folder does not hold the same (here: a copy of
    another folder) is removed at start and the folder opens as it was."""
    data, other = tmp_path / "data", tmp_path / "other"
    address = f"127.0.0.1:{free_port()}"
    for folder_path, name in ((other, "theirs"), (data, "ours")):
        args = ["--data", str(folder_path), "--listen", address]
        with ServerProcess(args, tmp_path) as server:
            server.wait_serving(address)
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                append(stub, name, say(name), say("two"))
            server.stop()
    assert run_cli(["admin", "compact", "--online", "--data", str(other)], tmp_path).returncode == 0
    (other / compaction.PENDING).rename(data / compaction.PENDING)
    args = ["--data", str(data), "--listen", address]
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        assert "not of this folder's history" in server.log()
        assert not (data / compaction.PENDING).exists()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert len(log_bytes(stub, "ours")) == 2
            assert log_bytes(stub, "theirs") == []
        server.stop()


def test_a_damaged_copy_is_dropped_at_start_and_the_folder_opens_as_it_was(
    tmp_path: Path,
) -> None:
    """A pending copy whose data file is cut short (LMDB would fault reading past its end) or
    overwritten is not what `admin compact --online` wrote: each is removed at start, and the
    server starts on its own data file with every write in it."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    copied = data / compaction.PENDING / folder.DATA_FILE
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for n in range(5):
                append(stub, f"s{n}", *[say(f"{n}.{i} {PAD}") for i in range(20)])
            kept = {f"s{n}": log_bytes(stub, f"s{n}") for n in range(5)}
        server.stop()
    for damage in ("cut short", "overwritten"):
        online = run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path)
        assert online.returncode == 0, online.stdout + online.stderr
        size = copied.stat().st_size
        with copied.open("r+b") as damaged:
            if damage == "cut short":
                damaged.truncate(size // 2)
            else:
                damaged.seek(size // 3)
                damaged.write(b"\x5a" * (size // 3))
        with ServerProcess(args, tmp_path) as server:
            server.wait_serving(address)
            assert "removed a compacted copy taken online" in server.log(), damage
            assert not (data / compaction.PENDING).exists(), damage
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                assert {sid: log_bytes(stub, sid) for sid in kept} == kept, damage
            server.stop()
    verified = run_cli(["admin", "verify", "--data", str(data)], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_erasure_of_the_copys_newest_record_keeps_the_copy(tmp_path: Path) -> None:
    """The copy's newest record is the append of a session deleted after the copy: the delete
    rewrites that record to its erased form (same checksum, other bytes), which is still this
    folder's history, so the copy is swapped in, not dropped, and the session stays gone."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            append(stub, "kept", say("kept"))
            append(stub, "last", *[say(f"secret {i} {PAD}") for i in range(20)])
            copied = run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path)
            assert copied.returncode == 0, copied.stdout + copied.stderr
            stub.DeleteSession(pb.DeleteSessionRequest(session_id="last"), timeout=30)
        server.stop()
    with ServerProcess(args, tmp_path) as again:
        again.wait_serving(address)
        assert "swapped in the compacted copy taken online" in again.log()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert log_bytes(stub, "last") == []
            assert len(log_bytes(stub, "kept")) == 1
        again.stop()
    verified = run_cli(["admin", "verify", "--data", str(data)], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_two_online_copies_at_once_one_refused_clearly(tmp_path: Path) -> None:
    """Two `admin compact --online` started together on one folder: a copy that runs exits 0,
    one refused says another copy is running (never a file vanished under it), and the
    restarted server swaps in a copy with every session whole."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    command = [str(SESSIONLOG), "admin", "compact", "--online", "--data", str(data)]
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for n in range(100):
                append(stub, f"s{n:03d}", *[say(f"{n}.{i} {PAD}") for i in range(20)])
            kept = {f"s{n:03d}": log_bytes(stub, f"s{n:03d}") for n in range(100)}
        copies = [
            subprocess.Popen(command, stdout=PIPE, stderr=PIPE, env=clean_env(), text=True)
            for _ in range(2)
        ]
        ended = [(copy.wait(timeout=120), copy.communicate()[1]) for copy in copies]
        server.stop()
    assert 0 in [code for code, _ in ended], ended
    for code, stderr in ended:
        assert code == 0 or "another `admin compact --online`" in stderr, (code, stderr)
    with ServerProcess(args, tmp_path) as again:
        again.wait_serving(address)
        assert "swapped in the compacted copy taken online" in again.log()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert {sid: log_bytes(stub, sid) for sid in kept} == kept
        again.stop()


def test_a_start_while_a_copy_is_written_leaves_it_alone(tmp_path: Path) -> None:
    """A server started while an online copy holds its lock (held here by the test, as a
    running copy holds it) neither swaps nor removes anything and starts on its own file; the
    start after the copy ends swaps the copy in."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    args = ["--data", str(data), "--listen", address]
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            append(stub, "kept", say(f"kept {PAD}"))
        server.stop()
    assert run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path).returncode == 0
    (data / compaction.PARTIAL).mkdir()  # as a copy being written has it
    with (data / compaction.COPYING).open("w") as copying:
        fcntl.flock(copying, fcntl.LOCK_EX)
        with ServerProcess(args, tmp_path) as server:
            server.wait_serving(address)
            assert "is copying this folder" in server.log()
            assert (data / compaction.PENDING / folder.DATA_FILE).is_file()
            assert (data / compaction.PARTIAL).is_dir()
            server.stop()
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        assert "swapped in the compacted copy taken online" in server.log()
        assert not (data / compaction.PARTIAL).exists()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            assert len(log_bytes(stub, "kept")) == 1
        server.stop()
