"""CreateSession, SeedSession, GetSession, ListSessions and at_seq views, end to end over gRPC.

Every refused call is checked for its code, its one ErrorInfo reason, and that it changed
nothing: the session's log, its description and the session list read as before.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from sessionlog.testing import error_info
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import (
    ASSISTANT,
    STEP_START,
    SYSTEM,
    TOOL_CALL,
    TOOL_RESULT,
    USER,
    Stub,
    append,
    check,
    ev,
    failure,
    get,
    log,
    replace,
    say,
)

Role = message_pb2.Role

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXISTS = grpc.StatusCode.ALREADY_EXISTS


# -- helpers ------------------------------------------------------------------------------------


def ts(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def create(stub: Stub, session_id: str, *events: event_pb2.Event) -> pb.CreateSessionResponse:
    reply: pb.CreateSessionResponse = stub.CreateSession(
        pb.CreateSessionRequest(session_id=session_id, events=events)
    )
    return reply


def listed(stub: Stub, prefix: str = "") -> list[str]:
    """Every session id, following page tokens (bounded)."""
    ids: list[str] = []
    token = ""
    for _ in range(100):
        page = stub.ListSessions(pb.ListSessionsRequest(page_token=token, prefix=prefix))
        ids.extend(s.session_id for s in page.sessions)
        token = page.next_page_token
        if not token:
            return ids
    raise AssertionError("ListSessions never reached its last page")


def snapshot(stub: Stub, session_id: str) -> tuple[list[bytes], bytes, list[str]]:
    """What a client can see of a session and of the session list, as comparable values."""
    events = [e.SerializeToString() for e in log(stub, session_id)]
    return events, get(stub, session_id).SerializeToString(), listed(stub)


def ns(stamp: timestamp_pb2.Timestamp) -> int:
    value: int = stamp.ToNanoseconds()
    return value


def message(role: int, created_at: timestamp_pb2.Timestamp, **fields: Any) -> message_pb2.Message:
    made = message_pb2.Message(role=role, created_at=created_at)  # type: ignore[arg-type]
    for key, value in fields.items():
        if key == "metadata":
            made.metadata.SetInParent()
            made.metadata.update(value)
        elif key == "tool_calls":
            for call in value:
                made.tool_calls.add().update(call)
        else:
            setattr(made, key, value)
    return made


# -- CreateSession ------------------------------------------------------------------------------


def test_create_writes_initial_events(stub: Stub) -> None:
    """CreateSession stores its events from seq 0 and describes the new session."""
    before = time.time_ns()
    reply = create(stub, "s", say("hi"), ev(STEP_START), say("hello", ASSISTANT))
    after = time.time_ns()
    assert [e.seq for e in reply.events] == [0, 1, 2]
    assert list(reply.events) == log(stub, "s")
    session = reply.session
    assert (session.session_id, session.exists, session.event_count) == ("s", True, 3)
    assert before <= ns(session.create_time) <= after
    assert session == get(stub, "s")


@pytest.mark.parametrize("made_by", ["create", "create-empty", "append", "seed", "fork"])
def test_create_refuses_an_existing_session(stub: Stub, made_by: str) -> None:
    """However a session came to exist, CreateSession refuses it and leaves it unchanged."""
    if made_by == "create":
        create(stub, "s", say("first"))
    elif made_by == "create-empty":
        create(stub, "s")
    elif made_by == "append":
        append(stub, "s", say("first"))
    elif made_by == "seed":
        stub.SeedSession(
            pb.SeedSessionRequest(session_id="s", messages=[message(Role.ROLE_USER, ts(1))])
        )
    else:
        append(stub, "parent", say("first"))
        stub.ForkSession(pb.ForkSessionRequest(parent_session_id="parent", session_id="s"))
    before = snapshot(stub, "s")
    error = failure(create, stub, "s", say("second"))
    check(error, EXISTS, "SESSION_ALREADY_EXISTS", session_id="s")
    assert snapshot(stub, "s") == before


NAN = float("nan")


def _future_replace() -> event_pb2.Event:
    return replace(5, 6, "too early")


def _with_seq() -> event_pb2.Event:
    made = say("mine")
    made.seq = 7
    return made


def _op_on_bookkeeping() -> event_pb2.Event:
    made = ev(STEP_START)
    made.surface_op.append.SetInParent()
    return made


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda: ev(0, content="x"), "UNKNOWN_EVENT_TYPE"),
        (lambda: ev(42, content="x"), "UNKNOWN_EVENT_TYPE"),
        (_op_on_bookkeeping, "SURFACE_OP_ON_NON_SURFACE_EVENT"),
        (_future_replace, "INVALID_SURFACE_OP"),
        (lambda: ev(USER, score=NAN), "UNSERIALIZABLE_EVENT_DATA"),
        (lambda: ev(USER, content=3), "INVALID_MESSAGE_FIELD"),
        (lambda: ev(USER, content="x" * (1 << 20)), "EVENT_TOO_LARGE"),
        (_with_seq, "SEQ_ASSIGNED_BY_SERVER"),
    ],
)
def test_create_validates_like_append(stub: Stub, bad: Any, reason: str) -> None:
    """An invalid event fails CreateSession with its reason and index; no session is created."""
    append(stub, "other", say("unrelated"))
    before = snapshot(stub, "s")
    error = failure(create, stub, "s", say("ok"), bad(), say("ok too"))
    check(error, INVALID, reason, index=1)
    assert snapshot(stub, "s") == before
    assert not get(stub, "s").exists
    assert listed(stub) == ["other"]
    assert [e.seq for e in create(stub, "s", say("again")).events] == [0]


@pytest.mark.parametrize("session_id", ["", "-lead", "has space", "a/b", "x" * 236])
def test_create_refuses_an_invalid_session_id(stub: Stub, session_id: str) -> None:
    """CreateSession checks the session id before anything else."""
    error = failure(create, stub, session_id, ev(0))
    check(error, INVALID, "INVALID_SESSION_ID")
    assert listed(stub) == []


def test_create_with_no_events_makes_an_empty_session(stub: Stub) -> None:
    """CreateSession with no events creates a session that exists with no events."""
    reply = create(stub, "empty")
    assert list(reply.events) == []
    assert (reply.session.exists, reply.session.event_count) == (True, 0)
    session = get(stub, "empty")
    assert (session.exists, session.event_count) == (True, 0)
    assert session.HasField("create_time")
    assert listed(stub) == ["empty"]
    assert log(stub, "empty") == []
    check(failure(create, stub, "empty"), EXISTS, "SESSION_ALREADY_EXISTS")
    assert [e.seq for e in append(stub, "empty", say("first")).events] == [0]


def test_concurrent_creates_have_one_winner(stub: Stub) -> None:
    """Eight racing CreateSession calls for one id: one wins, the rest see ALREADY_EXISTS."""
    workers = 8
    barrier = threading.Barrier(workers)
    outcomes: dict[int, Any] = {}

    def racer(n: int) -> None:
        barrier.wait(10)
        try:
            outcomes[n] = create(stub, "race", say(f"from {n}"), say(f"and {n}", ASSISTANT))
        except grpc.RpcError as error:
            outcomes[n] = error

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(outcomes) == workers
    winners = [n for n, o in outcomes.items() if isinstance(o, pb.CreateSessionResponse)]
    assert len(winners) == 1, outcomes
    for n, outcome in outcomes.items():
        if n != winners[0]:
            check(outcome, EXISTS, "SESSION_ALREADY_EXISTS")
    stored = log(stub, "race")
    assert stored == list(outcomes[winners[0]].events)
    assert [e.data["content"] for e in stored] == [f"from {winners[0]}", f"and {winners[0]}"]


# -- SeedSession --------------------------------------------------------------------------------


def _conversation() -> list[message_pb2.Message]:
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]
    return [
        message(Role.ROLE_SYSTEM, ts(1_700_000_000, 123_456_000), content="be brief", name="rules"),
        message(Role.ROLE_USER, ts(1_700_000_001, 123_456_789), content=""),
        message(Role.ROLE_USER, ts(1_700_000_001, 123_456_790)),
        message(
            Role.ROLE_ASSISTANT,
            ts(1_700_000_002, 1),
            reasoning_content="add them",
            tool_calls=calls,
        ),
        message(
            Role.ROLE_TOOL,
            ts(1_700_000_003, 999_999_999),
            content="42",
            tool_call_id="c1",
            name="add",
            metadata={"content_parts": [{"type": "text", "text": "42"}], "ok": True, "n": None},
        ),
        message(Role.ROLE_ASSISTANT, ts(-86_400, 500), content="done", metadata={}),
        message(Role.ROLE_USER, ts(0), content="epoch"),
    ]


def test_seed_then_derive_returns_the_messages_exactly(stub: Stub) -> None:
    """Seeding then deriving gives back every message field for field, timestamps to the ns."""
    sent = _conversation()
    reply = stub.SeedSession(pb.SeedSessionRequest(session_id="s", messages=sent))
    assert list(reply.drops) == []
    assert (reply.session.exists, reply.session.event_count) == (True, len(sent))
    assert [e.time for e in reply.events] == [m.created_at for m in sent]
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="s"))
    assert list(derived.seqs) == list(range(len(sent)))
    for got, want in zip(derived.messages, sent, strict=True):
        assert got == want
        assert got.SerializeToString(deterministic=True) == want.SerializeToString(
            deterministic=True
        )
    assert derived.messages[1].HasField("content")
    assert not derived.messages[2].HasField("content")
    types = [e.type for e in log(stub, "s")]
    assert types == [SYSTEM, USER, USER, ASSISTANT, TOOL_RESULT, ASSISTANT, USER]


def test_seed_without_created_at_uses_the_server_now(stub: Stub) -> None:
    """A message with no created_at is stamped with the server's now."""
    before = time.time_ns()
    sent = message_pb2.Message(role=Role.ROLE_USER, content="now")
    stub.SeedSession(pb.SeedSessionRequest(session_id="s", messages=[sent]))
    after = time.time_ns()
    (got,) = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="s")).messages
    assert before <= ns(got.created_at) <= after
    assert got.content == "now"


