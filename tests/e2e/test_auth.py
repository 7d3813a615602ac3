"""Bearer-token auth: who may call what, tenants kept to their session prefix, secrets unlogged.

One tokens file is shared by the tests: a reader, a writer, an admin, a tenant worker limited to
``tenant-a.`` whose secret is configured only as its SHA-256, and a tenant admin limited to the
same prefix. Every refusal is checked for its gRPC code, its ErrorInfo reason, and that the data
is unchanged (read back with the admin token).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import result, user
from tests.e2e._proc import (
    GRPCURL,
    ServerProcess,
    free_port,
    run_cli,
    run_cli_here,
    running_server,
)

READER = "reader-secret-6c1f0e9b2d4a"
WRITER = "writer-secret-93ad51e07b8c"
ADMIN = "admin-secret-0f4b7e2c9a61"
TENANT_A = "tenant-a-secret-5e8d2b7f14c3"
TENANT_ADMIN = "tenant-admin-secret-a7c0d93e"
WRONG = "wrong-secret-b1e4c8f02d7a"

SERVICE = "/sessionlog.v1.SessionLogService/"
FEED = "/sessionlog.v1.ReplicationService/"
ADMIN_SERVICE = "/sessionlog.v1.AdminService/"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
TIMEOUT = 5.0

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


def tokens_file(path: Path) -> Path:
    """The shared tokens file; tenant-a's secret appears only as its SHA-256."""
    tenant_digest = hashlib.sha256(TENANT_A.encode()).hexdigest()
    path.write_text(
        f"""
[[token]]
name = "reader"
token = "{READER}"
permissions = ["read"]

[[token]]
name = "writer"
token = "{WRITER}"
permissions = ["read", "write"]

[[token]]
name = "admin"
token = "{ADMIN}"
permissions = ["admin"]

[[token]]
name = "tenant-a-worker"
sha256 = "{tenant_digest}"
permissions = ["read", "write"]
session_prefix = "tenant-a."

[[token]]
name = "tenant-a-admin"
token = "{TENANT_ADMIN}"
permissions = ["admin"]
session_prefix = "tenant-a."
"""
    )
    return path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    """A server with auth on and health/reflection closed (the default)."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as running:
        yield running


# -- raw calls with a chosen token ----------------------------------------------------------------


def bearer(secret: str | None) -> tuple[tuple[str, str], ...] | None:
    return None if secret is None else (("authorization", f"Bearer {secret}"),)


def unary(channel: grpc.Channel, method: str, request: Message, token: str | None) -> bytes:
    """Call a unary method with raw bytes in and out (no stub needed for any service)."""
    call = channel.unary_unary(method)
    reply: bytes = call(request.SerializeToString(), metadata=bearer(token), timeout=TIMEOUT)
    return reply


def stream(channel: grpc.Channel, method: str, request: Message, token: str | None) -> list[bytes]:
    """Call a server-streaming method (without follow) and collect its raw responses."""
    call = channel.unary_stream(method)
    return list(call(request.SerializeToString(), metadata=bearer(token), timeout=TIMEOUT))


def appended(
    channel: grpc.Channel, method: str, request: Message, token: str | None
) -> pb.AppendResponse:
    """One append over AppendStream (``method``); its error (the stream's, or the request's
    own, which leaves the stream open) raised as an RpcError."""
    assert isinstance(request, pb.AppendRequest)
    call = channel.stream_stream(method)
    sent = pb.AppendStreamRequest(correlation_id=7, append=request).SerializeToString()
    (reply,) = call(iter([sent]), metadata=bearer(token), timeout=TIMEOUT)
    answer = pb.AppendStreamResponse.FromString(reply)
    assert answer.correlation_id == 7
    return result(answer)


def refusal(
    channel: grpc.Channel, method: str, request: Message, token: str | None, streaming: bool
) -> grpc.RpcError:
    """The error a call gets; fails the test if the call succeeds."""
    call = appended if method == SERVICE + "AppendStream" else stream if streaming else unary
    with pytest.raises(grpc.RpcError) as caught:
        call(channel, method, request, token)
    return caught.value


def assert_refused(error: grpc.RpcError, code: grpc.StatusCode) -> None:
    """The status code, and one ErrorInfo with the code's name as its reason."""
    assert error.code() == code, error
    info = error_info(error)
    assert info.domain == "sessionlog"
    assert info.reason == code.name
    assert error.details(), "the refusal explains itself"


def append(channel: grpc.Channel, session_id: str, token: str, *contents: str) -> pb.AppendResponse:
    request = pb.AppendRequest(session_id=session_id, events=[user(c) for c in contents])
    return pb.AppendResponse.FromString(unary(channel, SERVICE + "Append", request, token))


def session(channel: grpc.Channel, session_id: str) -> pb.Session:
    """The session as the admin sees it."""
    raw = unary(channel, SERVICE + "GetSession", pb.GetSessionRequest(session_id=session_id), ADMIN)
    return pb.GetSessionResponse.FromString(raw).session


def listed(channel: grpc.Channel, token: str, prefix: str = "", page_size: int = 0) -> list[str]:
    """Every session id ListSessions returns to ``token`` for ``prefix``, following pages."""
    ids: list[str] = []
    page_token = ""
    for _ in range(100):
        request = pb.ListSessionsRequest(prefix=prefix, page_size=page_size, page_token=page_token)
        reply = pb.ListSessionsResponse.FromString(
            unary(channel, SERVICE + "ListSessions", request, token)
        )
        ids += [s.session_id for s in reply.sessions]
        page_token = reply.next_page_token
        if not page_token:
            return ids
    raise AssertionError("ListSessions did not stop paging")


