"""Issue 17's parts as a hostile but realistic user meets them: each test is a problem found by
trying to break them through a real server, and shows it fixed.

One server for the module, with auth on: an admin token and two tenants (``a.`` and ``b.``);
each test writes its own sessions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import ASSISTANT, check, failure, user
from tests.e2e._proc import run_cli, run_cli_here, running_server

ADMIN = (("authorization", "Bearer admin-secret-7d2e91c04b5a"),)
TENANT_A = (("authorization", "Bearer tenant-a-secret-3f8c1d6e29b0"),)
TENANT_B = (("authorization", "Bearer tenant-b-secret-b04e7a9c5d12"),)

TOKENS = """
[[token]]
name = "admin"
token = "admin-secret-7d2e91c04b5a"
permissions = ["admin"]

[[token]]
name = "tenant-a"
token = "tenant-a-secret-3f8c1d6e29b0"
permissions = ["read", "write"]
session_prefix = "a."

[[token]]
name = "tenant-b"
token = "tenant-b-secret-b04e7a9c5d12"
permissions = ["read", "write"]
session_prefix = "b."
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder: Path = tmp_path_factory.mktemp("i17-trial")
    tokens = folder / "tokens.toml"
    tokens.write_text(TOKENS)
    with running_server(folder / "data", auth_tokens=str(tokens)) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.SessionLogServiceStub:
    return server.stub()


def spent(event: event_pb2.Event, model: str, tokens: int) -> event_pb2.Event:
    event.usage.model, event.usage.input_tokens = model, tokens
    return event


def test_a_tenant_forks_without_naming_the_child(stub: pb_grpc.SessionLogServiceStub) -> None:
    """A tenant's fork with a generated id gets one inside its prefix (it was PERMISSION_DENIED:
    the id the store made up lay outside it), and a retry under its request_id replays it."""
    stub.Append(pb.AppendRequest(session_id="a.gen", events=[user("one")]), metadata=TENANT_A)
    request = pb.ForkSessionRequest(parent_session_id="a.gen", request_id="fork-1")
    child = stub.ForkSession(request, metadata=TENANT_A).session
    assert child.session_id.startswith("a.fork-"), child.session_id
    assert (child.parent_session_id, child.event_count) == ("a.gen", 1)
    assert stub.ForkSession(request, metadata=TENANT_A).session.session_id == child.session_id
    read = stub.GetSession(pb.GetSessionRequest(session_id=child.session_id), metadata=TENANT_A)
    assert read.session.event_count == 1
    other = pb.ForkSessionRequest(parent_session_id="a.gen")
    check(
        failure(stub.ForkSession, other, metadata=TENANT_B),
        grpc.StatusCode.PERMISSION_DENIED,
        "PERMISSION_DENIED",
    )
    untenanted = stub.ForkSession(other, metadata=ADMIN).session.session_id
    assert untenanted.startswith("fork-"), untenanted