def test_seed_drops_and_reports_unknown_roles(stub: Stub) -> None:
    """Messages of an unspecified or unknown role are dropped and reported; the rest are seeded."""
    sent = [
        message(Role.ROLE_SYSTEM, ts(10), content="sys"),
        message(Role.ROLE_UNSPECIFIED, ts(11), content="nobody"),
        message(Role.ROLE_USER, ts(12), content="hi"),
        message(77, ts(13), content="alien"),
        message(Role.ROLE_ASSISTANT, ts(14), content="hello"),
    ]
    reply = stub.SeedSession(pb.SeedSessionRequest(session_id="s", messages=sent))
    assert [(d.index, d.reason) for d in reply.drops] == [(1, "UNKNOWN_ROLE"), (3, "UNKNOWN_ROLE")]
    assert reply.session.event_count == 3
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="s"))
    assert list(derived.messages) == [sent[0], sent[2], sent[4]]
    assert list(derived.seqs) == [0, 1, 2]


def test_seed_refuses_an_existing_session(stub: Stub) -> None:
    """SeedSession, like CreateSession, never writes into a session that exists."""
    append(stub, "s", say("mine"))
    before = snapshot(stub, "s")
    request = pb.SeedSessionRequest(
        session_id="s", messages=[message(Role.ROLE_USER, ts(1), content="x")]
    )
    check(failure(stub.SeedSession, request), EXISTS, "SESSION_ALREADY_EXISTS", session_id="s")
    assert snapshot(stub, "s") == before


