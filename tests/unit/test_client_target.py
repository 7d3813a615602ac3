"""A client refuses a target without a port: gRPC would dial port 443 of a bare host, where no
sessionlog server listens, and the caller would only see a connection failure (issue 31)."""

from __future__ import annotations

import asyncio

import pytest

from sessionlog_client import AsyncClient, Client
from sessionlog_client._routing import check_address


@pytest.mark.parametrize(
    "target", ["127.0.0.1", "localhost", "[::1]", "127.0.0.1:", "127.0.0.1:http", "h:0", "h:70000"]
)
def test_client_refuses_a_target_without_a_port(target: str) -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT, e\.g\. 127\.0\.0\.1:50051") as refused:
        Client(target)
    assert repr(target) in str(refused.value)
    with pytest.raises(ValueError, match="port 443"):
        Client(["127.0.0.1:50051", target])


def test_async_client_refuses_a_target_without_a_port() -> None:
    async def build() -> None:
        AsyncClient("127.0.0.1")

    with pytest.raises(ValueError, match="HOST:PORT"):
        asyncio.run(build())


@pytest.mark.parametrize(
    "target",
    [
        "127.0.0.1:50051",
        "localhost:1",
        "[::1]:50051",
        "sessionlog.internal:443",
        "dns:///localhost:50051",
        "unix:/tmp/sessionlog.sock",
        "ipv4:127.0.0.1:50051",
    ],
)
def test_targets_with_a_port_or_a_scheme_are_kept(target: str) -> None:
    assert check_address(target) == target
    Client(target).close()
