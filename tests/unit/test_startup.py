"""startup.start_failure: the one line a server that could not start prints, for every error of
the process model (``workers/``), which startup names through their base class, CannotStart."""

from __future__ import annotations

from sessionlog.startup import CannotStart, start_failure
from sessionlog.workers.ports import PortInUse
from sessionlog.workers.supervisor import WorkersFailed


def test_the_process_models_errors_are_their_one_line() -> None:
    """A port in use and a worker that failed say why in their message; a bug says nothing."""
    assert issubclass(PortInUse, CannotStart)
    assert issubclass(WorkersFailed, CannotStart)
    line = "cannot listen on 127.0.0.1:1 (--listen): in use"
    assert start_failure(PortInUse(line), "data") == line
    failed = "worker 1 could not start: no-such-python"
    assert start_failure(WorkersFailed(failed), "data") == failed
    assert start_failure(RuntimeError("a bug"), "data") is None
