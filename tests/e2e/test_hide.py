"""EVENT_TYPE_HIDE end to end: hiding a range over gRPC, kept in the log, honoured by fork and
at_seq, refused with INVALID_SURFACE_OP when it names no range; the clients' hide, pop_last and
clear."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client, event, event_type, struct_to_dict
from sessionlog_client import Event as ClientEvent
from tests.e2e._helpers import (
    ASSISTANT,
    SYSTEM,
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
from tests.e2e._proc import run_cli_here, running_server
from tests.e2e._web import get as http_get

HIDE = event_pb2.EventType.EVENT_TYPE_HIDE
_ids = count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module, with the web console (each test writes its own sessions)."""
    folder: Path = tmp_path_factory.mktemp("hide")
    with running_server(folder / "data", http_listen="127.0.0.1:0") as server:
        yield server


@pytest.fixture
def stub(running: RunningServer) -> Stub:
    return running.stub()


@pytest.fixture
def sid() -> str:
    return f"hide-{next(_ids)}"


def hide(start: int, stop: int, **data: object) -> event_pb2.Event:
    made = ev(HIDE, **data)
    made.surface_op.replace.start_seq = start
    made.surface_op.replace.stop_seq = stop
    return made


def contents(stub: Stub, session_id: str, at_seq: int | None = None) -> list[str]:
    request = pb.DeriveMessagesRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = at_seq
    return [m.content for m in stub.DeriveMessages(request).messages]


def surface_seqs(stub: Stub, session_id: str, at_seq: int | None = None) -> list[int]:
    request = pb.SurfaceRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = at_seq
    return [e.seq for e in stub.Surface(request).events]


def test_hide_removes_a_range_from_the_view_and_keeps_the_history(stub: Stub, sid: str) -> None:
    """sys, a, b, c, hide(1, 2) -> messages [sys, c]; Since still returns all five events."""
    append(stub, sid, say("sys", SYSTEM), say("a"), say("b", ASSISTANT), say("c"))
    reply = append(stub, sid, hide(1, 2, reason="undo"))
    assert reply.next_seq == 5
    assert reply.events[0].type == HIDE
    assert contents(stub, sid) == ["sys", "c"]
    assert surface_seqs(stub, sid) == [0, 3]
    stored = log(stub, sid)
    assert [e.type for e in stored][-1] == HIDE
    assert len(stored) == 5
    assert stored[4].data["reason"] == "undo"


def test_hide_bumps_replace_generation_and_breaks_an_increment(stub: Stub, sid: str) -> None:
    """A caller holding (event_count, replace_generation) gets a full list after a hide."""
    append(stub, sid, say("a"), say("b"))
    first = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=sid))
    assert first.replace_generation == 0
    append(stub, sid, hide(1, 1))
    after = stub.DeriveMessages(
        pb.DeriveMessagesRequest(
            session_id=sid,
            known_event_count=first.event_count,
            known_replace_generation=first.replace_generation,
        )
    )
    assert not after.incremental
    assert [m.content for m in after.messages] == ["a"]
    assert (after.event_count, after.replace_generation) == (3, 1)
    assert get(stub, sid).replace_generation == 1


def test_at_seq_before_the_hide_shows_what_it_hid(stub: Stub, sid: str) -> None:
    """Viewing the log as of the seq just before the hide shows the hidden messages."""
    append(stub, sid, say("a"), say("b"), say("c"), hide(0, 1), say("d"))
    assert contents(stub, sid) == ["c", "d"]
    assert contents(stub, sid, at_seq=2) == ["a", "b", "c"]
    assert contents(stub, sid, at_seq=3) == ["c"]
    assert surface_seqs(stub, sid, at_seq=2) == [0, 1, 2]


def test_fork_honours_a_hide_and_a_fork_before_it_does_not_see_it(stub: Stub, sid: str) -> None:
    """A child forked after the hide keeps it hidden; one forked before shows everything."""
    append(stub, sid, say("a"), say("b"), hide(1, 1), say("c"))
    after = stub.ForkSession(pb.ForkSessionRequest(parent_session_id=sid, at_seq=3)).session
    before = stub.ForkSession(pb.ForkSessionRequest(parent_session_id=sid, at_seq=1)).session
    assert contents(stub, after.session_id) == ["a", "c"]
    assert after.replace_generation == 1
    assert contents(stub, before.session_id) == ["a", "b"]
    assert before.replace_generation == 0
    assert contents(stub, sid) == ["a", "c"]


def test_clear_hides_everything_and_later_messages_show(stub: Stub, sid: str) -> None:
    """hide(0, last) empties the view; a message appended after it is the whole view."""
    append(stub, sid, say("a"), say("b"), replace(0, 1, "sum"))
    append(stub, sid, hide(0, 2))
    assert contents(stub, sid) == []
    append(stub, sid, say("fresh"))
    assert contents(stub, sid) == ["fresh"]


def test_pop_under_expected_seq_refuses_a_stale_pop(stub: Stub, sid: str) -> None:
    """Two clients pop the same newest message with expected_seq: the second gets SEQ_CONFLICT
    and the view lost exactly one message."""
    append(stub, sid, say("a"), say("b"))
    append(stub, sid, hide(1, 1), expected_seq=2)
    error = failure(append, stub, sid, hide(1, 1), expected_seq=2)
    check(error, grpc.StatusCode.ABORTED, "SEQ_CONFLICT")
    assert contents(stub, sid) == ["a"]


