"""AdminService.ListLeaseAudit end to end: every session's takeovers and forced releases, paged
in session id order, narrowed by a prefix, refused to non-admin and prefix-limited tokens; a
forged or foreign page token is INVALID_PAGE_TOKEN; the Python clients and `admin lease-audit`.

One server for the module, with auth on; the module's sessions are written once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog.listing import encode_page_token
from sessionlog.testing import RunningServer, error_info
from sessionlog_client import AsyncClient, Client
from sessionlog_client.errors import PermissionDenied, Unauthenticated
from sessionlog_client.v1 import admin_service_pb2 as apb
from sessionlog_client.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog_client.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import run_cli_here, running_server

ADMIN = "audit-admin-secret-3b9e7c21"
WRITER = "audit-writer-secret-8f0d4a6e"
TENANT_ADMIN = "audit-tenant-admin-secret-51ac"
TAKEOVER = pb.LEASE_AUDIT_KIND_TAKEOVER
FORCED = pb.LEASE_AUDIT_KIND_FORCED_RELEASE

EXPECTED = [
    ("a.one", 0, TAKEOVER, "new", "old"),
    ("a.one", 1, FORCED, "ops", "new"),
    ("a.two", 0, FORCED, "ops", "w2"),
    ("ab", 0, TAKEOVER, "second", "first"),
    ("b.three", 0, TAKEOVER, "y", "x"),
    ("b.three", 1, TAKEOVER, "z", "y"),
]
"""Every audit entry the module writes, in the order ListLeaseAudit must give them (ids in
UTF-8 byte order: "a.one" < "a.two" < "ab" < "b.three")."""


def tokens_file(path: Path) -> Path:
    path.write_text(
        f"""
[[token]]
name = "admin"
token = "{ADMIN}"
permissions = ["admin"]

[[token]]
name = "writer"
token = "{WRITER}"
permissions = ["read", "write"]

[[token]]
name = "tenant-admin"
token = "{TENANT_ADMIN}"
permissions = ["admin"]
session_prefix = "a."
"""
    )
    return path


def take_over(client: Client, session_id: str, old: str, new: str) -> None:
    """``old`` takes a lease that expires at once; ``new`` then takes it over (audited)."""
    client.acquire_lease(session_id, old, ttl=0.001)
    time.sleep(0.01)
    client.acquire_lease(session_id, new, ttl=60)


def force_release(client: Client, session_id: str, holder: str) -> None:
    client.acquire_lease(session_id, holder, ttl=60)
    client.release_lease(session_id, "ops", force=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("lease-audit")
    tokens = tokens_file(folder / "tokens.toml")
    with running_server(folder / "data", auth_tokens=str(tokens)) as running:
        with Client(running.address, token=ADMIN) as client:
            take_over(client, "b.three", "x", "y")
            client.release_lease("b.three", "y")  # a plain release: not audited
            take_over(client, "b.three", "y", "z")
            take_over(client, "a.one", "old", "new")
            client.release_lease("a.one", "ops", force=True)
            force_release(client, "a.two", "w2")
            take_over(client, "ab", "first", "second")
            client.acquire_lease("a.quiet", "w", ttl=60)  # held and released: no audit
            client.release_lease("a.quiet", "w")
            client.append("a.one", [{"type": "user_message", "data": {"content": "hi"}}])
        yield running


def admin_stub(server: RunningServer) -> apb_grpc.AdminServiceStub:
    return apb_grpc.AdminServiceStub(server.channel())  # type: ignore[no-untyped-call]


def call(
    server: RunningServer, request: apb.ListLeaseAuditRequest, token: str | None = ADMIN
) -> apb.ListLeaseAuditResponse:
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    reply: apb.ListLeaseAuditResponse = admin_stub(server).ListLeaseAudit(
        request, metadata=metadata, timeout=10
    )
    return reply


Row = tuple[str, int, int, str, str]


def summary(entries: list[apb.SessionLeaseAuditEntry]) -> list[Row]:
    return [
        (e.session_id, e.index, e.entry.kind, e.entry.actor, e.entry.previous_holder)
        for e in entries
    ]


def all_pages(server: RunningServer, prefix: str = "", page_size: int = 0) -> list[list[Row]]:
    pages: list[list[Row]] = []
    token = ""
    for _ in range(100):
        request = apb.ListLeaseAuditRequest(prefix=prefix, page_size=page_size, page_token=token)
        reply = call(server, request)
        pages.append(summary(list(reply.entries)))
        token = reply.next_page_token
        if not token:
            return pages
    raise AssertionError("ListLeaseAudit did not stop paging")


def test_one_page_holds_every_sessions_audit_in_order(server: RunningServer) -> None:
    """Without paging arguments: every takeover and forced release of every session, in session
    id order, each session's in recorded order, with times; plain releases are not listed."""
    reply = call(server, apb.ListLeaseAuditRequest())
    assert summary(list(reply.entries)) == EXPECTED
    assert reply.next_page_token == ""
    assert all(e.entry.HasField("time") for e in reply.entries)
    with Client(server.address, token=ADMIN) as client:
        for session_id in ("a.one", "b.three"):
            described = client.get_session(session_id).lease_audit
            listed = [e.entry for e in reply.entries if e.session_id == session_id]
            assert listed == list(described), session_id


