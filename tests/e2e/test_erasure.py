"""Erasure end to end: DeleteSession, RedactEvents and EraseSessions over gRPC, their refusals,
tenants kept to their prefix, `admin verify` clean after, and replicas (caught up, and behind
the erase) ending byte-identical to the primary.

One plain server and one with auth for the module; the replication tests start their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client, event
from sessionlog_client.errors import SessionNotFound
from tests.e2e._helpers import append, check, failure, get, log, replace, say, stats, user
from tests.e2e._proc import run_cli, run_cli_here, running_server
from tests.e2e._replication_cluster import (
    Cluster,
    changes_raw,
    since_raw,
    wait_position,
)
from tests.e2e.test_auth import ADMIN, TENANT_A, TENANT_ADMIN, WRITER, bearer, tokens_file

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
SECRET = "SECRET-e2e-4b1d-forget-me"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("erasure") / "data") as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> Any:
    return server.stub()


def delete(stub: Any, session_id: str, **fields: Any) -> pb.DeleteSessionResponse:
    reply: pb.DeleteSessionResponse = stub.DeleteSession(
        pb.DeleteSessionRequest(session_id=session_id, **fields), timeout=30
    )
    return reply


def redact(stub: Any, session_id: str, *seqs: int, **fields: Any) -> pb.RedactEventsResponse:
    request = pb.RedactEventsRequest(session_id=session_id, seqs=seqs, **fields)
    reply: pb.RedactEventsResponse = stub.RedactEvents(request, timeout=30)
    return reply


def verify_clean(data: Path) -> None:
    done = run_cli(["admin", "verify", "--data", str(data)], cwd=data.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_delete_then_get_finds_nothing_and_the_id_can_be_used_again(
    stub: Any, server: RunningServer
) -> None:
    """After DeleteSession the session reads as never written; a second delete is
    SESSION_NOT_FOUND; appending to the id starts a new log at seq 0."""
    append(stub, "del-a", user(SECRET), user("two"))
    assert len(log(stub, "del-a")) == 2
    reply = delete(stub, "del-a", reason="user request")
    assert (reply.session.session_id, reply.event_count) == ("del-a", 2)
    assert reply.position > 0
    assert not get(stub, "del-a").exists
    assert log(stub, "del-a") == []
    check(failure(delete, stub, "del-a"), NOT_FOUND, "SESSION_NOT_FOUND", session_id="del-a")
    again = append(stub, "del-a", user("new life"), user("same length"))
    assert again.events[0].seq == 0
    assert [e.data["content"] for e in log(stub, "del-a")] == ["new life", "same length"]
    verify_clean(Path(server.config.data_dir))


def test_a_follower_of_a_deleted_session_is_told(stub: Any) -> None:
    """A live Since on a session that gets deleted ends with SESSION_NOT_FOUND instead of
    waiting on (and later mixing in) a new log of the same id."""
    append(stub, "del-followed", user("one"))
    stream = stub.Since(pb.SinceRequest(session_id="del-followed", follow=True), timeout=30)
    first = next(stream)
    assert [e.seq for e in first.events] == [0]
    assert next(stream).caught_up
    delete(stub, "del-followed")
    append(stub, "del-followed", user("new"), user("log"))
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)
    check(caught.value, NOT_FOUND, "SESSION_NOT_FOUND", session_id="del-followed")


def test_delete_refusals_change_nothing(stub: Any, server: RunningServer) -> None:
    """A bad id, a stale expected_seq and another holder's live lease are refused; the store is
    unchanged."""
    append(stub, "del-held", user("x"))
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="del-held", holder="w"))
    before = stats(server.channel())
    check(failure(delete, stub, "bad id!"), INVALID, "INVALID_SESSION_ID")
    check(
        failure(delete, stub, "del-held", expected_seq=7), grpc.StatusCode.ABORTED, "SEQ_CONFLICT"
    )
    check(
        failure(delete, stub, "del-held"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_HELD",
        holder="w",
    )
    assert stats(server.channel()).position == before.position
    assert delete(stub, "del-held", lease_holder="w", expected_seq=1).event_count == 1


def test_redact_then_since_surface_derive_and_fork(stub: Any) -> None:
    """Redacted events keep seq, type, time and surface_op and lose their data; the derived
    message shows as redacted with no content; a fork copies the redacted form."""
    append(stub, "red-a", user("hello"), user(SECRET), say("answer", 3))
    append(stub, "red-a", replace(0, 0, "summary " + SECRET))
    derived_before = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="red-a"))
    assert derived_before.seqs == [3, 1, 2]
    assert log(stub, "red-a")[1].data["content"] == SECRET  # a Since read cached before
    reply = redact(stub, "red-a", 1, 3, reason="privacy")
    assert (list(reply.seqs), reply.position > 0) == ([1, 3], True)
    events = log(stub, "red-a")
    assert [e.seq for e in events] == [0, 1, 2, 3]
    for seq in (1, 3):
        assert not events[seq].data.fields
        assert events[seq].redacted.reason == "privacy"
        assert events[seq].HasField("time")
    assert events[3].surface_op.replace.stop_seq == 0
    assert events[0].data["content"] == "hello"
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="red-a"))
    assert derived.seqs == [3, 1, 2]
    assert not derived.messages[0].HasField("content")
    assert derived.messages[0].metadata["redacted"] is True
    assert derived.messages[2].content == "answer"
    known = pb.DeriveMessagesRequest(
        session_id="red-a", known_event_count=4, known_replace_generation=1
    )
    again = stub.DeriveMessages(known)  # a caller's copy may predate the redaction: all of it
    assert (again.incremental, list(again.seqs)) == (False, [3, 1, 2])
    fork = stub.ForkSession(pb.ForkSessionRequest(parent_session_id="red-a", session_id="red-f"))
    assert fork.session.event_count == 4
    assert [e.SerializeToString() for e in log(stub, "red-f")] == [
        e.SerializeToString() for e in events
    ]
    assert SECRET not in str(stub.Surface(pb.SurfaceRequest(session_id="red-a")))


def test_a_redaction_that_changes_nothing_replies_position_zero(
    stub: Any, server: RunningServer
) -> None:
    """Redacting only events already redacted writes nothing and replies no seqs and position
    0, as the proto says (it replied the feed's head); a later one that changes an event
    replies its own record's position."""
    append(stub, "red-again", user(SECRET), user("two"))
    first = redact(stub, "red-again", 0)
    assert list(first.seqs) == [0]
    head = stats(server.channel()).position
    assert first.position == head
    again = redact(stub, "red-again", 0)
    assert (list(again.seqs), again.position) == ([], 0)
    assert stats(server.channel()).position == head  # nothing was written
    partly = redact(stub, "red-again", 0, 1)
    assert (list(partly.seqs), partly.position) == ([1], head + 1)


def test_bad_redactions_are_clear_errors_and_change_nothing(
    stub: Any, server: RunningServer
) -> None:
    """Past the end, no seqs, a missing session: each refused with its reason; nothing moves."""
    append(stub, "red-bad", user("only"))
    before = stats(server.channel()).position
    check(
        failure(redact, stub, "red-bad", 0, 5),
        INVALID,
        "BOUNDARY_OUT_OF_RANGE",
        seq=5,
        next_seq=1,
    )
    check(failure(redact, stub, "red-bad"), INVALID, "INVALID_REDACTION")
    check(failure(redact, stub, "red-nobody", 0), NOT_FOUND, "SESSION_NOT_FOUND")
    assert stats(server.channel()).position == before
    assert log(stub, "red-bad")[0].data["content"] == "only"


def test_erase_sessions_by_prefix_and_by_owner(stub: Any, server: RunningServer) -> None:
    """EraseSessions removes every session under the prefix and nothing else; with a filter
    (owner = "X": everything of user X), only the sessions it matches, under any prefix; a bad
    filter is INVALID_FILTER and erases nothing."""
    admin = apb_grpc.AdminServiceStub(server.channel())  # type: ignore[no-untyped-call]
    for n in range(5):
        append(stub, f"erase-u1.{n}", user(f"u1 {n}"))
    append(stub, "erase-u2.0", user("u2"))
    for session_id, owner in (("own-a.1", "xena"), ("own-b.1", "xena"), ("own-a.2", "yuri")):
        stub.CreateSession(pb.CreateSessionRequest(session_id=session_id, owner=owner))
    error = failure(
        admin.EraseSessions, apb.EraseSessionsRequest(prefix="erase-u1.", filter="owner ~ x")
    )
    check(error, INVALID, "INVALID_FILTER")
    assert get(stub, "erase-u1.0").exists
    by_owner = admin.EraseSessions(apb.EraseSessionsRequest(filter='owner = "xena"'))
    assert by_owner.session_count == 2
    assert not get(stub, "own-a.1").exists
    assert not get(stub, "own-b.1").exists
    assert get(stub, "own-a.2").exists
    check(failure(admin.EraseSessions, apb.EraseSessionsRequest()), INVALID, "INVALID_REDACTION")
    reply = admin.EraseSessions(apb.EraseSessionsRequest(prefix="erase-u1.", reason="closed"))
    assert (reply.session_count, reply.event_count) == (5, 5)
    listed = stub.ListSessions(pb.ListSessionsRequest(prefix="erase-"))
    assert [s.session_id for s in listed.sessions] == ["erase-u2.0"]


def test_the_feed_shows_the_erase_and_no_erased_content(stub: Any, server: RunningServer) -> None:
    """A follower of the change feed sees the DELETE record naming the session; the records
    before it that wrote the session are placeholders, and no record holds the erased text."""
    append(stub, "feed-del", user(SECRET))
    reply = delete(stub, "feed-del")
    raw = changes_raw(server.channel())
    assert all(SECRET.encode() not in record for record in raw)
    records = [rpb.Change.FromString(record) for record in raw]
    deleted = records[reply.position - 1]
    assert (deleted.kind, deleted.session_id) == (rpb.CHANGE_KIND_DELETE, "feed-del")
    assert not any(r.session_id == "feed-del" for r in records[: reply.position - 1])


# -- clients and CLI ----------------------------------------------------------------------------


def test_python_client_deletes_and_redacts(server: RunningServer) -> None:
    """Client.delete_session / redact_events, and the async ones; SessionNotFound comes back as
    the client's exception."""
    with Client(server.address) as client:
        client.append("py-sync", [event("user_message", {"content": SECRET}), event("turn_start")])
        assert list(client.redact_events("py-sync", [0], reason="r").seqs) == [0]
        assert client.derive_messages("py-sync").messages[0].metadata["redacted"] is True
        assert client.delete_session("py-sync", expected_seq=2).event_count == 2
        with pytest.raises(SessionNotFound):
            client.delete_session("py-sync")

    async def run() -> tuple[list[int], int]:
        async with AsyncClient(server.address) as client:
            await client.append("py-async", [event("user_message", {"content": "x"})])
            redacted = await client.redact_events("py-async", [0])
            deleted = await client.delete_session("py-async", reason="test")
            return list(redacted.seqs), deleted.event_count

    assert asyncio.run(run()) == ([0], 1)


def test_cli_delete_redact_erase_and_tail_prefix(server: RunningServer) -> None:
    """`sessionlog delete`, `redact`, `admin erase`; `tail --prefix` shows the redacted event
    and the delete."""
    stub = server.stub()
    append(stub, "cli-e.one", user(SECRET), user("two"))
    append(stub, "cli-e.two", user("x"))
    start = stats(server.channel()).position

    def cli(*args: str) -> str:
        done = run_cli_here([*args, "--server", server.address])
        assert done.returncode == 0, done.stderr
        return done.stdout

    tail = ("tail", "--prefix", "cli-e.", "--from-position", str(start + 1), "--no-follow")
    assert "redacted seqs 0" in cli("redact", "cli-e.one", "0", "--reason", "privacy")
    assert "nothing to redact" in cli("redact", "cli-e.one", "0")
    redacted = cli(*tail).splitlines()
    assert len(redacted) == 1
    assert "[redacted]" in redacted[0]
    assert "cli-e.one" in redacted[0]
    assert "deleted cli-e.one (2 events)" in cli("delete", "cli-e.one")
    refused = run_cli_here(["delete", "cli-e.one", "--server", server.address])
    assert refused.returncode == 1
    assert "SESSION_NOT_FOUND" in refused.stderr
    assert "erased 1 session (" in cli("admin", "erase", "--prefix", "cli-e.")
    by_filter = cli("admin", "erase", "--filter", 'owner = "nobody"', "--reason", "none")
    assert "erased 0 sessions (0 events) matching 'owner = \"nobody\"'" in by_filter
    tailed = cli(*tail)
    # The redact record is now a placeholder of the deleted session: only the deletes show.
    assert [line.split()[1:] for line in tailed.splitlines()] == [
        ["cli-e.one", "deleted"],
        ["cli-e.two", "deleted"],
    ]
    assert SECRET not in tailed


# -- tenants ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("erasure-auth")
    tokens = tokens_file(root / "tokens.toml")
    with running_server(root / "data", auth_tokens=str(tokens)) as running:
        yield running


def test_tenants_erase_only_inside_their_prefix(auth_server: RunningServer) -> None:
    """A tenant token deletes and redacts its own sessions and is refused outside its prefix;
    a forced delete and EraseSessions need an unrestricted admin token."""
    stub = auth_server.stub()
    for session_id in ("tenant-a.mine", "tenant-a.other", "tenant-b.theirs"):
        written = pb.AppendRequest(session_id=session_id, events=[user("x")])
        stub.Append(written, metadata=bearer(ADMIN))
    denied = grpc.StatusCode.PERMISSION_DENIED
    tenant = bearer(TENANT_A)
    for call, request in (
        (stub.DeleteSession, pb.DeleteSessionRequest(session_id="tenant-b.theirs")),
        (stub.RedactEvents, pb.RedactEventsRequest(session_id="tenant-b.theirs", seqs=[0])),
        (stub.DeleteSession, pb.DeleteSessionRequest(session_id="tenant-a.mine", force=True)),
    ):
        check(failure(call, request, metadata=tenant), denied, "PERMISSION_DENIED")
    admin = apb_grpc.AdminServiceStub(auth_server.channel())  # type: ignore[no-untyped-call]
    erase = apb.EraseSessionsRequest(prefix="tenant-a.")
    check(failure(admin.EraseSessions, erase, metadata=tenant), denied, "PERMISSION_DENIED")
    redacted = stub.RedactEvents(
        pb.RedactEventsRequest(session_id="tenant-a.other", seqs=[0]), metadata=tenant
    )
    assert list(redacted.seqs) == [0]
    stub.DeleteSession(pb.DeleteSessionRequest(session_id="tenant-a.mine"), metadata=tenant)
    exists = stub.GetSession(
        pb.GetSessionRequest(session_id="tenant-b.theirs"), metadata=bearer(WRITER)
    )
    assert exists.session.exists
    gone = stub.GetSession(pb.GetSessionRequest(session_id="tenant-a.mine"), metadata=tenant)
    assert not gone.session.exists


def test_a_tenants_admin_token_erases_its_own_tenant_and_nothing_else(
    auth_server: RunningServer,
) -> None:
    """A token with admin limited to "tenant-a." uses EraseSessions on its own sessions: by its
    prefix, by a prefix under it, or by a filter alone or a wider prefix (both narrowed to its
    prefix); a prefix outside its own and a slot's copies are PERMISSION_DENIED, and no other
    tenant's session is touched by any of it."""
    stub = auth_server.stub()
    admin = apb_grpc.AdminServiceStub(auth_server.channel())  # type: ignore[no-untyped-call]
    ids = ("tenant-a.e-x1", "tenant-a.e-x2", "tenant-a.e-y1", "tenant-b.e-x1", "tenant-ab.e-x1")
    for session_id in ids:
        created = pb.CreateSessionRequest(session_id=session_id, owner="ann")
        stub.CreateSession(created, metadata=bearer(ADMIN))
        stub.Append(
            pb.AppendRequest(session_id=session_id, events=[user("x")]), metadata=bearer(ADMIN)
        )
    tenant = bearer(TENANT_ADMIN)
    denied = grpc.StatusCode.PERMISSION_DENIED
    for refused in (
        apb.EraseSessionsRequest(prefix="tenant-b."),
        apb.EraseSessionsRequest(prefix="other"),
        apb.EraseSessionsRequest(slot_copies=3),
    ):
        check(failure(admin.EraseSessions, refused, metadata=tenant), denied, "PERMISSION_DENIED")
    one = admin.EraseSessions(
        apb.EraseSessionsRequest(prefix="tenant-a.e-x", reason="tenant cleanup"), metadata=tenant
    )
    assert one.session_count == 2
    wide = admin.EraseSessions(
        apb.EraseSessionsRequest(filter='owner = "ann"'), metadata=tenant
    )  # no prefix: narrowed to tenant-a.
    assert wide.session_count == 1
    admin.EraseSessions(apb.EraseSessionsRequest(prefix="tenant-"), metadata=tenant)  # a.* only

    def exists(session_id: str) -> bool:
        got = stub.GetSession(pb.GetSessionRequest(session_id=session_id), metadata=bearer(ADMIN))
        return bool(got.session.exists)

    assert [s for s in ids if exists(s)] == ["tenant-b.e-x1", "tenant-ab.e-x1"]


# -- replicas -----------------------------------------------------------------------------------


def _head(node: Any) -> int:
    return int(node.status().position)


def test_replicas_erase_too_caught_up_or_behind(tmp_path: Path) -> None:
    """A replica that follows the erase live, and one that was stopped before it and catches up
    after, both end with the primary's change feed and events byte for byte, and verify clean."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        live = cluster.replica(primary, "live")
        behind = cluster.replica(primary, "behind")
        stub = primary.stub()
        stub.Append(pb.AppendRequest(session_id="keep", events=[user("kept")]), timeout=10)
        stub.Append(pb.AppendRequest(session_id="gone", events=[user(SECRET)]), timeout=10)
        stub.Append(pb.AppendRequest(session_id="red", events=[user(SECRET)]), timeout=10)
        head = _head(primary)
        wait_position(live, head)
        wait_position(behind, head)
        assert behind.stop() == 0
        stub.Append(pb.AppendRequest(session_id="gone", events=[user("more")]), timeout=10)
        stub.DeleteSession(pb.DeleteSessionRequest(session_id="gone"), timeout=10)
        stub.RedactEvents(pb.RedactEventsRequest(session_id="red", seqs=[0]), timeout=10)
        stub.Append(pb.AppendRequest(session_id="gone", events=[user("again")]), timeout=10)
        head = _head(primary)
        behind.start()
        for replica in (live, behind):
            wait_position(replica, head)
            assert changes_raw(replica.channel) == changes_raw(primary.channel), replica.name
            for session_id in ("keep", "gone", "red"):
                assert since_raw(replica.channel, session_id) == since_raw(
                    primary.channel, session_id
                )
        assert all(SECRET.encode() not in raw for raw in since_raw(live.channel, "red"))
        for node in (primary, live, behind):
            assert node.stop() == 0
            verify_clean(node.data)


# -- the data file ------------------------------------------------------------------------------


def test_admin_compact_clears_the_data_file_and_the_server_starts_on_it(tmp_path: Path) -> None:
    """Erased text stays in data.mdb after delete and redact; `admin compact` (refused while
    the server runs) rewrites the file without it, and a server started on it serves every
    other session unchanged, `admin verify` clean."""
    data = tmp_path / "data"
    with running_server(data) as running:
        stub = running.stub()
        for n in range(20):
            append(stub, f"keep-{n}", user(f"kept {n}"))
        append(stub, "gone", user(SECRET))
        append(stub, "red", user(SECRET + "-redacted"), user("fine"))
        for n in range(20):
            append(stub, f"keep-{n}", user(f"more {n}"))
        delete(stub, "gone")
        redact(stub, "red", 0)
        kept = {f"keep-{n}": log(stub, f"keep-{n}") for n in range(20)}
        busy = run_cli(["admin", "compact", "--data", str(data)], tmp_path)
        assert busy.returncode == 1
        assert "stop the server" in busy.stderr
    assert SECRET.encode() in (data / "data.mdb").read_bytes()
    done = run_cli(["admin", "compact", "--data", str(data)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "compacted" in done.stdout
    assert SECRET.encode() not in (data / "data.mdb").read_bytes()
    verify_clean(data)
    audit = run_cli(["admin", "erasures", "--data", str(data)], tmp_path)
    assert audit.returncode == 0, audit.stderr
    kinds = [line.split()[2:4] for line in audit.stdout.splitlines()]
    assert kinds == [["DELETE", "gone"], ["REDACT", "red"]]
    assert SECRET not in audit.stdout
    with running_server(data) as running:
        stub = running.stub()
        assert {session_id: log(stub, session_id) for session_id in kept} == kept
        assert [e.data["content"] for e in log(stub, "red")[1:]] == ["fine"]
        assert not get(stub, "gone").exists
        append(stub, "keep-0", user("after"))
