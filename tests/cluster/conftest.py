"""Fixtures of the cluster tests: a real etcd in the test's temp folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdProcess


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A single-member etcd on free 127.0.0.1 ports, stopped by PID at the end."""
    with EtcdProcess(tmp_path / "etcd") as server:
        yield server