def test_seed_error_names_the_message_index(stub: Stub) -> None:
    """An unstorable message fails the seed, names its index among the messages sent, and writes
    nothing (a dropped message before it must not shift the index)."""
    bad = message(Role.ROLE_USER, ts(2), content="x", metadata={"score": math.inf})
    request = pb.SeedSessionRequest(
        session_id="s", messages=[message(Role.ROLE_UNSPECIFIED, ts(1)), bad]
    )
    error = failure(stub.SeedSession, request)
    check(error, INVALID, "UNSERIALIZABLE_EVENT_DATA")
    assert not get(stub, "s").exists
    assert error_info(error).metadata["index"] == "1"


# -- GetSession ---------------------------------------------------------------------------------


def test_get_never_written_session(stub: Stub) -> None:
    """A never-written session is described with exists = false, not an error."""
    session = get(stub, "ghost")
    assert session == pb.Session(session_id="ghost")


@pytest.mark.parametrize("session_id", ["", "bad id", ".dot", "x" * 236])
def test_get_invalid_session_id(stub: Stub, session_id: str) -> None:
    """GetSession refuses an invalid id with INVALID_SESSION_ID."""
    error = failure(stub.GetSession, pb.GetSessionRequest(session_id=session_id))
    check(error, INVALID, "INVALID_SESSION_ID")
    if session_id:
        assert session_id not in error.details()


