"""Fixtures shared by every test layer, and the mode the e2e servers run in.

``--workers N`` (or SESSIONLOG_TEST_WORKERS=N; the option wins) with N of 2 or more runs every
server the e2e tests start as `sessionlog serve --workers N` processes (see
``tests.e2e._proc``), and deselects the tests marked ``in_process``, which reach inside a server
running in the test's own process.

`make test-workers` runs only the e2e tests marked ``workers`` in that mode (a module's
``pytestmark = pytest.mark.workers``, or a test's mark), and `make test` runs every test in the
default one. The rule for the mark: a test is marked when what it checks crosses worker
processes: the core semantics and leases (test_rpcs, test_lease), the wakeups of follow,
FollowSessions and the change feed (a commit on one worker, its reader on another), what each
worker must apply of the server's settings (tokens on every RPC, TLS), metrics summed over
workers, the log, signals and crashes of a server of several processes. A test whose checks run
the same code inside whichever worker takes the call is not marked: it runs once, in the default
pass. Modules that start their own ``--workers N`` servers in either mode (test_workers.py,
test_workers_faults.py, test_metrics_workers.py) are not marked either: a second pass would
repeat them exactly. A marked module that shares one server between its tests gives each test
its own session ids (the ``sid`` fixture): a server start costs seconds in workers mode.

`make test` runs each pass in two phases: the tests not marked ``serial`` in several test
processes (pytest-xdist, ``--dist loadgroup``), then the ``serial`` ones in one process with
nothing else running. The rule for that mark: a test is ``serial`` when a busy machine can fail
it although the code is right: it asserts an elapsed time against a budget of a few seconds (a
call that must fail "at once", a shutdown within its grace), counts heartbeats or responses per
interval, or measures latency or throughput. A test that waits for an event polls with a
generous deadline instead (60 s for an election, tests/cluster/_group.py) and is not marked.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessionlog.storage.store import Store
from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import running_server, workers_under_test

pytest_plugins = ["tests._groups"]

_DESELECTED = pytest.StashKey[list[str]]()
_TESTS = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--workers",
        metavar="N",
        help="run the e2e tests' servers as `sessionlog serve --workers N` processes (N >= 2) "
        "and deselect the in_process tests; 1 runs them in this process "
        "[env SESSIONLOG_TEST_WORKERS; default 1]",
    )


def pytest_configure(config: pytest.Config) -> None:
    workers = config.getoption("--workers")
    if workers is not None:
        os.environ["SESSIONLOG_TEST_WORKERS"] = workers
    try:
        workers_under_test()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> str:
    workers = workers_under_test()
    if workers == 1:
        return "sessionlog servers: in this process (--workers 1)"
    return f"sessionlog servers: `sessionlog serve --workers {workers}` processes"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In workers mode, deselect the tests that need the in-process server (which test process
    runs which tests: tests/_groups.py)."""
    if workers_under_test() == 1:
        return
    deselected = [item for item in items if item.get_closest_marker("in_process")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("in_process")]
    config.stash[_DESELECTED] = [item.nodeid for item in deselected]


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    deselected = config.stash.get(_DESELECTED, [])
    if deselected:
        files = sorted({nodeid.split("::", 1)[0] for nodeid in deselected})
        terminalreporter.write_line(
            f"{len(deselected)} in_process tests deselected (they reach inside an in-process "
            f"server, which --workers {workers_under_test()} does not run): {', '.join(files)}"
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A real LMDB store in a temporary folder."""
    opened = Store(tmp_path / "data")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    """A real server on 127.0.0.1, a free port, over LMDB in a temporary folder: in this
    process, or `sessionlog serve --workers N` processes in workers mode."""
    with running_server(tmp_path / "data") as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.SessionLogServiceStub:
    """A SessionLogService client of the ``server`` fixture."""
    return server.stub()


@pytest.fixture
def sid() -> Callable[[str], str]:
    """This test's id for its session ``name`` (``t7.s``), for a module whose tests share one
    server (a server start costs seconds in workers mode): no other test has the same ids."""
    prefix = f"t{next(_TESTS)}."
    return lambda name: prefix + name
