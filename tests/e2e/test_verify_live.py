"""`admin verify` beside a running server that keeps writing: the docs say the reading tools
run beside a live server, so what verify reports must be the store's state at one moment,
never a mix of tables read at different moments (which looks like missing index keys)."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import append, log, say
from tests.e2e._proc import ServerProcess, free_port, run_cli

pytestmark = pytest.mark.workers

WRITERS = 3
ROUNDS = 4


def test_verify_beside_a_server_under_writes_finds_nothing(tmp_path: Path) -> None:
    """Three clients append to their own sessions without pause while `admin verify` runs four
    times: each run exits 0, and every acknowledged append reads back."""
    data, address = tmp_path / "data", f"127.0.0.1:{free_port()}"
    acked = dict.fromkeys((f"w{i}" for i in range(WRITERS)), 0)
    stop = threading.Event()

    def write(name: str) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            while not stop.is_set():
                append(stub, name, say(f"{name} {acked[name]}"))
                acked[name] += 1

    with ServerProcess(["--data", str(data), "--listen", address], tmp_path) as server:
        server.wait_serving(address)
        writers = [threading.Thread(target=write, args=(name,)) for name in acked]
        for writer in writers:
            writer.start()
        try:
            runs = [
                run_cli(["admin", "verify", "--data", str(data)], tmp_path) for _ in range(ROUNDS)
            ]
        finally:
            stop.set()
            for writer in writers:
                writer.join()
        for run in runs:
            assert run.returncode == 0, run.stdout + run.stderr
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for name, count in acked.items():
                assert len(log(stub, name)) == count, name
        server.stop()
    assert min(acked.values()) > 0