def test_get_session_counts_and_times(stub: Stub) -> None:
    """event_count, replace_generation, create_time and last_append_time follow the log."""
    before = time.time_ns()
    append(stub, "s", say("a"), say("b"), say("c"))
    first = get(stub, "s")
    assert (first.exists, first.event_count, first.replace_generation) == (True, 3, 0)
    assert before <= ns(first.create_time) <= ns(first.last_append_time) <= time.time_ns()
    assert first.parent_session_id == ""
    assert first.parent_event_count == 0
    assert not first.HasField("lease")

    time.sleep(0.01)
    append(stub, "s", replace(0, 1, "sum-ab"))
    second = get(stub, "s")
    assert (second.event_count, second.replace_generation) == (4, 1)
    assert second.create_time == first.create_time
    assert ns(second.last_append_time) > ns(first.last_append_time)

    time.sleep(0.01)
    append(stub, "s", say("d"), replace(0, 4, "sum-all"), ev(STEP_START))
    third = get(stub, "s")
    assert (third.event_count, third.replace_generation) == (7, 2)
    assert third.create_time == first.create_time
    assert ns(third.last_append_time) > ns(second.last_append_time)

    append(stub, "s")
    assert get(stub, "s") == third


def test_get_session_of_a_fork_names_its_parent(stub: Stub) -> None:
    """A fork's description records the parent and how many events were copied."""
    append(stub, "parent", say("a"), say("b"), say("c"))
    stub.ForkSession(pb.ForkSessionRequest(parent_session_id="parent", at_seq=1, session_id="kid"))
    session = get(stub, "kid")
    assert (session.parent_session_id, session.parent_event_count) == ("parent", 2)
    assert session.event_count == 2
    assert get(stub, "parent").parent_session_id == ""


def test_get_session_shows_a_live_lease_only(stub: Stub) -> None:
    """The lease appears while it is live and is unset once it has expired."""
    append(stub, "s", say("a"))
    ttl = duration_pb2.Duration(seconds=1)  # outlasts a busy machine's hold-up between two calls
    granted = stub.AcquireLease(pb.AcquireLeaseRequest(session_id="s", holder="w1", ttl=ttl)).lease
    session = get(stub, "s")
    assert session.lease == granted
    assert (session.lease.holder, session.lease.token) == ("w1", 1)
    deadline = time.monotonic() + 5
    while get(stub, "s").HasField("lease") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not get(stub, "s").HasField("lease")
    assert time.time_ns() >= ns(granted.expire_time), "the lease vanished before it expired"
    assert get(stub, "s").event_count == 1


def test_get_session_shows_a_lease_taken_before_the_first_write(stub: Stub) -> None:
    """A lease may be taken on a never-written session: exists is false, the lease is shown."""
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="new", holder="w1"))
    session = get(stub, "new")
    assert not session.exists
    assert session.event_count == 0
    assert session.lease.holder == "w1"
    assert listed(stub) == []


# -- ListSessions -------------------------------------------------------------------------------


def _pages(stub: Stub, page_size: int, prefix: str = "") -> list[list[str]]:
    pages: list[list[str]] = []
    token = ""
    for _ in range(100):
        request = pb.ListSessionsRequest(page_size=page_size, page_token=token, prefix=prefix)
        page = stub.ListSessions(request)
        pages.append([s.session_id for s in page.sessions])
        token = page.next_page_token
        if not token:
            return pages
    raise AssertionError("ListSessions never reached its last page")