def every_rpc(session_id: str) -> list[tuple[str, Message, bool]]:
    """One valid request for every RPC the server offers: (method, request, server-streaming)."""
    message = message_pb2.Message(role=message_pb2.ROLE_USER, content="hi")
    return [
        (SERVICE + "Append", pb.AppendRequest(session_id=session_id, events=[user("x")]), False),
        (
            # One request on the stream (``appended``): its own refusal, or the stream's.
            SERVICE + "AppendStream",
            pb.AppendRequest(session_id=session_id, events=[user("y")]),
            False,
        ),
        (SERVICE + "Since", pb.SinceRequest(session_id=session_id), True),
        (SERVICE + "ListEvents", pb.ListEventsRequest(session_id=session_id), False),
        (SERVICE + "Surface", pb.SurfaceRequest(session_id=session_id), False),
        (SERVICE + "DeriveMessages", pb.DeriveMessagesRequest(session_id=session_id), False),
        (SERVICE + "GetState", pb.GetStateRequest(session_id=session_id), False),
        (SERVICE + "GetUsage", pb.GetUsageRequest(session_id=session_id), False),
        (SERVICE + "CreateSession", pb.CreateSessionRequest(session_id=session_id + ".new"), False),
        (
            SERVICE + "SeedSession",
            pb.SeedSessionRequest(session_id=session_id + ".seed", messages=[message]),
            False,
        ),
        (SERVICE + "GetSession", pb.GetSessionRequest(session_id=session_id), False),
        (
            SERVICE + "UpdateSession",
            pb.UpdateSessionRequest(
                session=pb.Session(session_id=session_id, title="t"),
                update_mask=FieldMask(paths=["title"]),
            ),
            False,
        ),
        (SERVICE + "ListSessions", pb.ListSessionsRequest(), False),
        (
            # A position past the feed's end: a call that gets through ends at once.
            SERVICE + "FollowSessions",
            pb.FollowSessionsRequest(prefix=session_id, after_position=1 << 40),
            True,
        ),
        (
            SERVICE + "ForkSession",
            pb.ForkSessionRequest(parent_session_id=session_id, session_id=session_id + ".fork"),
            False,
        ),
        (
            SERVICE + "AcquireLease",
            pb.AcquireLeaseRequest(session_id=session_id, holder="w", ttl=Duration(seconds=30)),
            False,
        ),
        (SERVICE + "RenewLease", pb.RenewLeaseRequest(session_id=session_id, holder="w"), False),
        (
            SERVICE + "ReleaseLease",
            pb.ReleaseLeaseRequest(session_id=session_id, holder="w"),
            False,
        ),
        (
            SERVICE + "ImportSession",
            pb.ImportSessionRequest(session_id=session_id + ".imp", events=[user("x")]),
            False,
        ),
        (SERVICE + "GetSessionRecords", pb.GetSessionRecordsRequest(session_id=session_id), False),
        (
            SERVICE + "RedactEvents",
            pb.RedactEventsRequest(session_id=session_id, seqs=[0]),
            False,
        ),
        # Last of the session's RPCs: where a call gets through, it erases the session.
        (SERVICE + "DeleteSession", pb.DeleteSessionRequest(session_id=session_id), False),
        (FEED + "Changes", rpb.ChangesRequest(start_position=1), True),
        (FEED + "GetReplicationStatus", rpb.GetReplicationStatusRequest(), False),
        (ADMIN_SERVICE + "ListLeaseAudit", apb.ListLeaseAuditRequest(prefix=session_id), False),
        (ADMIN_SERVICE + "EraseSessions", apb.EraseSessionsRequest(prefix=session_id), False),
        (HEALTH_CHECK, health_pb2.HealthCheckRequest(), False),
    ]


def reflection_list(channel: grpc.Channel, token: str | None) -> list[str]:
    """The service names reflection lists (a bidirectional stream, one request)."""
    call = channel.stream_stream(REFLECTION)
    request = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    replies = list(call(iter([request]), metadata=bearer(token), timeout=TIMEOUT))
    reply = reflection_pb2.ServerReflectionResponse.FromString(replies[0])
    return [service.name for service in reply.list_services_response.service]


# -- authentication -------------------------------------------------------------------------------


@pytest.mark.workers  # every worker checks tokens
@pytest.mark.parametrize(("token"), [None, WRONG, ""], ids=["missing", "unknown", "empty"])
def test_every_rpc_without_a_valid_token_is_unauthenticated(
    server: RunningServer, token: str | None
) -> None:
    """No token, an unknown one, or an empty one: UNAUTHENTICATED with that reason, on every RPC,
    health and reflection included; nothing is written."""
    append(server.channel(), "seen", WRITER, "before")
    channel = server.channel()
    for method, request, streaming in every_rpc("seen"):
        error = refusal(channel, method, request, token, streaming)
        assert_refused(error, UNAUTHENTICATED)
        assert "Bearer" in (error.details() or ""), "the message says how to authenticate"
    with pytest.raises(grpc.RpcError) as caught:
        reflection_list(channel, token)
    assert_refused(caught.value, UNAUTHENTICATED)
    assert session(channel, "seen").event_count == 1
    for created in ("seen.new", "seen.seed", "seen.fork", "seen.imp"):
        assert not session(channel, created).exists


