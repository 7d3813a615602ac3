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


@pytest.mark.parametrize(
    "target", ["dns:///127.0.0.1", "dns:127.0.0.1", "dns://127.0.0.1/localhost"]
)
def test_a_dns_target_without_a_port_is_refused(target: str) -> None:
    """gRPC would dial port 443 of the name after dns: too."""
    with pytest.raises(ValueError, match="port 443"):
        Client(target)


@pytest.mark.parametrize("target", ["http://127.0.0.1:50051", "https://h:443", "grpc://h:1"])
def test_a_url_is_refused(target: str) -> None:
    """A URL is not a gRPC target: it would fail later as a misformatted domain name."""
    with pytest.raises(ValueError, match="a URL is not a gRPC target"):
        Client(target)


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
        "dns:localhost:50051",
        "dns://127.0.0.1/localhost:50051",
        "unix:/tmp/sessionlog.sock",
        "ipv4:127.0.0.1:50051",
    ],
)
def test_targets_with_a_port_or_a_scheme_are_kept(target: str) -> None:
    assert check_address(target) == target
    Client(target).close()