def test_list_pages_in_utf8_byte_order(stub: Stub) -> None:
    """Pages smaller than the listing walk every session once, in UTF-8 byte order."""
    ids = [f"s{n:02}" for n in (7, 3, 11, 0, 19, 5, 14, 1, 9, 16)]
    ids += ["Z", "z", "é", "_u", "0", "s1", "s1.a", "s1-b"]
    for n, session_id in enumerate(ids):
        append(stub, session_id, *(say(str(i)) for i in range(n % 3 + 1)))
    pages = _pages(stub, page_size=4)
    expected = sorted(ids, key=lambda s: s.encode())
    assert [len(p) for p in pages] == [4, 4, 4, 4, 2]
    assert [i for p in pages for i in p] == expected
    page = stub.ListSessions(pb.ListSessionsRequest(page_size=len(ids)))
    assert page.next_page_token == ""
    for session in page.sessions:
        n = ids.index(session.session_id)
        assert (session.exists, session.event_count) == (True, n % 3 + 1)
        assert session == get(stub, session.session_id)


def test_list_exact_multiple_of_the_page_size(stub: Stub) -> None:
    """When the last page is full, its next_page_token is already empty."""
    for n in range(6):
        append(stub, f"s{n}", say("x"))
    assert _pages(stub, page_size=3) == [["s0", "s1", "s2"], ["s3", "s4", "s5"]]


def test_list_is_stable_while_sessions_are_created(stub: Stub) -> None:
    """A page token survives writes: later ids appear, earlier ones are never repeated."""
    originals = [f"k{n:02}" for n in range(2, 14, 2)]
    for session_id in originals:
        append(stub, session_id, say("x"))
    seen: list[str] = []
    behind: list[str] = []
    ahead: list[str] = []
    token = ""
    for step in range(100):
        page = stub.ListSessions(pb.ListSessionsRequest(page_size=2, page_token=token))
        seen.extend(s.session_id for s in page.sessions)
        token = page.next_page_token
        if not token:
            break
        behind.append(f"k00.{step}")  # sorts before every cursor: must not show up
        ahead.append(f"{seen[-1]}.{step}")  # right after the cursor: must show up
        create(stub, behind[-1])
        create(stub, ahead[-1])
        append(stub, seen[0], say("written meanwhile"))
    assert not token
    assert len(seen) == len(set(seen))
    assert seen == sorted(originals + ahead, key=lambda s: s.encode())
    assert set(listed(stub)) == set(seen) | set(behind)


def test_list_prefix(stub: Stub) -> None:
    """A prefix keeps only the ids that start with it, paging within them."""
    for session_id in ["a", "ab", "ab.x", "abc", "abd", "ac", "b", "xab"]:
        append(stub, session_id, say("x"))
    assert _pages(stub, page_size=2, prefix="ab") == [["ab", "ab.x"], ["abc", "abd"]]
    assert listed(stub, prefix="abc") == ["abc"]
    assert listed(stub, prefix="zz") == []
    assert listed(stub, prefix="a") == ["a", "ab", "ab.x", "abc", "abd", "ac"]


def _token(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


@pytest.mark.parametrize(
    "token",
    ["not a token!", "####", "AAAA", _token({"a": 1}), _token(["s1"]), _token([1, ""]), "é"],
)
def test_list_bad_page_token(stub: Stub, token: str) -> None:
    """A page token that no ListSessions call produced is INVALID_ARGUMENT INVALID_PAGE_TOKEN."""
    append(stub, "s1", say("x"))
    error = failure(stub.ListSessions, pb.ListSessionsRequest(page_token=token))
    check(error, INVALID, "INVALID_PAGE_TOKEN", field="page_token")


def test_list_token_is_bound_to_its_prefix(stub: Stub) -> None:
    """A token from one prefix is refused under another."""
    for session_id in ["a1", "a2", "a3", "b1"]:
        append(stub, session_id, say("x"))
    token = stub.ListSessions(pb.ListSessionsRequest(page_size=1, prefix="a")).next_page_token
    assert token
    error = failure(stub.ListSessions, pb.ListSessionsRequest(page_token=token, prefix="b"))
    check(error, INVALID, "INVALID_PAGE_TOKEN")


def test_list_page_size_zero_means_a_hundred(stub: Stub) -> None:
    """page_size 0 pages by 100."""
    for n in range(101):
        create(stub, f"s{n:03}")
    first = stub.ListSessions(pb.ListSessionsRequest())
    assert len(first.sessions) == 100
    assert first.next_page_token
    rest = stub.ListSessions(pb.ListSessionsRequest(page_token=first.next_page_token))
    assert [s.session_id for s in rest.sessions] == ["s100"]
    assert rest.next_page_token == ""


def test_list_page_size_is_capped_at_a_thousand(stub: Stub) -> None:
    """A page_size above 1000 returns pages of 1000."""
    total = 1003

    def make(start: int) -> None:
        for n in range(start, total, 16):
            create(stub, f"s{n:04}")

    threads = [threading.Thread(target=make, args=(start,)) for start in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    first = stub.ListSessions(pb.ListSessionsRequest(page_size=5000))
    assert len(first.sessions) == 1000
    rest = stub.ListSessions(
        pb.ListSessionsRequest(page_size=5000, page_token=first.next_page_token)
    )
    assert [s.session_id for s in rest.sessions] == ["s1000", "s1001", "s1002"]
    assert rest.next_page_token == ""


def test_list_describes_sessions_like_get(stub: Stub) -> None:
    """Each listed session is described exactly as GetSession describes it, live lease included."""
    append(stub, "leased", say("a"))
    append(stub, "plain", say("b"), replace(0, 0, "c"))
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="leased", holder="w1"))
    page = stub.ListSessions(pb.ListSessionsRequest())
    assert [s.session_id for s in page.sessions] == ["leased", "plain"]
    for session in page.sessions:
        assert session == get(stub, session.session_id)
    assert page.sessions[0].lease.holder == "w1"