def test_a_malformed_authorization_header_is_unauthenticated(server: RunningServer) -> None:
    """A secret sent without the Bearer scheme (or under another scheme) is not accepted."""
    call = server.channel().unary_unary(SERVICE + "GetSession")
    request = pb.GetSessionRequest(session_id="s").SerializeToString()
    for value in (ADMIN, f"Basic {ADMIN}", f"Bearer{ADMIN}"):
        with pytest.raises(grpc.RpcError) as caught:
            call(request, metadata=(("authorization", value),), timeout=TIMEOUT)
        assert_refused(caught.value, UNAUTHENTICATED)


def test_the_bearer_scheme_is_case_insensitive(server: RunningServer) -> None:
    """`authorization: bearer SECRET` works like `Bearer` (RFC 7235: the scheme is
    case-insensitive)."""
    call = server.channel().unary_unary(SERVICE + "GetSession")
    request = pb.GetSessionRequest(session_id="s").SerializeToString()
    for scheme in ("bearer", "BEARER"):
        reply = call(request, metadata=(("authorization", f"{scheme} {READER}"),), timeout=TIMEOUT)
        assert not pb.GetSessionResponse.FromString(reply).session.exists


def test_a_token_configured_by_its_sha256_authenticates(server: RunningServer) -> None:
    """The tenant token, stored only as a digest, works with its secret (and not its digest)."""
    channel = server.channel()
    assert append(channel, "tenant-a.one", TENANT_A, "hello").next_seq == 1
    digest = hashlib.sha256(TENANT_A.encode()).hexdigest()
    error = refusal(
        channel,
        SERVICE + "GetSession",
        pb.GetSessionRequest(session_id="tenant-a.one"),
        digest,
        False,
    )
    assert_refused(error, UNAUTHENTICATED)


# -- permissions ----------------------------------------------------------------------------------


@pytest.mark.workers  # every worker checks tokens
def test_reader_reads_but_may_not_write(server: RunningServer) -> None:
    """The reader reads every read RPC but gets PERMISSION_DENIED on every write; nothing lands."""
    channel = server.channel()
    append(channel, "shared", WRITER, "one")
    assert (
        len(stream(channel, SERVICE + "Since", pb.SinceRequest(session_id="shared"), READER)) == 1
    )
    unary(channel, SERVICE + "Surface", pb.SurfaceRequest(session_id="shared"), READER)
    assert listed(channel, READER) == ["shared"]
    writes = [
        (method, request)
        for method, request, _ in every_rpc("shared")
        if method.rsplit("/", 1)[1]
        in {
            "Append",
            "AppendStream",
            "CreateSession",
            "SeedSession",
            "ForkSession",
            "AcquireLease",
            "RenewLease",
            "UpdateSession",
        }
    ]
    assert len(writes) == 8
    for method, request in writes:
        error = refusal(channel, method, request, READER, streaming=False)
        assert_refused(error, PERMISSION_DENIED)
        info = error_info(error)
        assert info.metadata["token"] == "reader"
        assert info.metadata["permission"] == "write"
    assert session(channel, "shared").event_count == 1
    assert listed(channel, ADMIN) == ["shared"]


def test_forced_release_needs_admin(server: RunningServer) -> None:
    """The writer may not force-release another holder's lease; the admin may."""
    channel = server.channel()
    acquire = pb.AcquireLeaseRequest(session_id="leased", holder="w1", ttl=Duration(seconds=60))
    unary(channel, SERVICE + "AcquireLease", acquire, WRITER)
    force = pb.ReleaseLeaseRequest(session_id="leased", holder="ops", force=True)
    error = refusal(channel, SERVICE + "ReleaseLease", force, WRITER, streaming=False)
    assert_refused(error, PERMISSION_DENIED)
    assert error_info(error).metadata["permission"] == "admin"
    assert session(channel, "leased").lease.holder == "w1"
    released = pb.ReleaseLeaseResponse.FromString(
        unary(channel, SERVICE + "ReleaseLease", force, ADMIN)
    )
    assert released.released.holder == "w1"
    assert not session(channel, "leased").lease.holder


def test_the_writer_releases_its_own_lease_without_admin(server: RunningServer) -> None:
    """A plain (not forced) release is a write, not an admin action."""
    channel = server.channel()
    acquire = pb.AcquireLeaseRequest(session_id="own", holder="w1", ttl=Duration(seconds=60))
    unary(channel, SERVICE + "AcquireLease", acquire, WRITER)
    release = pb.ReleaseLeaseRequest(session_id="own", holder="w1")
    unary(channel, SERVICE + "ReleaseLease", release, WRITER)
    assert not session(channel, "own").lease.holder


def test_the_change_feed_needs_admin(server: RunningServer) -> None:
    """Changes (every tenant's data) is refused to reader and writer, served to the admin;
    GetReplicationStatus needs only read."""
    channel = server.channel()
    append(channel, "fed", WRITER, "x")
    request = rpb.ChangesRequest(start_position=1)
    for token, name in ((READER, "reader"), (WRITER, "writer")):
        error = refusal(channel, FEED + "Changes", request, token, streaming=True)
        assert_refused(error, PERMISSION_DENIED)
        assert error_info(error).metadata["token"] == name
    replies = [
        rpb.ChangesResponse.FromString(r) for r in stream(channel, FEED + "Changes", request, ADMIN)
    ]
    assert sum(len(r.changes) for r in replies) >= 1
    status = rpb.GetReplicationStatusResponse.FromString(
        unary(channel, FEED + "GetReplicationStatus", rpb.GetReplicationStatusRequest(), READER)
    )
    assert status.role == "primary"