@pytest.mark.parametrize("page_size", [1, 2, 4, 5])
def test_pages_of_any_size_add_up_to_the_whole_audit(server: RunningServer, page_size: int) -> None:
    """Each page holds at most page_size entries; the pages in order are the whole audit, with no
    entry twice, and the last page has no next token."""
    pages = all_pages(server, page_size=page_size)
    assert all(len(page) <= page_size for page in pages)
    assert [entry for page in pages for entry in page] == EXPECTED
    assert len(pages) == -(-len(EXPECTED) // page_size)


def test_a_prefix_narrows_the_audit_byte_for_byte(server: RunningServer) -> None:
    """prefix "a." lists a.one and a.two (not "ab"); "a" lists "ab" too; an unknown prefix lists
    nothing."""
    assert [e for page in all_pages(server, "a.", page_size=2) for e in page] == EXPECTED[:3]
    assert [e for page in all_pages(server, "a") for e in page] == EXPECTED[:4]
    assert all_pages(server, "b.three") == [EXPECTED[4:]]
    assert all_pages(server, "zz") == [[]]


def test_a_token_continues_after_entries_recorded_meanwhile(tmp_path: Path) -> None:
    """An entry recorded after a page was handed out, past that page's end, is on a later page;
    none is repeated (a server of its own, auth off)."""
    with running_server(tmp_path / "data") as fresh, Client(fresh.address) as client:
        assert summary(list(call(fresh, apb.ListLeaseAuditRequest(), None).entries)) == []
        take_over(client, "c.late", "p", "q")
        take_over(client, "c.late", "q", "r")
        head = call(fresh, apb.ListLeaseAuditRequest(page_size=1), None)
        assert summary(list(head.entries)) == [("c.late", 0, TAKEOVER, "q", "p")]
        take_over(client, "c.later", "s", "t")
        force_release(client, "c.early", "e")  # sorts before the token: not on later pages
        request = apb.ListLeaseAuditRequest(page_size=5, page_token=head.next_page_token)
        rest = call(fresh, request, None)
        assert summary(list(rest.entries)) == [
            ("c.late", 1, TAKEOVER, "r", "q"),
            ("c.later", 0, TAKEOVER, "t", "s"),
        ]
        assert rest.next_page_token == ""


def test_a_bad_page_token_is_invalid_page_token(server: RunningServer) -> None:
    """A token that is not base64, one forged from nothing, one made for another prefix, and a
    ListSessions token are INVALID_ARGUMENT / INVALID_PAGE_TOKEN naming page_token."""
    token = call(server, apb.ListLeaseAuditRequest(page_size=1)).next_page_token
    assert token
    session_token = encode_page_token("a.one", "")  # what ListSessions hands out
    bad = [
        apb.ListLeaseAuditRequest(page_token="not a token!"),
        apb.ListLeaseAuditRequest(page_token="AAAA"),
        apb.ListLeaseAuditRequest(page_token="x" * 5000),
        apb.ListLeaseAuditRequest(page_token=token, prefix="b."),
        apb.ListLeaseAuditRequest(page_token=session_token),
    ]
    for request in bad:
        with pytest.raises(grpc.RpcError) as caught:
            call(server, request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        info = error_info(caught.value)
        assert (info.domain, info.reason) == ("sessionlog", "INVALID_PAGE_TOKEN"), request
        assert info.metadata["field"] == "page_token"
        assert "ListLeaseAudit" in (caught.value.details() or "")


@pytest.mark.parametrize(
    ("token", "code"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        (WRITER, grpc.StatusCode.PERMISSION_DENIED),
        (TENANT_ADMIN, grpc.StatusCode.PERMISSION_DENIED),
    ],
    ids=["no-token", "writer", "prefix-limited-admin"],
)
def test_only_an_unscoped_admin_may_list(
    server: RunningServer, token: str | None, code: grpc.StatusCode
) -> None:
    """No token is UNAUTHENTICATED; a writer, and an admin limited to a prefix (even asking for
    its own prefix), are PERMISSION_DENIED."""
    for prefix in ("", "a."):
        with pytest.raises(grpc.RpcError) as caught:
            call(server, apb.ListLeaseAuditRequest(prefix=prefix), token)
        assert caught.value.code() == code
        assert error_info(caught.value).reason == code.name


def test_the_python_clients_walk_every_page(server: RunningServer) -> None:
    """Client.list_lease_audit and AsyncClient.list_lease_audit yield every page; a non-admin
    client gets PermissionDenied, one without a token Unauthenticated."""
    with Client(server.address, token=ADMIN) as client:
        pages = list(client.list_lease_audit(prefix="b.", page_size=1))
        assert [summary(list(p.entries)) for p in pages] == [[EXPECTED[4]], [EXPECTED[5]]]
    with Client(server.address, token=WRITER) as client, pytest.raises(PermissionDenied):
        list(client.list_lease_audit())
    with Client(server.address) as client, pytest.raises(Unauthenticated):
        list(client.list_lease_audit())

    async def walk() -> list[Row]:
        async with AsyncClient(server.address, token=ADMIN) as client:
            return [
                entry
                async for page in client.list_lease_audit(prefix="a", page_size=3)
                for entry in summary(list(page.entries))
            ]

    assert asyncio.run(walk()) == EXPECTED[:4]


def test_cli_lease_audit_prints_every_entry(server: RunningServer) -> None:
    """`admin lease-audit --json` prints one object per entry (every page); the text form one
    line each; --prefix narrows it; without an admin token it fails with exit 1."""
    base = ["admin", "lease-audit", "--server", server.address, "--token", ADMIN]
    done = run_cli_here([*base, "--json", "--page-size", "2", "--prefix", "a"])
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["session_id"], x["index"], x["actor"]) for x in lines] == [
        (s, i, actor) for s, i, _, actor, _ in EXPECTED[:4]
    ]
    assert [x["kind"] for x in lines] == [
        "takeover",
        "forced_release",
        "forced_release",
        "takeover",
    ]
    assert lines[0]["previous_holder"] == "old"
    text = run_cli_here([*base, "--prefix", "b."])
    assert text.returncode == 0, text.stderr
    rows = text.stdout.splitlines()
    assert len(rows) == 2
    assert rows[0].startswith("b.three\t#0\ttakeover\t")
    assert rows[1].startswith("b.three\t#1\ttakeover\t")
    assert "\tz from y (token " in rows[1]
    refused = run_cli_here(["admin", "lease-audit", "--server", server.address, "--token", WRITER])
    assert refused.returncode == 1
    assert "PERMISSION_DENIED" in refused.stderr