def test_list_empty_store(stub: Stub) -> None:
    """With no sessions, the one page is empty and the last."""
    page = stub.ListSessions(pb.ListSessionsRequest(page_size=5))
    assert list(page.sessions) == []
    assert page.next_page_token == ""


# -- views as of a seq --------------------------------------------------------------------------


def _history() -> list[event_pb2.Event]:
    events = [
        say("sys", SYSTEM),
        say("u1"),
        ev(STEP_START),
        say("a1", ASSISTANT),
        replace(1, 3, "sum-1-3"),
        ev(TOOL_CALL, name="grep"),
        ev(TOOL_RESULT, content="found", tool_call_id="c1"),
        replace(0, 0, "sys2"),
        say("u2"),
        replace(4, 6, "sum-4-6"),
        say("a2", ASSISTANT),
    ]
    for n, made in enumerate(events):
        made.time.CopyFrom(ts(1_700_000_000 + n, n * 1000 + 7))
    return events


def test_views_at_every_seq_equal_a_fresh_log(stub: Stub) -> None:
    """Surface and DeriveMessages at at_seq equal those of a log holding only events 0..at_seq."""
    events = _history()
    append(stub, "s", *events)
    for at in range(len(events)):
        fresh = f"fresh{at}"
        append(stub, fresh, *events[: at + 1])
        view = stub.Surface(pb.SurfaceRequest(session_id="s", at_seq=at))
        alone = stub.Surface(pb.SurfaceRequest(session_id=fresh))
        assert view.SerializeToString() == alone.SerializeToString(), at
        assert view.event_count == at + 1
        derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="s", at_seq=at))
        derived_alone = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=fresh))
        assert derived.SerializeToString() == derived_alone.SerializeToString(), at
    whole = stub.Surface(pb.SurfaceRequest(session_id="s"))
    last = stub.Surface(pb.SurfaceRequest(session_id="s", at_seq=len(events) - 1))
    assert whole == last
    assert [e.data["content"] for e in whole.events] == ["sys2", "sum-1-3", "sum-4-6", "u2", "a2"]


@pytest.mark.parametrize("at_seq", [3, 4, 1 << 40])
@pytest.mark.parametrize("rpc", ["Surface", "DeriveMessages"])
def test_view_past_the_end(stub: Stub, rpc: str, at_seq: int) -> None:
    """at_seq at or past the end fails with BOUNDARY_OUT_OF_RANGE and changes nothing."""
    append(stub, "s", say("a"), say("b"), say("c"))
    before = snapshot(stub, "s")
    request_type = pb.SurfaceRequest if rpc == "Surface" else pb.DeriveMessagesRequest
    error = failure(getattr(stub, rpc), request_type(session_id="s", at_seq=at_seq))
    check(error, INVALID, "BOUNDARY_OUT_OF_RANGE", at_seq=at_seq, next_seq=3)
    assert snapshot(stub, "s") == before