def test_a_prefix_limited_admin_may_not_read_the_change_feed(server: RunningServer) -> None:
    """The change feed carries every tenant's sessions, so an admin token limited to a prefix is
    refused it (it would otherwise read other tenants' data)."""
    channel = server.channel()
    append(channel, "tenant-b.private", WRITER, "b's secret")
    error = refusal(
        channel, FEED + "Changes", rpb.ChangesRequest(start_position=1), TENANT_ADMIN, True
    )
    assert_refused(error, PERMISSION_DENIED)


@pytest.mark.parametrize("token", [TENANT_A, TENANT_ADMIN], ids=["tenant-worker", "tenant-admin"])
def test_replication_status_is_refused_to_prefix_limited_tokens(
    server: RunningServer, token: str
) -> None:
    """GetReplicationStatus shows global positions (how much every tenant wrote), so a token
    limited to a prefix is refused it, admin or not; unscoped reader and admin get it."""
    channel = server.channel()
    append(channel, "tenant-b.s", WRITER, "b writes")
    request = rpb.GetReplicationStatusRequest()
    error = refusal(channel, FEED + "GetReplicationStatus", request, token, streaming=False)
    assert_refused(error, PERMISSION_DENIED)
    assert error_info(error).metadata["session_prefix"] == "tenant-a."
    for allowed in (READER, ADMIN):
        raw = unary(channel, FEED + "GetReplicationStatus", request, allowed)
        assert rpb.GetReplicationStatusResponse.FromString(raw).position == 1


def test_a_prefix_limited_admin_force_releases_only_inside_its_prefix(
    server: RunningServer,
) -> None:
    """The tenant admin may force a release in tenant-a., not in tenant-b."""
    channel = server.channel()
    for session_id in ("tenant-a.l", "tenant-b.l"):
        acquire = pb.AcquireLeaseRequest(
            session_id=session_id, holder="w", ttl=Duration(seconds=60)
        )
        unary(channel, SERVICE + "AcquireLease", acquire, WRITER)
    force_b = pb.ReleaseLeaseRequest(session_id="tenant-b.l", holder="ops", force=True)
    error = refusal(channel, SERVICE + "ReleaseLease", force_b, TENANT_ADMIN, streaming=False)
    assert_refused(error, PERMISSION_DENIED)
    assert session(channel, "tenant-b.l").lease.holder == "w"
    force_a = pb.ReleaseLeaseRequest(session_id="tenant-a.l", holder="ops", force=True)
    unary(channel, SERVICE + "ReleaseLease", force_a, TENANT_ADMIN)
    assert not session(channel, "tenant-a.l").lease.holder


# -- tenants --------------------------------------------------------------------------------------


@pytest.mark.workers  # every worker checks tokens
def test_a_tenant_token_cannot_touch_another_tenants_session(server: RunningServer) -> None:
    """Every RPC naming tenant-b.x with the tenant-a token is PERMISSION_DENIED (metadata names
    the prefix, the message never echoes the id), and tenant-b.x is unchanged."""
    channel = server.channel()
    append(channel, "tenant-b.x", WRITER, "b1", "b2")
    before = session(channel, "tenant-b.x")
    calls = [
        (method, request, streaming)
        for method, request, streaming in every_rpc("tenant-b.x")
        if method.startswith(SERVICE) and not method.endswith(("ListSessions", "GetSessionRecords"))
    ]
    # Every RPC that names a session: GetShardMap names none, ListSessions is scoped to the
    # tenant's prefix rather than refused, and GetSessionRecords is admin-only.
    service = pb.DESCRIPTOR.services_by_name["SessionLogService"]
    named = {m.name for m in service.methods} - {"ListSessions", "GetSessionRecords", "GetShardMap"}
    assert {method.rsplit("/", 1)[1] for method, _, _ in calls} == named
    for method, request, streaming in calls:
        error = refusal(channel, method, request, TENANT_A, streaming)
        assert_refused(error, PERMISSION_DENIED)
        info = error_info(error)
        assert info.metadata["session_prefix"] == "tenant-a.", method
        assert "tenant-b.x" not in (error.details() or ""), method
    after = session(channel, "tenant-b.x")
    assert after.event_count == before.event_count == 2
    assert not after.lease.holder
    for created in ("tenant-b.x.new", "tenant-b.x.seed", "tenant-b.x.fork", "tenant-b.x.imp"):
        assert not session(channel, created).exists


