"""The supervisor of `serve --workers N`: its hold on the ports, and a worker that cannot be made.

Sockets on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from sessionlog.config import ServerConfig
from sessionlog.storage import folder
from sessionlog.workers import ports
from sessionlog.workers.supervisor import Supervisor, WorkersFailed


def test_a_worker_process_that_cannot_be_made_fails_the_start_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No interpreter where the workers' should be (exec fails, as a fork refused for want of
    memory or processes would): the start fails with WorkersFailed naming the worker and the
    OS error (not an OSError the CLI reads as "cannot open the data folder"), the supervisor
    leaves no descriptor open (the ready pipe was leaked), and the data folder is free."""
    data = tmp_path / "d"
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    config = ServerConfig(data_dir=str(data), listen="127.0.0.1:0", workers=2)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(WorkersFailed, match=r"^worker [01] could not start: .*no-such-python"):
        asyncio.run(Supervisor(config).run())
    assert sorted(os.listdir("/proc/self/fd")) == before
    folder.acquire(data).release()


def test_a_held_port_refuses_another_server_while_no_worker_listens() -> None:
    """Ports reserved and no worker listening (all restarting): another server's reservation
    of the same address is refused, though nothing listens there; a worker still joins."""
    (held,) = ports.reserve([("127.0.0.1:0", "--listen")])
    try:
        with pytest.raises(ports.PortInUse, match=rf"cannot listen on 127.0.0.1:{held.port}"):
            ports.reserve([(held.address, "--listen")])
        worker = socket.create_server(("127.0.0.1", held.port), reuse_port=True)
        worker.close()
    finally:
        held.close()


def test_a_port_in_time_wait_from_a_lone_server_can_be_reserved() -> None:
    """A connection a server without SO_REUSEPORT accepted and closed first (in TIME_WAIT on
    its port, as after `--workers 1` stops): the port can still be reserved, as a lone server
    could bind it."""
    with socket.create_server(("127.0.0.1", 0)) as lone:
        port = lone.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = lone.accept()
        accepted.close()  # the server side closes first: its end waits in TIME_WAIT
        time.sleep(0.05)
        client.close()
    (held,) = ports.reserve([(f"127.0.0.1:{port}", "--listen")])
    held.close()
