"""The supervisor of `serve --workers N` when it cannot make a worker's process at all."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from sessionlog.config import ServerConfig
from sessionlog.storage import folder
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
