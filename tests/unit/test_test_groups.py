"""The suite's own scheduling. `make test` runs pytest-xdist with ``--dist loadgroup``, and
tests/_groups.py (a plugin of tests/conftest.py) puts each module's tests in one test process:
a module-scoped server starts once, not once per process, and the Node suites
(``xdist_group("node-client")``) run one after another. pytest 9.2 renamed the attribute
pytest-xdist 3.8 writes a test's group into, and the groups stopped without a word (every test
scheduled alone); a conftest hook that ran after pytest-xdist's never grouped at all. These
tests load that plugin into a small suite and fail when a group is split."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS_PER_MODULE = 8
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist"]
QUICK = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
"""The small suite loads pytest-xdist and nothing else installed (hypothesis and langsmith's
plugins cost a second or more per process)."""

MODULE = """
import os
from pathlib import Path

{mark}

import pytest


@pytest.mark.parametrize("n", range({count}))
def test_note_the_process(n: int) -> None:
    with (Path(__file__).parent / "{name}.ran").open("a") as ran:
        ran.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def _processes_per_module(tmp_path: Path, dist: str) -> dict[str, set[str]]:
    """Run a suite of three modules (two grouped by their module, by the conftest's rule, and
    one with a group mark of its own) in two test processes; which processes ran each module."""
    suite = tmp_path / dist
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "conftest.py").write_text('pytest_plugins = ["tests._groups"]\n')
    marks = {"a": "", "b": "", "c": 'pytestmark = __import__("pytest").mark.xdist_group("own")'}
    for name, mark in marks.items():
        module = MODULE.format(mark=mark, count=TESTS_PER_MODULE, name=name)
        (suite / f"test_{name}.py").write_text(module)
    ini = suite / "pytest.ini"
    subprocess.run(
        [*PYTEST, "-n", "2", "--dist", dist, "--rootdir", str(suite), "-c", str(ini), str(suite)],
        cwd=REPO,
        env=QUICK,
        check=True,
        capture_output=True,
        timeout=120,
    )
    ran = {name: (suite / f"{name}.ran").read_text().split() for name in marks}
    assert all(len(processes) == TESTS_PER_MODULE for processes in ran.values())
    return {name: set(processes) for name, processes in ran.items()}


def test_loadgroup_keeps_each_module_in_one_test_process(tmp_path: Path) -> None:
    grouped = _processes_per_module(tmp_path, "loadgroup")
    assert all(len(processes) == 1 for processes in grouped.values()), grouped


def test_without_groups_the_same_suite_is_spread_over_both_processes(tmp_path: Path) -> None:
    """The control: the suite above does reach both processes when nothing groups it, so the
    test before this one could see a split group."""
    spread = _processes_per_module(tmp_path, "load")
    assert Counter(len(processes) for processes in spread.values())[2] >= 1, spread