def test_a_session_made_again_has_no_forks_of_its_erased_namesake(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """GetUsage include_descendants of a session deleted and written again leaves out the forks
    of the erased session of that id (they were summed into the new session's tree)."""
    first = [spent(user("old"), "m", 100)]
    stub.Append(pb.AppendRequest(session_id="a.again", events=first), metadata=ADMIN)
    fork = pb.ForkSessionRequest(parent_session_id="a.again", session_id="a.again-fork")
    stub.ForkSession(fork, metadata=ADMIN)
    more = [spent(user("fork's own"), "m", 7)]
    stub.Append(pb.AppendRequest(session_id="a.again-fork", events=more), metadata=ADMIN)
    stub.DeleteSession(pb.DeleteSessionRequest(session_id="a.again"), metadata=ADMIN)
    fresh = [spent(user("new"), "m", 1)]
    stub.Append(pb.AppendRequest(session_id="a.again", events=fresh), metadata=ADMIN)
    tree = pb.GetUsageRequest(session_id="a.again", include_descendants=True)
    reply = stub.GetUsage(tree, metadata=ADMIN)
    assert list(reply.descendant_session_ids) == []
    assert [(u.model, u.input_tokens) for u in reply.usage] == [("m", 1)]
    stub.ForkSession(
        pb.ForkSessionRequest(parent_session_id="a.again", session_id="a.again-2"), metadata=ADMIN
    )
    stub.Append(pb.AppendRequest(session_id="a.again-2", events=more), metadata=ADMIN)
    reply = stub.GetUsage(tree, metadata=ADMIN)
    assert list(reply.descendant_session_ids) == ["a.again-2"]
    assert [(u.model, u.input_tokens) for u in reply.usage] == [("m", 8)]


def test_an_export_is_the_same_file_every_time(
    stub: pb_grpc.SessionLogServiceStub, server: RunningServer, tmp_path: Path
) -> None:
    """Exporting an unchanged session twice writes the same bytes: map and JSON object keys
    (labels, data, state_delta) come sorted (they came in the hash order of each process, so
    two exports, or an export and the export of its import, differed)."""
    keys = [f"k{i:02d}" for i in range(30)]
    event = user("x", metadata={key: i for i, key in enumerate(keys)}, type_=ASSISTANT)
    event.data["tool_calls"] = [{key: i for i, key in enumerate(keys)}]
    event.state_delta.update({key: {"inner": keys} for key in keys})
    labels = dict.fromkeys(keys, "v")
    create = pb.CreateSessionRequest(session_id="a.exp", labels=labels, events=[event])
    stub.CreateSession(create, metadata=ADMIN)
    token = ADMIN[0][1].removeprefix("Bearer ")
    args = ["export", "a.exp", "--server", server.address, "--token", token]
    exports = {run_cli(args, tmp_path).stdout for _ in range(3)}
    assert len(exports) == 1, exports
    openai = {run_cli([*args, "--format", "openai"], tmp_path).stdout for _ in range(3)}
    assert len(openai) == 1, openai
    (message,) = json.loads(openai.pop())
    assert list(message["tool_calls"][0]) == keys
    header, line = exports.pop().splitlines()
    assert list(json.loads(header)["session"]["labels"]) == keys
    assert list(json.loads(line)["data"]) == ["content", "metadata", "tool_calls"]
    assert list(json.loads(line)["data"]["metadata"]) == keys
    assert list(json.loads(line)["state_delta"]) == keys


@pytest.mark.parametrize(
    "args",
    [
        ["state", "a.neg", "--at-seq", "-1"],
        ["usage", "a.neg", "--at-seq", "-1"],
        ["messages", "a.neg", "--at-seq", "-1"],
        ["surface", "a.neg", "--at-seq", "-1"],
        ["fork", "a.neg", "--at-seq", "-1"],
        ["create", "a.neg-child", "--parent", "a.neg", "--parent-seq", "-1"],
        ["tail", "a.neg", "--last", "-3", "--no-follow"],
        ["tail", "a.neg", "--from-seq", "-1", "--no-follow"],
        ["append", "a.neg", "user_message", "--content", "x", "--expected-seq", "-1"],
        ["items", "a.neg", "--last", "-1"],
        ["admin", "lease-audit", "--page-size", "-1"],
    ],
)
def test_the_cli_refuses_a_negative_seq_or_count(
    stub: pb_grpc.SessionLogServiceStub, server: RunningServer, args: list[str]
) -> None:
    """A negative --at-seq, --parent-seq, --last, --from-seq, --expected-seq or --page-size is a
    usage error (exit 2, one line), changing nothing (it was a traceback, or for tail --last a
    silent empty success)."""
    stub.Append(pb.AppendRequest(session_id="a.neg", events=[user("x")]), metadata=ADMIN)
    before = stub.GetSession(pb.GetSessionRequest(session_id="a.neg"), metadata=ADMIN).session
    token = ADMIN[0][1].removeprefix("Bearer ")
    result = run_cli_here([*args, "--server", server.address, "--token", token])
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert "0 or more" in result.stderr, result.stderr
    after = stub.GetSession(pb.GetSessionRequest(session_id="a.neg"), metadata=ADMIN).session
    assert after.event_count == before.event_count


def test_erasing_by_owner_reaches_the_forks_and_sub_agents_of_the_owners_sessions(
    stub: pb_grpc.SessionLogServiceStub, server: RunningServer
) -> None:
    """A fork or a sub-agent child of a session with an owner takes that owner (unless it names
    its own), so EraseSessions by owner erases them too: a fork kept a copy of the erased
    user's events, owned by no one."""
    create = pb.CreateSessionRequest(session_id="a.own", owner="user-9", events=[user("secret")])
    stub.CreateSession(create, metadata=ADMIN)
    fork = pb.ForkSessionRequest(parent_session_id="a.own", session_id="a.own-fork")
    assert stub.ForkSession(fork, metadata=ADMIN).session.session_id == "a.own-fork"
    child = pb.CreateSessionRequest(session_id="a.own-sub", parent_session_id="a.own")
    assert stub.CreateSession(child, metadata=ADMIN).session.owner == "user-9"
    other = pb.CreateSessionRequest(
        session_id="a.own-other", parent_session_id="a.own", owner="someone-else"
    )
    assert stub.CreateSession(other, metadata=ADMIN).session.owner == "someone-else"
    listed = stub.ListSessions(pb.ListSessionsRequest(filter='owner = "user-9"'), metadata=ADMIN)
    assert [s.session_id for s in listed.sessions] == ["a.own", "a.own-fork", "a.own-sub"]
    admin = apb_grpc.AdminServiceStub(server.channel())  # type: ignore[no-untyped-call]
    erased = admin.EraseSessions(
        apb.EraseSessionsRequest(filter='owner = "user-9"'), metadata=ADMIN
    )
    assert erased.session_count == 3
    for gone in ("a.own", "a.own-fork", "a.own-sub"):
        read = stub.GetSession(pb.GetSessionRequest(session_id=gone), metadata=ADMIN)
        assert not read.session.exists, gone
    kept = stub.GetSession(pb.GetSessionRequest(session_id="a.own-other"), metadata=ADMIN)
    assert kept.session.owner == "someone-else"


def test_a_tenant_cannot_import_a_session_under_another_tenants_parent(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """ImportSession with a parent_session_id outside the token's prefix is PERMISSION_DENIED and
    writes nothing, as CreateSession's parent is (it hung the import under tenant b's session:
    listed as its child, its usage summed into b's tree)."""
    stub.Append(pb.AppendRequest(session_id="b.victim", events=[user("b's")]), metadata=TENANT_B)
    event = spent(user("planted"), "m", 1_000_000)
    event.time.FromSeconds(1_700_000_000)
    planted = pb.ImportSessionRequest(
        session_id="a.planted", first_seq=0, events=[event], parent_session_id="b.victim"
    )
    refused = failure(stub.ImportSession, planted, metadata=TENANT_A)
    check(refused, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    read = stub.GetSession(pb.GetSessionRequest(session_id="a.planted"), metadata=TENANT_A)
    assert not read.session.exists
    tree = pb.GetUsageRequest(session_id="b.victim", include_descendants=True)
    assert list(stub.GetUsage(tree, metadata=ADMIN).descendant_session_ids) == []
    planted.parent_session_id = "a.planted-parent"
    stub.Append(pb.AppendRequest(session_id="a.planted-parent", events=[user()]), metadata=TENANT_A)
    assert stub.ImportSession(planted, metadata=TENANT_A).imported_count == 1


def test_a_page_token_does_not_carry_over_to_a_new_session_of_the_same_id(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """A ListEvents or DeriveMessages token taken before DeleteSession is INVALID_PAGE_TOKEN on
    a session written again under that id (it went on paging the new log, pinned to the old
    one's length: another conversation's events and messages as the older pages)."""
    old = [user(f"old {i}") for i in range(6)]
    stub.Append(pb.AppendRequest(session_id="a.reborn", events=old), metadata=ADMIN)
    messages = pb.DeriveMessagesRequest(session_id="a.reborn", page_size=2)
    derive_token = stub.DeriveMessages(messages, metadata=ADMIN).next_page_token
    events = pb.ListEventsRequest(session_id="a.reborn", page_size=2, order_by="seq desc")
    desc_token = stub.ListEvents(events, metadata=ADMIN).next_page_token
    ascending = pb.ListEventsRequest(session_id="a.reborn", page_size=2)
    asc_token = stub.ListEvents(ascending, metadata=ADMIN).next_page_token
    assert all((derive_token, desc_token, asc_token))
    assert (
        stub.ListEvents(
            pb.ListEventsRequest(session_id="a.reborn", page_size=2, page_token=asc_token),
            metadata=ADMIN,
        )
        .events[0]
        .seq
        == 2
    )  # the same incarnation continues
    stub.DeleteSession(pb.DeleteSessionRequest(session_id="a.reborn"), metadata=ADMIN)
    new = [user(f"new {i}") for i in range(8)]
    stub.Append(pb.AppendRequest(session_id="a.reborn", events=new), metadata=ADMIN)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    messages.page_token = derive_token
    check(failure(stub.DeriveMessages, messages, metadata=ADMIN), invalid, "INVALID_PAGE_TOKEN")
    events.page_token = desc_token
    check(failure(stub.ListEvents, events, metadata=ADMIN), invalid, "INVALID_PAGE_TOKEN")
    ascending.page_token = asc_token
    check(failure(stub.ListEvents, ascending, metadata=ADMIN), invalid, "INVALID_PAGE_TOKEN")


def test_a_redacted_event_keeps_its_usage(stub: pb_grpc.SessionLogServiceStub) -> None:
    """RedactEvents keeps an event's usage (the tokens were spent; no content in it), so every
    GetUsage at_seq and a fork after the redaction agree with the ledger's totals (the usage was
    erased from the event but not from the totals: at_seq folds missed it or subtracted too
    little, and a fork's totals lost it)."""
    events = [spent(user(f"m{i}"), "m", 10**i) for i in range(10)]
    stub.Append(pb.AppendRequest(session_id="a.red-use", events=events), metadata=ADMIN)
    redact = pb.RedactEventsRequest(session_id="a.red-use", seqs=[1, 8])
    stub.RedactEvents(redact, metadata=ADMIN)
    for at in range(10):
        asked = pb.GetUsageRequest(session_id="a.red-use", at_seq=at)
        reply = stub.GetUsage(asked, metadata=ADMIN)
        assert [u.input_tokens for u in reply.usage] == [int("1" * (at + 1))], at
    fork = pb.ForkSessionRequest(parent_session_id="a.red-use", session_id="a.red-use-f", at_seq=8)
    stub.ForkSession(fork, metadata=ADMIN)
    reply = stub.GetUsage(pb.GetUsageRequest(session_id="a.red-use-f"), metadata=ADMIN)
    assert [u.input_tokens for u in reply.usage] == [111_111_111]
    stored = [
        e
        for r in stub.Since(pb.SinceRequest(session_id="a.red-use"), metadata=ADMIN)
        for e in r.events
    ]
    assert stored[1].HasField("redacted")
    assert stored[1].usage.input_tokens == 10
    assert not stored[1].HasField("data")


def test_a_redaction_refused_by_a_lease_says_what_to_send(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """LEASE_HELD on RedactEvents or DeleteSession names the write, not just an append (its
    message told a caller redacting to "append with lease_holder")."""
    stub.Append(pb.AppendRequest(session_id="a.leased", events=[user()]), metadata=ADMIN)
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="a.leased", holder="w1"), metadata=ADMIN)
    redact = pb.RedactEventsRequest(session_id="a.leased", seqs=[0])
    refused = failure(stub.RedactEvents, redact, metadata=ADMIN)
    check(refused, grpc.StatusCode.FAILED_PRECONDITION, "LEASE_HELD", holder="w1")
    assert "a redaction" in refused.details(), refused.details()
    delete = pb.DeleteSessionRequest(session_id="a.leased")
    refused = failure(stub.DeleteSession, delete, metadata=ADMIN)
    check(refused, grpc.StatusCode.FAILED_PRECONDITION, "LEASE_HELD", holder="w1")
    assert "a delete" in refused.details(), refused.details()
