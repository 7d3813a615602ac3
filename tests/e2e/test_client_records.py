"""The Python clients' session records: create with labels and a parent, update_session (the
mask names exactly the arguments given), list_sessions with filter and order_by, children."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, Client, errors
from tests.e2e._proc import running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("client-records") / "data") as running:
        yield running


def listed(client: Client, **options: object) -> list[str]:
    pages = client.list_sessions(page_size=2, **options)  # type: ignore[arg-type]
    return [s.session_id for page in pages for s in page.sessions]


def test_sync_client_records(server: RunningServer) -> None:
    """Create with fields, update single labels and a status, filter, order, children."""
    with Client(server.address) as client:
        client.create_session("py.a", title="A", labels={"team": "core"}, owner="ana")
        client.create_session("py.b", labels={"team": "web"})
        client.append("py.a", [{"type": "tool_call", "data": {"name": "spawn"}}])
        kid = client.create_session("py.kid", parent_session_id="py.a", parent_seq=0).session
        assert (kid.parent_session_id, kid.parent_seq) == ("py.a", 0)
        updated = client.update_session(
            "py.b", status="done", set_labels={"env": "prod"}, remove_labels=["team"]
        )
        assert (updated.status, dict(updated.labels)) == ("done", {"env": "prod"})
        again = client.update_session("py.a", title="A2")
        assert (again.title, again.owner, dict(again.labels)) == ("A2", "ana", {"team": "core"})
        assert listed(client, prefix="py.", filter='labels.team = "core"') == ["py.a"]
        assert listed(client, prefix="py.", filter="status = done") == ["py.b"]
        assert listed(client, prefix="py.", order_by="update_time desc") == [
            "py.a",
            "py.b",
            "py.kid",
        ]
        assert [s.session_id for s in client.children("py.a")] == ["py.kid"]
        with pytest.raises(errors.SessionNotFound):
            client.update_session("py.none", title="x")
        with pytest.raises(errors.InvalidFilter):
            listed(client, filter="nonsense")
        with pytest.raises(errors.MalformedRequest, match="at least one field"):
            client.update_session("py.a")


def test_async_client_records(server: RunningServer) -> None:
    """The same calls on AsyncClient."""

    async def run() -> None:
        async with AsyncClient(server.address) as client:
            await client.create_session("apy.p", labels={"k": "v"})
            await client.create_session("apy.c", parent_session_id="apy.p", title="child")
            updated = await client.update_session("apy.p", labels={"k": "w"}, owner="bo")
            assert (dict(updated.labels), updated.owner) == ({"k": "w"}, "bo")
            pages = client.list_sessions(prefix="apy.", filter="labels.k = w")
            assert [s.session_id async for page in pages for s in page.sessions] == ["apy.p"]
            ordered = client.list_sessions(prefix="apy.", order_by="update_time desc")
            names = [s.session_id async for page in ordered for s in page.sessions]
            assert names == ["apy.p", "apy.c"]
            assert [s.title for s in await client.children("apy.p")] == ["child"]

    asyncio.run(run())
