"""Which test process runs which tests (a plugin of tests/conftest.py: ``pytest_plugins``).

`make test` runs pytest-xdist with ``--dist loadgroup``: the tests of one ``xdist_group`` run in
one test process, one after another. Each module is a group of its own (its module-scoped server
starts once, not once per process) unless it names one. This module imports nothing of the
project, so tests/unit/test_test_groups.py can load it into a small suite of its own quickly.
"""

from __future__ import annotations

import pytest

NODE_GROUP = "node-client"
"""The xdist group of the modules that run Node out of client/typescript: one test process runs
them all, one after another (`npm pack` copies protos into that folder while a suite reads it).
A module that uses the ``node_modules`` fixture is in it; one that runs Node otherwise says so
(``pytestmark = pytest.mark.xdist_group("node-client")``)."""


# First: pytest-xdist's own hook reads the groups to name the tests it schedules; a group added
# after it is never seen (the rule grouped nothing while this hook ran last).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put each test without a group of its own in its module's group (or the Node one)."""
    node_modules = {
        item.path for item in items if "node_modules" in getattr(item, "fixturenames", ())
    }
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.nodeid.split("::", 1)[0]
            item.add_marker(
                pytest.mark.xdist_group(NODE_GROUP if item.path in node_modules else module)
            )
