"""Fixtures shared by every test layer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog.storage.store import Store
from sessionlog.testing import ThreadedServer, running_server
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A real LMDB store in a temporary folder."""
    opened = Store(tmp_path / "data")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadedServer]:
    """A real server on 127.0.0.1, a free port, over LMDB in a temporary folder."""
    with running_server(tmp_path / "data") as running:
        yield running


@pytest.fixture
def stub(server: ThreadedServer) -> pb_grpc.SessionLogServiceStub:
    """A SessionLogService client of the ``server`` fixture."""
    return server.stub()
