"""A worker process of ``sessionlog serve --workers N``; the supervisor starts it, never a person.

    python -m sessionlog.workers.worker      (its WorkerSpec arrives pickled on stdin)

It runs today's ``SessionLogServer`` with ``Peers``: the folder lock and the doorbells inherited
from the supervisor, the ports shared. It dies with its supervisor (PR_SET_PDEATHSIG), so a
killed supervisor never leaves workers holding the folder.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
from pathlib import Path

from sessionlog import logs
from sessionlog.server import serve
from sessionlog.service.doorbell import Peers
from sessionlog.service.shared_counts import SharedCounts
from sessionlog.startup import run_event_loop, start_failure
from sessionlog.storage.folder import FolderLock
from sessionlog.workers.spec import WorkerSpec

PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """Be killed when the supervisor goes without stopping its workers (a SIGKILL, a crash):
    the server then ends at once, as one process would, and gives up the folder; exit now if
    the supervisor has already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(1)


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
        os.close(fd)
    except OSError:
        pass


def main() -> int:
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _die_with(spec.supervisor_pid)
    logs.configure(spec.log_level, spec.log_format, fields={"worker": spec.slot})
    config = spec.config
    peers = Peers(
        slot=spec.slot,
        count=spec.count,
        bells=spec.bells,
        lock=FolderLock(Path(config.data_dir), spec.lock_fd),
        counts=SharedCounts(spec.counts_fd, spec.count, spec.slot),
    )
    try:
        run_event_loop(serve(config, peers, on_started=lambda: _say(spec.ready_fd, "ready")))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = start_failure(exc, config.data_dir)
        if message is None:
            raise
        _say(spec.ready_fd, message)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
