"""Append's title and uid fields end to end: the title set in the commit that writes the events
(one change-feed record), refused whole when it breaks the title rule; Session.uid, reported by
Append, GetSession and ListEvents, new for a session deleted and written again; expected_uid
refusing a write to another incarnation of the session with SESSION_UID_MISMATCH."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client, event
from sessionlog_client.errors import SessionUidMismatch
from tests.e2e._helpers import Stub, append, check, failure, get, say, stats
from tests.e2e._proc import run_cli_here, running_server

pytestmark = pytest.mark.workers

Ids = Callable[[str], str]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each test names its own sessions (``sid``)."""
    folder: Path = tmp_path_factory.mktemp("append-title")
    with running_server(folder / "data") as server:
        yield server


@pytest.fixture
def stub(running: RunningServer) -> Stub:
    return running.stub()


def position(running: RunningServer) -> int:
    with grpc.insecure_channel(running.address) as channel:
        return stats(channel).position


def test_title_is_set_in_the_commit_of_the_events(
    running: RunningServer, stub: Stub, sid: Ids
) -> None:
    """An append with a title writes its events and the title as one change-feed record."""
    name = sid("s")
    before = position(running)
    reply = append(stub, name, say("a"), say("b"), title="two so far")
    assert reply.next_seq == 2
    assert position(running) == before + 1
    session = get(stub, name)
    assert (session.title, session.event_count) == ("two so far", 2)
    append(stub, name, say("c"), title="three")
    assert get(stub, name).title == "three"


def test_title_leaves_the_other_fields_and_unset_leaves_the_title(stub: Stub, sid: Ids) -> None:
    """Labels set by UpdateSession survive an append's title; an append without one keeps it;
    the empty string clears it."""
    name = sid("s")
    append(stub, name, say("a"))
    stub.UpdateSession(
        pb.UpdateSessionRequest(session=pb.Session(session_id=name, labels={"team": "x"}))
    )
    append(stub, name, say("b"), title="kept")
    append(stub, name, say("c"))
    session = get(stub, name)
    assert (session.title, dict(session.labels)) == ("kept", {"team": "x"})
    append(stub, name, say("d"), title="")
    assert get(stub, name).title == ""


def test_no_events_or_a_replay_set_no_title(stub: Stub, sid: Ids) -> None:
    """An empty append and a replayed request id return as before and leave the title alone."""
    name = sid("s")
    first = append(stub, name, say("a"), request_id="r1", title="first")
    empty = append(stub, name, title="empty")
    assert empty.next_seq == 1
    again = append(stub, name, say("a"), request_id="r1", title="other")
    assert (again.next_seq, again.events[0].seq) == (first.next_seq, 0)
    assert get(stub, name).title == "first"


@pytest.mark.parametrize("title", ["x" * 1025, "line\nbreak"])
def test_a_bad_title_fails_the_append_whole(
    running: RunningServer, stub: Stub, sid: Ids, title: str
) -> None:
    """A title over 1024 bytes or with a control character: INVALID_SESSION_FIELD, nothing
    written (no event, no title, no feed record)."""
    name = sid("s")
    append(stub, name, say("a"), title="before")
    before = position(running)
    error = failure(append, stub, name, say("b"), title=title)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SESSION_FIELD", field="title")
    session = get(stub, name)
    assert (session.event_count, session.title) == (1, "before")
    assert position(running) == before


def test_uid_names_the_incarnation(stub: Stub, sid: Ids) -> None:
    """Append, GetSession and ListEvents report one uid while the session lives; deleted and
    written again, it has another; a session never written has none."""
    name = sid("s")
    assert get(stub, name).uid == ""
    first = append(stub, name, say("a")).session_uid
    assert first
    assert append(stub, name, say("b")).session_uid == first
    assert get(stub, name).uid == first
    assert stub.ListEvents(pb.ListEventsRequest(session_id=name)).session_uid == first
    stub.DeleteSession(pb.DeleteSessionRequest(session_id=name))
    second = append(stub, name, say("a")).session_uid
    assert second
    assert second != first
    assert get(stub, name).uid == second