def test_a_tenant_cannot_follow_another_tenants_session(server: RunningServer) -> None:
    """A follow stream on tenant-b.x with the tenant-a token is refused at once, not left open."""
    channel = server.channel()
    append(channel, "tenant-b.x", WRITER, "b1")
    call = channel.unary_stream(SERVICE + "Since")
    request = pb.SinceRequest(session_id="tenant-b.x", follow=True).SerializeToString()
    responses = call(request, metadata=bearer(TENANT_A), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as caught:
        next(responses)
    assert_refused(caught.value, PERMISSION_DENIED)


def test_a_tenant_cannot_fork_across_prefixes(server: RunningServer) -> None:
    """Forking out of another tenant's session, or into another tenant's prefix, is refused;
    forking inside the tenant's own prefix works."""
    channel = server.channel()
    append(channel, "tenant-a.parent", TENANT_A, "a1", "a2")
    append(channel, "tenant-b.parent", WRITER, "b1", "b2")
    method = SERVICE + "ForkSession"
    out_of_b = pb.ForkSessionRequest(parent_session_id="tenant-b.parent", session_id="tenant-a.c1")
    into_b = pb.ForkSessionRequest(parent_session_id="tenant-a.parent", session_id="tenant-b.c2")
    for request in (out_of_b, into_b):
        assert_refused(refusal(channel, method, request, TENANT_A, False), PERMISSION_DENIED)
    assert not session(channel, "tenant-a.c1").exists
    assert not session(channel, "tenant-b.c2").exists
    inside = pb.ForkSessionRequest(parent_session_id="tenant-a.parent", session_id="tenant-a.c3")
    unary(channel, method, inside, TENANT_A)
    assert session(channel, "tenant-a.c3").event_count == 2


def test_a_tenants_usage_tree_stays_inside_its_prefix(server: RunningServer) -> None:
    """GetUsage with include_descendants leaves out a fork another token made outside the
    tenant's prefix; the unscoped writer sees the whole tree."""
    channel = server.channel()
    spending = user("u")
    spending.usage.CopyFrom(event_pb2.Usage(model="m", input_tokens=10))
    request = pb.AppendRequest(session_id="tenant-a.spend", events=[spending])
    unary(channel, SERVICE + "Append", request, TENANT_A)
    for child in ("tenant-a.spend.kid", "tenant-b.stolen"):
        fork = pb.ForkSessionRequest(parent_session_id="tenant-a.spend", session_id=child)
        unary(channel, SERVICE + "ForkSession", fork, WRITER)
        more = pb.AppendRequest(session_id=child, events=[spending])
        unary(channel, SERVICE + "Append", more, WRITER)
    tree = pb.GetUsageRequest(session_id="tenant-a.spend", include_descendants=True)
    seen = {}
    for token in (TENANT_A, WRITER):
        reply = pb.GetUsageResponse.FromString(unary(channel, SERVICE + "GetUsage", tree, token))
        seen[token] = (list(reply.descendant_session_ids), reply.usage[0].input_tokens)
    assert seen[TENANT_A] == (["tenant-a.spend.kid"], 20)
    assert seen[WRITER] == (["tenant-a.spend.kid", "tenant-b.stolen"], 30)


def test_a_tenant_lists_only_its_own_sessions(server: RunningServer) -> None:
    """ListSessions with the tenant token: an empty or shorter prefix is narrowed to tenant-a.,
    paging stays inside it, a narrower prefix works, and a prefix outside is refused."""
    channel = server.channel()
    mine = [f"tenant-a.{i}" for i in range(5)]
    for session_id in ["tenant-0", "tenant-b.0", "tenant-b.1", *mine, "tenant-c.z", "zz"]:
        append(channel, session_id, ADMIN, "x")
    assert listed(channel, TENANT_A) == mine
    assert listed(channel, TENANT_A, page_size=2) == mine
    assert listed(channel, TENANT_A, prefix="ten") == mine
    assert listed(channel, TENANT_A, prefix="tenant-a.3") == ["tenant-a.3"]
    error = refusal(
        channel,
        SERVICE + "ListSessions",
        pb.ListSessionsRequest(prefix="tenant-b."),
        TENANT_A,
        False,
    )
    assert_refused(error, PERMISSION_DENIED)
    assert len(listed(channel, ADMIN)) == 10


def test_a_tenant_works_inside_its_prefix(server: RunningServer) -> None:
    """The tenant token creates, appends, reads (from the end too) and follows sessions under
    tenant-a."""
    channel = server.channel()
    create = pb.CreateSessionRequest(session_id="tenant-a.c", events=[user("c0")])
    unary(channel, SERVICE + "CreateSession", create, TENANT_A)
    assert append(channel, "tenant-a.c", TENANT_A, "c1").next_seq == 2
    replies = stream(channel, SERVICE + "Since", pb.SinceRequest(session_id="tenant-a.c"), TENANT_A)
    contents = [e.data["content"] for r in replies for e in pb.SinceResponse.FromString(r).events]
    assert contents == ["c0", "c1"]
    newest = pb.ListEventsRequest(session_id="tenant-a.c", page_size=1, order_by="seq desc")
    page = pb.ListEventsResponse.FromString(
        unary(channel, SERVICE + "ListEvents", newest, TENANT_A)
    )
    assert [e.data["content"] for e in page.events] == ["c1"]
    last = pb.DeriveMessagesRequest(session_id="tenant-a.c", page_size=1)
    derived = unary(channel, SERVICE + "DeriveMessages", last, TENANT_A)
    assert [m.content for m in pb.DeriveMessagesResponse.FromString(derived).messages] == ["c1"]


# -- health and reflection ----------------------------------------------------------------------


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GRPCURL), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_health_and_reflection_need_a_token_by_default(server: RunningServer) -> None:
    """Without --auth-open-health, `grpcurl list` fails without a token and works with one."""
    refused = grpcurl("-plaintext", server.address, "list")
    assert refused.returncode != 0
    assert "Unauthenticated" in refused.stderr or "UNAUTHENTICATED" in refused.stderr
    allowed = grpcurl("-plaintext", "-H", f"authorization: Bearer {READER}", server.address, "list")
    assert allowed.returncode == 0, allowed.stderr
    assert "sessionlog.v1.SessionLogService" in allowed.stdout.split()
    channel = server.channel()
    reply = health_pb2.HealthCheckResponse.FromString(
        unary(channel, HEALTH_CHECK, health_pb2.HealthCheckRequest(), READER)
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_open_health_lets_probes_through_but_nothing_else(tmp_path: Path) -> None:
    """With auth_open_health, health Check and `grpcurl list` work without a token, while the
    log RPCs still need one."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    with running_server(tmp_path / "data", auth_tokens=str(tokens), auth_open_health=True) as srv:
        channel = srv.channel()
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=TIMEOUT
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "sessionlog.v1.SessionLogService" in reflection_list(channel, None)
        listing = grpcurl("-plaintext", srv.address, "list")
        assert listing.returncode == 0, listing.stderr
        assert "sessionlog.v1.SessionLogService" in listing.stdout.split()
        for method, request, streaming in every_rpc("open"):
            if method == HEALTH_CHECK:
                continue
            assert_refused(refusal(channel, method, request, None, streaming), UNAUTHENTICATED)


# -- the server process: secrets never logged, bad tokens files --------------------------------


@pytest.mark.workers  # every worker writes the log
def test_secrets_never_appear_in_the_server_log(tmp_path: Path) -> None:
    """A JSON-logging server process at debug level, sent successful and refused calls with
    valid, wrong and misused secrets, never writes a secret (nor a digest) to its log."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = ["--data", str(tmp_path / "data"), "--listen", address, "--auth-tokens", str(tokens)]
    args += ["--auth-open-health", "--log-format", "json", "--log-level", "debug"]
    with ServerProcess(args, tmp_path) as process:
        process.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            append(channel, "tenant-a.s", TENANT_A, "ok")
            lenient = pb.AppendRequest(
                session_id="tenant-a.s",
                events=[event_pb2.Event(type=99)],  # type: ignore[arg-type]  # unknown on purpose
                lenient=True,
            )
            unary(channel, SERVICE + "Append", lenient, WRITER)
            for token in (None, WRONG, READER, TENANT_A, ADMIN, TENANT_ADMIN):
                for method, request, streaming in every_rpc("tenant-b.s"):
                    try:
                        if method == SERVICE + "AppendStream":
                            appended(channel, method, request, token)
                        elif streaming:
                            stream(channel, method, request, token)
                        else:
                            unary(channel, method, request, token)
                    except grpc.RpcError:
                        pass
        assert process.stop() == 0
    log = process.log()
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert any(line["message"] == "sessionlog serving" for line in lines)
    assert any(line.get("reason") for line in lines), "the lenient drop was logged"
    for secret in (READER, WRITER, ADMIN, TENANT_A, TENANT_ADMIN, WRONG):
        assert secret not in log
        assert hashlib.sha256(secret.encode()).hexdigest() not in log


def test_no_token_and_a_wrong_token_get_distinct_messages(server: RunningServer) -> None:
    """Both UNAUTHENTICATED, but "no token" and "token not recognised" say which it was, and
    neither echoes the secret sent."""
    channel = server.channel()
    request = pb.GetSessionRequest(session_id="s")
    missing = refusal(channel, SERVICE + "GetSession", request, None, False)
    wrong = refusal(channel, SERVICE + "GetSession", request, WRONG, False)
    assert_refused(missing, UNAUTHENTICATED)
    assert_refused(wrong, UNAUTHENTICATED)
    assert (missing.details() or "").startswith("no token")
    assert (wrong.details() or "").startswith("token not recognised")
    assert WRONG not in (wrong.details() or "")


def test_a_refused_token_is_logged_without_its_secret(tmp_path: Path) -> None:
    """A wrong token is logged at WARNING with its length and the start of its SHA-256, never the
    secret itself; a call with no token is not."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", str(tmp_path / "data"), "--listen", address, "--auth-tokens", str(tokens)]
    args += ["--auth-open-health", "--log-format", "json"]
    with ServerProcess(args, tmp_path) as process:
        process.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            request = pb.GetSessionRequest(session_id="s")
            for token in (None, WRONG):
                refusal(channel, SERVICE + "GetSession", request, token, False)
        assert process.stop() == 0
    log = process.log()
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]
    refused = [line for line in lines if "token not recognised" in line["message"]]
    assert len(refused) == 1, log
    prefix = hashlib.sha256(WRONG.encode()).hexdigest()[:8]
    assert refused[0]["level"] in ("warning", "WARNING"), refused[0]
    assert f"{len(WRONG)} characters" in refused[0]["message"]
    assert f"sha256 {prefix}" in refused[0]["message"]
    assert WRONG not in log
    assert hashlib.sha256(WRONG.encode()).hexdigest() not in log


BAD_TOKENS = [
    pytest.param('[[token]]\ntoken = "0123456789abcdef0123"\n', "needs a name", id="missing-name"),
    pytest.param(
        '[[token]]\nname = "short"\ntoken = "tiny-secret"\n', "16+ characters", id="short-token"
    ),
    pytest.param(
        '[[token]]\nname = "typo"\ntoken = "0123456789abcdef0123"\npermissions = ["raed"]\n',
        "read/write/admin",
        id="bad-permission",
    ),
    pytest.param(
        '[[token]]\nname = "nested"\ntoken = "0123456789abcdef0123"\npermissions = [["read"]]\n',
        "read/write/admin",
        id="permission-not-a-string",
    ),
    pytest.param('[[token]]\nname = "hex"\nsha256 = "abc"\n', "64 hex digits", id="short-digest"),
    pytest.param(
        '[[token]]\nname = "a"\ntoken = "0123456789abcdef0123"\n\n'
        '[[token]]\nname = "b"\ntoken = "0123456789abcdef0123"\npermissions = ["admin"]\n',
        "same secret",
        id="duplicate-secret",
    ),
    pytest.param('title = "no tokens"\n', "no [[token]] entries", id="no-entries"),
    pytest.param(
        '[[token]]\nname = "idle"\ntoken = "0123456789abcdef0123"\npermissions = []\n',
        "(idle): permissions is empty",
        id="no-permissions",
    ),
    pytest.param(
        '[[token]]\nname = "spaced"\ntoken = "0123456789abcdef0123"\nsession_prefix = "a b"\n',
        "(spaced): session_prefix 'a b' can match no session id",
        id="prefix-no-id-can-match",
    ),
    pytest.param(
        '[[token]]\nname = "dash"\ntoken = "0123456789abcdef0123"\nsession_prefix = "-a."\n',
        "can match no session id",
        id="prefix-with-a-bad-first-character",
    ),
]


@pytest.mark.parametrize(("content", "problem"), BAD_TOKENS)
def test_a_bad_tokens_file_stops_the_server_with_one_line(
    tmp_path: Path, content: str, problem: str
) -> None:
    """`sessionlog serve --auth-tokens FILE` with a broken entry exits non-zero with one line on
    stderr naming the problem, without echoing any secret and without serving."""
    path = tmp_path / "tokens.toml"
    path.write_text(content)
    port = free_port()
    result = run_cli(
        [
            "serve",
            "--data",
            str(tmp_path / "data"),
            "--listen",
            f"127.0.0.1:{port}",
            "--auth-tokens",
            str(path),
        ],
        cwd=tmp_path,
        timeout=15,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert problem in lines[0]
    assert lines[0].startswith("sessionlog: ")
    for secret in ("0123456789abcdef0123", "tiny-secret"):
        assert secret not in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_sends_its_token(tmp_path: Path) -> None:
    """The CLI's --token (or SESSIONLOG_TOKEN) reaches the server; without it the refusal is
    one line naming UNAUTHENTICATED and exit 1."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as server:
        base = ["--server", server.address]
        append = ["append", "cli", "user_message", "--content", "hi", *base, "--token", WRITER]
        written = run_cli_here(append)
        assert written.returncode == 0, written.stderr
        refused = run_cli_here(["messages", "cli", *base])
        assert refused.returncode == 1
        assert "UNAUTHENTICATED" in refused.stderr
        read = run_cli_here(["messages", "cli", *base], SESSIONLOG_TOKEN=READER)
        assert read.returncode == 0, read.stderr
        assert "hi" in read.stdout


def test_an_open_ended_session_prefix_warns_once_at_start(tmp_path: Path) -> None:
    """A prefix without a trailing separator ("team-a" also admits "team-ab") gets one warning
    line naming the token at start; a prefix ending in '.' gets none."""
    path = tmp_path / "tokens.toml"
    path.write_text(
        f'[[token]]\nname = "loose"\ntoken = "{TENANT_A}"\nsession_prefix = "team-a"\n\n'
        f'[[token]]\nname = "tight"\ntoken = "{READER}"\nsession_prefix = "team-b."\n'
    )
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = ["--data", str(tmp_path / "data"), "--listen", address, "--auth-tokens", str(path)]
    with ServerProcess([*args, "--auth-open-health", "--log-format", "json"], tmp_path) as proc:
        proc.wait_serving(address)
        assert proc.stop() == 0
    lines = [json.loads(line) for line in proc.log().splitlines() if line.strip()]
    warnings = [line for line in lines if line["level"] == "warning"]
    assert [(w["token"], w["session_prefix"]) for w in warnings] == [("loose", "team-a")]
    assert "'team-a' admits 'team-ab'" in warnings[0]["message"]


# -- replicas of a primary that requires tokens -------------------------------------------------

REPLICA_SECRET = "replica-secret-2b7d9e04c6f1"


def primary_tokens(path: Path) -> Path:
    """The shared tokens plus an admin token for the replica."""
    tokens_file(path)
    with path.open("a") as out:
        out.write(f'\n[[token]]\nname = "replica"\ntoken = "{REPLICA_SECRET}"\n')
        out.write('permissions = ["admin"]\n')
    return path


def replicated(address: str, session_id: str, token: str | None) -> list[str]:
    """The contents of ``session_id`` as read from ``address`` with ``token``, once the replica
    has them (polled for at most 10 s)."""
    deadline = time.monotonic() + 10
    contents: list[str] = []
    with grpc.insecure_channel(address) as channel:
        while time.monotonic() < deadline and not contents:
            request = pb.SinceRequest(session_id=session_id)
            replies = stream(channel, SERVICE + "Since", request, token)
            contents = [
                str(e.data["content"])
                for raw in replies
                for e in pb.SinceResponse.FromString(raw).events
            ]
            time.sleep(0.05)
    return contents


def serve_args(folder: Path, address: str, *extra: str) -> list[str]:
    return ["--data", str(folder / "data"), "--listen", address, "--auth-open-health", *extra]


def test_a_replica_reads_its_token_from_a_file(tmp_path: Path) -> None:
    """--replica-token-file (whitespace around the token stripped) authenticates a real replica
    to a primary with tokens; the secret is not on the replica's command line, and the replica
    with its own tokens refuses a caller without one."""
    tokens = primary_tokens(tmp_path / "tokens.toml")
    secret_file = tmp_path / "replica.token"
    secret_file.write_text(f"  {REPLICA_SECRET}\n\n")
    primary_address = f"127.0.0.1:{free_port()}"
    replica_address = f"127.0.0.1:{free_port()}"
    primary_args = serve_args(tmp_path / "p", primary_address, "--auth-tokens", str(tokens))
    replica_args = serve_args(
        tmp_path / "r",
        replica_address,
        *("--auth-tokens", str(tokens), "--replica-of", primary_address),
        *("--replica-token-file", str(secret_file)),
    )
    with ServerProcess(primary_args, tmp_path, name="primary") as primary:
        primary.wait_serving(primary_address)
        with grpc.insecure_channel(primary_address) as channel:
            append(channel, "tenant-a.s", WRITER, "replicated")
        with ServerProcess(replica_args, tmp_path, name="replica") as replica:
            replica.wait_serving(replica_address)
            assert replicated(replica_address, "tenant-a.s", READER) == ["replicated"]
            command_line = Path(f"/proc/{replica.pid}/cmdline").read_bytes()
            assert REPLICA_SECRET.encode() not in command_line
            with grpc.insecure_channel(replica_address) as channel:
                request = pb.SinceRequest(session_id="tenant-a.s")
                error = refusal(channel, SERVICE + "Since", request, None, streaming=True)
            assert_refused(error, UNAUTHENTICATED)
            assert replica.stop() == 0
        assert primary.stop() == 0
    assert REPLICA_SECRET not in replica.log()


def test_replica_serve_open_serves_open_with_one_warning(tmp_path: Path) -> None:
    """With --replica-serve-open, a replica holding a token for its primary but none of its own
    starts, serves reads without a token, and says so in one warning line."""
    tokens = primary_tokens(tmp_path / "tokens.toml")
    primary_address = f"127.0.0.1:{free_port()}"
    replica_address = f"127.0.0.1:{free_port()}"
    primary_args = serve_args(tmp_path / "p", primary_address, "--auth-tokens", str(tokens))
    replica_args = serve_args(
        tmp_path / "r",
        replica_address,
        *("--replica-of", primary_address, "--replica-token", REPLICA_SECRET),
        *("--replica-serve-open", "--log-format", "json"),
    )
    with ServerProcess(primary_args, tmp_path, name="primary") as primary:
        primary.wait_serving(primary_address)
        with grpc.insecure_channel(primary_address) as channel:
            append(channel, "tenant-a.s", WRITER, "open on purpose")
        with ServerProcess(replica_args, tmp_path, name="replica") as replica:
            replica.wait_serving(replica_address)
            assert replicated(replica_address, "tenant-a.s", None) == ["open on purpose"]
            assert replica.stop() == 0
        assert primary.stop() == 0
    lines = [json.loads(line) for line in replica.log().splitlines() if line.strip()]
    warnings = [line["message"] for line in lines if line["level"] == "warning"]
    assert len(warnings) == 1, warnings
    assert "without tokens (--replica-serve-open)" in warnings[0]


BAD_REPLICA_SETUPS = [
    pytest.param(
        ["--replica-token", REPLICA_SECRET],
        "",
        "no --auth-tokens of its own, so it would serve every tenant's data to anyone: give it "
        "--auth-tokens FILE, or --replica-serve-open",
        id="token-but-no-tokens-of-its-own",
    ),
    pytest.param(
        ["--replica-token-file", "{file}"],
        f"{REPLICA_SECRET}\n",
        "no --auth-tokens of its own",
        id="token-file-but-no-tokens-of-its-own",
    ),
    pytest.param(
        [
            "--replica-token",
            REPLICA_SECRET,
            "--replica-token-file",
            "{file}",
            "--auth-tokens",
            "{tokens}",
        ],
        f"{REPLICA_SECRET}\n",
        "--replica-token and --replica-token-file both give the replica's token",
        id="both-token-and-file",
    ),
    pytest.param(
        ["--replica-token-file", "{missing}", "--auth-tokens", "{tokens}"],
        "",
        "cannot read the replica token file",
        id="missing-file",
    ),
    pytest.param(
        ["--replica-token-file", "{file}", "--auth-tokens", "{tokens}"],
        " \n\t\n",
        "is empty; write the token into it",
        id="empty-file",
    ),
    pytest.param(
        ["--replica-token-file", "{file}", "--auth-tokens", "{tokens}"],
        f"{REPLICA_SECRET}\nsecond line\n",
        "must hold just the token",
        id="two-lines",
    ),
]


@pytest.mark.parametrize(("flags", "content", "problem"), BAD_REPLICA_SETUPS)
def test_a_replica_misconfigured_for_tokens_refuses_to_start(
    tmp_path: Path, flags: list[str], content: str, problem: str
) -> None:
    """A replica whose token setup would leak data or cannot work exits non-zero with one line
    naming the fix, before it serves anything, and never echoes the secret."""
    tokens = primary_tokens(tmp_path / "tokens.toml")
    secret_file = tmp_path / "replica.token"
    secret_file.write_text(content)
    paths = {"file": secret_file, "missing": tmp_path / "nowhere", "tokens": tokens}
    args = [flag.format(**paths) for flag in flags]
    unused = f"127.0.0.1:{free_port()}"
    result = run_cli(
        ["serve", *serve_args(tmp_path, f"127.0.0.1:{free_port()}", "--replica-of", unused), *args],
        cwd=tmp_path,
        timeout=15,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sessionlog: ")
    assert problem in lines[0]
    assert REPLICA_SECRET not in result.stderr
    assert not (tmp_path / "data").exists(), "nothing was opened"
