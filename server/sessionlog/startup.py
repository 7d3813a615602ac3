"""Starting a server process: its event loop, and the one line that says why it could not start.

Shared by ``sessionlog serve`` (``cli``), the worker processes of ``--workers``
(``workers.worker``) and the benchmark's echo server, without the client commands' imports.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

import lmdb

from sessionlog import errors
from sessionlog.config import ConfigError
from sessionlog.storage.folder import FolderDamaged, FolderInUse, FolderUnwritable
from sessionlog.storage.integrity import DamagedStore

__all__ = ["CannotStart", "run_event_loop", "start_failure"]


class CannotStart(RuntimeError):
    """A server could not start, for a reason its message gives in one line (a port in use, a
    worker that failed): the process model's errors (``workers``) derive from it, so this
    module, below them, names them all without importing them."""


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the server on uvloop where it is installed (a faster event loop), else asyncio's.
    (The benchmark's echo ceiling runs on this too, so both stand on the same stack.)

    The writer thread and the event loop share the GIL; a short switch interval hands it over
    sooner after a commit, which is what a follower's latency waits on.
    """
    sys.setswitchinterval(0.0005)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def start_failure(exc: BaseException, data_dir: str) -> str | None:
    """The one line that says why a server could not start, for the errors that say it; None
    for anything else (a bug: its traceback is the report)."""
    from sessionlog.server import BindError

    if isinstance(
        exc,
        BindError
        | ConfigError
        | FolderInUse
        | FolderDamaged
        | FolderUnwritable
        | DamagedStore
        | CannotStart,
    ):
        return str(exc)
    if isinstance(exc, errors.DataCorrupted):
        return f"cannot start on {data_dir!r}: {exc}"
    if isinstance(exc, lmdb.Error | OSError):
        return f"cannot open the data folder {data_dir!r}: {exc}"
    return None