def test_expected_uid_refuses_another_incarnation(
    running: RunningServer, stub: Stub, sid: Ids
) -> None:
    """expected_uid of a deleted session's earlier life fails with SESSION_UID_MISMATCH even
    where expected_seq matches, writes nothing; the current uid passes."""
    name = sid("s")
    old = append(stub, name, say("a")).session_uid
    stub.DeleteSession(pb.DeleteSessionRequest(session_id=name))
    new = append(stub, name, say("b"), title="new").session_uid
    before = position(running)
    error = failure(append, stub, name, say("c"), expected_seq=1, expected_uid=old, title="t")
    check(error, grpc.StatusCode.ABORTED, "SESSION_UID_MISMATCH", uid=new)
    session = get(stub, name)
    assert (session.event_count, session.title) == (1, "new")
    assert position(running) == before
    reply = append(stub, name, say("c"), expected_seq=1, expected_uid=new)
    assert (reply.next_seq, reply.session_uid) == (2, new)


def test_expected_uid_of_a_session_never_written_fails(stub: Stub, sid: Ids) -> None:
    """A session that does not exist has no uid: an expected_uid refuses the append, which
    creates nothing."""
    name = sid("s")
    error = failure(append, stub, name, say("a"), expected_uid="0123abcd")
    check(error, grpc.StatusCode.ABORTED, "SESSION_UID_MISMATCH", uid="")
    assert not get(stub, name).exists


def test_the_cli_appends_with_a_title_and_an_expected_uid(
    running: RunningServer, stub: Stub, sid: Ids
) -> None:
    """`sessionlog append --title` sets the title; `--expected-uid` of another session fails
    with SESSION_UID_MISMATCH and writes nothing."""
    name = sid("s")
    server = ["--server", running.address]
    done = run_cli_here(
        ["append", name, "user_message", "--content", "hi", "--title", "T", *server]
    )
    assert done.returncode == 0, done.stderr
    session = get(stub, name)
    assert (session.title, session.event_count) == ("T", 1)
    uid = session.uid
    ok = ["append", name, "user_message", "--content", "again", "--expected-uid", uid, *server]
    assert run_cli_here(ok).returncode == 0
    refused = run_cli_here([*ok[:-4], "--expected-uid", "not-it", *server])
    assert refused.returncode == 1
    assert "SESSION_UID_MISMATCH" in refused.stderr
    assert get(stub, name).event_count == 2


def test_the_python_clients_send_title_and_expected_uid(running: RunningServer, sid: Ids) -> None:
    """Client and AsyncClient: ``append(title=, expected_uid=)`` and ``hide(expected_uid=)``;
    a stale uid raises SessionUidMismatch; ``session_uid`` in the reply, ``uid`` on the session."""
    name, other = sid("sync"), sid("async")
    with Client(running.address) as client:
        reply = client.append(name, [event("user_message", {"content": "a"})], title="sync")
        assert client.get_session(name).session.title == "sync"
        assert client.get_session(name).session.uid == reply.session_uid
        with pytest.raises(SessionUidMismatch):
            client.hide(name, 0, 0, expected_uid="stale")
        client.hide(name, 0, 0, expected_uid=reply.session_uid)

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            reply = await client.append(other, [event("user_message", {"content": "a"})])
            with pytest.raises(SessionUidMismatch):
                await client.append(
                    other, [event("user_message", {"content": "b"})], expected_uid="x"
                )
            done = await client.append(
                other,
                [event("user_message", {"content": "b"})],
                expected_uid=reply.session_uid,
                title="async",
            )
            assert done.next_seq == 2
            assert (await client.get_session(other)).session.title == "async"

    asyncio.run(run())