@pytest.mark.parametrize(
    "made", [ev(HIDE), hide(2, 1), hide(9, 9)], ids=["no-range", "start-after-stop", "future"]
)
def test_a_bad_hide_is_refused_and_writes_nothing(
    stub: Stub, sid: str, made: event_pb2.Event
) -> None:
    """A hide with no range, a reversed range or a range in the future fails with
    INVALID_SURFACE_OP naming its index, and the log stays as it was."""
    append(stub, sid, say("a"), say("b"))
    error = failure(append, stub, sid, say("c"), made)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SURFACE_OP", index=1)
    assert len(log(stub, sid)) == 2


def test_a_lenient_append_drops_a_bad_hide(stub: Stub, sid: str) -> None:
    """Lenient: the hide without a range is dropped and reported, the rest is written."""
    append(stub, sid, say("a"))
    reply = append(stub, sid, ev(HIDE), say("b"), lenient=True)
    assert [(d.index, d.reason) for d in reply.drops] == [(0, "INVALID_SURFACE_OP")]
    assert contents(stub, sid) == ["a", "b"]


# -- the Python client ------------------------------------------------------------------------


def msg(
    content: str, type_: str = "user_message", replace: tuple[int, int] | None = None
) -> ClientEvent:
    """A message event as a client user builds it."""
    return event(type_, {"content": content}, replace=replace)


def test_client_hide_pop_last_and_clear(running: RunningServer, sid: str) -> None:
    """Client.hide hides a range, pop_last returns the newest message with its seq (a summary
    included) until none is left, clear hides all so far."""
    with Client(running.address) as client:
        client.append(sid, [msg("a"), msg("b"), msg("c", "assistant_message"), msg("d")])
        assert client.hide(sid, 1, 1).next_seq == 5
        assert [m.content for m in client.derive_messages(sid).messages] == ["a", "c", "d"]
        popped = client.pop_last(sid)
        assert popped is not None
        assert (popped.seq, popped.message.content) == (3, "d")
        client.append(sid, [msg("sum", replace=(0, 2))])  # seq 6, stands at position 0
        popped = client.pop_last(sid)
        assert popped is not None
        assert (popped.seq, popped.message.content) == (6, "sum")
        assert client.pop_last(sid) is None  # a, c hidden by the summary; the summary popped
        stored = list(client.since(sid))
        reasons = [
            struct_to_dict(e.data).get("reason") for e in stored if e.type == event_type("hide")
        ]
        assert reasons == [None, "pop_last", "pop_last"]
        client.append(sid, [msg("e"), msg("f")])
        assert client.clear(sid) is not None
        assert list(client.derive_messages(sid).messages) == []
        assert client.clear("never-written") is None
        assert client.pop_last("never-written") is None
        assert not get(running.stub(), "never-written").exists


def test_concurrent_pops_each_take_one_message(running: RunningServer, sid: str) -> None:
    """Eight threads pop from eight messages at once: each gets a different one, none is
    taken twice, and the view ends empty."""
    with Client(running.address) as client:
        client.append(sid, [msg(str(i)) for i in range(8)])
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: client.pop_last(sid), range(8)))
        assert sorted(r.seq for r in results if r is not None) == list(range(8))
        assert client.pop_last(sid) is None
        assert client.surface(sid).event_count == 16


def test_async_client_hide_pop_last_and_clear(running: RunningServer, sid: str) -> None:
    """AsyncClient has the same three helpers."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            await client.append(sid, [msg("a"), msg("b"), msg("c")])
            await client.hide(sid, 0, 0)
            popped = await client.pop_last(sid)
            assert popped is not None
            assert (popped.seq, popped.message.content) == (2, "c")
            assert await client.clear(sid) is not None
            assert await client.pop_last(sid) is None
            assert (await client.derive_messages(sid)).event_count == 6

    asyncio.run(run())


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_hide_and_the_history_shows_it(running: RunningServer, sid: str) -> None:
    """`sessionlog hide SESSION START STOP` hides the range; tail prints "hides A..B"."""
    with Client(running.address) as client:
        client.append(sid, [msg("a"), msg("b"), msg("c")])
    done = run_cli_here(["hide", sid, "0", "1", "--reason", "undo", "--server", running.address])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hid 0..1 at seq 3; next seq 4\n"
    shown = run_cli_here(["tail", sid, "--no-follow", "--server", running.address])
    assert shown.returncode == 0, shown.stderr
    last = shown.stdout.splitlines()[-1]
    assert last.split()[0] == "3"
    assert "hide hides 0..1" in last
    assert '"reason": "undo"' in last
    refused = run_cli_here(["hide", sid, "2", "1", "--server", running.address])
    assert refused.returncode == 1
    assert "INVALID_SURFACE_OP" in refused.stderr
    with Client(running.address) as client:
        assert [m.content for m in client.derive_messages(sid).messages] == ["c"]


# -- the web console ----------------------------------------------------------------------------


def test_web_console_lists_the_hide_with_its_range(running: RunningServer, sid: str) -> None:
    """/events shows the hide (type "hide", its range, not a surface event) and marks the
    events it hides shadowed; /transcript leaves them out."""
    append(running.stub(), sid, say("a"), say("b"), hide(0, 0))
    base = f"http://127.0.0.1:{running.http_port}/api/sessions/{sid}"
    status, _, body = http_get(f"{base}/events")
    assert status == 200
    events = body["events"]
    assert (events[2]["type"], events[2]["replace"], events[2]["surface"]) == (
        "hide",
        [0, 0],
        False,
    )
    assert [e["seq"] for e in events if e.get("shadowed")] == [0]
    status, _, shown = http_get(f"{base}/transcript")
    assert status == 200
    assert [m["seq"] for m in shown["messages"]] == [1]
