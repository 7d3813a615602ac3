"""GetState end to end: state deltas folded over gRPC, at a seq, after a fork, and refusals.

One server for the module; each test writes its own sessions.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import AsyncClient, Client, event, event_from_dict, event_to_dict
from tests.e2e._helpers import (
    TURN_END,
    TURN_START,
    append,
    check,
    ev,
    failure,
    get,
    replace,
    say,
)
from tests.e2e._proc import run_cli_here, running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("state") / "data") as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.SessionLogServiceStub:
    return server.stub()


def delta(event: event_pb2.Event, changes: dict[str, Any]) -> event_pb2.Event:
    event.state_delta.update(changes)
    return event


def state(stub: Any, session_id: str, at_seq: int | None = None) -> tuple[dict[str, Any], int]:
    request = pb.GetStateRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = at_seq
    reply = stub.GetState(request)
    return MessageToDict(reply.state), reply.event_count


def test_deltas_merge_shallowly_and_null_deletes(stub: Any) -> None:
    """Each append's deltas fold in seq order; GetState sees every append at once (the memo is
    extended, never stale)."""
    append(stub, "merge", delta(say("hi"), {"user": "ann", "cart": {"apples": 1}}))
    assert state(stub, "merge") == ({"user": "ann", "cart": {"apples": 1}}, 1)
    append(stub, "merge", delta(ev(TURN_START), {"cart": {"pears": 2}, "step": 1}))
    assert state(stub, "merge") == ({"user": "ann", "cart": {"pears": 2}, "step": 1}, 2)
    append(stub, "merge", say("no delta"), delta(ev(TURN_END), {"user": None, "step": 2}))
    assert state(stub, "merge") == ({"cart": {"pears": 2}, "step": 2}, 4)


def test_at_seq_reads_the_state_of_a_prefix(stub: Any) -> None:
    """at_seq folds events 0..at_seq; past the end is BOUNDARY_OUT_OF_RANGE."""
    append(stub, "prefix", *[delta(say(str(i)), {"n": i}) for i in range(5)])
    assert state(stub, "prefix", 0) == ({"n": 0}, 1)
    assert state(stub, "prefix", 3) == ({"n": 3}, 4)
    assert state(stub, "prefix") == ({"n": 4}, 5)
    check(failure(state, stub, "prefix", 5), INVALID, "BOUNDARY_OUT_OF_RANGE")


def test_an_unknown_session_has_an_empty_state(stub: Any) -> None:
    assert state(stub, "never-written") == ({}, 0)
    check(failure(state, stub, "bad id!"), INVALID, "INVALID_SESSION_ID")


def test_a_replace_does_not_undo_state(stub: Any) -> None:
    """Shadowed events keep their deltas: the surface changes, the state does not go back."""
    append(stub, "shadow", delta(say("a"), {"a": 1}), delta(say("b"), {"b": 2}))
    append(stub, "shadow", delta(replace(0, 1, "summary"), {"c": 3}))
    assert len(stub.Surface(pb.SurfaceRequest(session_id="shadow")).events) == 1
    assert state(stub, "shadow") == ({"a": 1, "b": 2, "c": 3}, 3)


def test_a_fork_carries_the_state_up_to_its_cut(stub: Any) -> None:
    """A fork at seq n has the parent's state at n; the two then change apart."""
    append(stub, "parent", *[delta(say(str(i)), {"n": i, f"k{i}": i}) for i in range(4)])
    child = stub.ForkSession(
        pb.ForkSessionRequest(parent_session_id="parent", session_id="child", at_seq=1)
    ).session
    assert child.event_count == 2
    assert state(stub, "child") == ({"n": 1, "k0": 0, "k1": 1}, 2)
    append(stub, "child", delta(say("own"), {"n": None, "mine": True}))
    assert state(stub, "child") == ({"k0": 0, "k1": 1, "mine": True}, 3)
    assert state(stub, "parent")[0]["n"] == 3


def test_a_bad_delta_is_refused_and_changes_nothing(stub: Any) -> None:
    """A NaN in a state_delta fails the whole append with UNSERIALIZABLE_EVENT_DATA."""
    append(stub, "refused", delta(say("ok"), {"kept": True}))
    bad = delta(say("bad"), {"x": 1})
    bad.state_delta.fields["x"].number_value = math.nan
    error = failure(append, stub, "refused", say("fine"), bad)
    check(error, INVALID, "UNSERIALIZABLE_EVENT_DATA", index=1)
    assert get(stub, "refused").event_count == 1
    assert state(stub, "refused") == ({"kept": True}, 1)


# -- clients and CLI ------------------------------------------------------------------------------


def test_python_clients_write_deltas_and_read_state(server: RunningServer) -> None:
    """Client and AsyncClient: event(state_delta=...) appends, get_state reads (at_seq too)."""
    with Client(server.address) as client:
        client.append(
            "py",
            [
                event("user_message", {"content": "hi"}, state_delta={"user": "ann", "n": 1}),
                event_from_dict({"type": "turn_start", "state_delta": {"n": 2, "user": None}}),
            ],
        )
        assert client.get_state("py") == {"n": 2}
        assert client.get_state("py", at_seq=0) == {"user": "ann", "n": 1}
        assert client.get_state_with_count("py") == ({"n": 2}, 2)
        logged = [event_to_dict(e) for e in client.since("py")]
        assert logged[0]["state_delta"] == {"user": "ann", "n": 1}
        assert "state_delta" not in event_to_dict(event("user_message", {"content": "x"}))

    async def read_async() -> tuple[dict[str, Any], tuple[dict[str, Any], int]]:
        async with AsyncClient(server.address) as client:
            return await client.get_state("py", at_seq=1), await client.get_state_with_count("py")

    assert asyncio.run(read_async()) == ({"n": 2}, ({"n": 2}, 2))


def test_cli_prints_state(server: RunningServer) -> None:
    """`sessionlog state SESSION [--at-seq N]`, as text and --json; tail shows each delta."""
    with Client(server.address) as client:
        client.append(
            "cli",
            [
                event("user_message", {"content": "a"}, state_delta={"k": [1, "two"]}),
                event("user_message", {"content": "b"}, state_delta={"k": None, "j": 1}),
            ],
        )

    def ok(*args: str) -> str:
        result = run_cli_here([*args, "--server", server.address])
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert json.loads(ok("state", "cli")) == {"j": 1}
    assert json.loads(ok("state", "cli", "--at-seq", "0")) == {"k": [1, "two"]}
    assert json.loads(ok("state", "cli", "--json")) == {"state": {"j": 1}, "event_count": 2}
    tail = ok("tail", "cli", "--no-follow").splitlines()
    # A Struct is a map: its keys print in no fixed order, so compare the parsed delta.
    assert json.loads(tail[1].split("  state ", 1)[1]) == {"k": None, "j": 1}
    listed = ok("sessions", "--prefix", "cli", "--state").splitlines()
    assert listed[0].startswith("cli\t2 events")
    assert json.loads(listed[0].split("\tstate ", 1)[1]) == {"j": 1}
    assert "state" not in ok("sessions", "--prefix", "cli")
    refused = run_cli_here(["state", "cli", "--at-seq", "9", "--server", server.address])
    assert refused.returncode == 1
    assert "BOUNDARY_OUT_OF_RANGE" in refused.stderr


def test_list_sessions_full_view_carries_each_state(stub: Any, server: RunningServer) -> None:
    """ListSessions with SESSION_VIEW_FULL returns each session's state (as GetState would);
    the default view leaves it unset."""
    append(stub, "lsv.a", delta(say("hi"), {"user": "ann", "n": 1}))
    append(stub, "lsv.a", delta(say("more"), {"n": 2}))
    append(stub, "lsv.b", say("no state"))
    stub.CreateSession(pb.CreateSessionRequest(session_id="lsv.c"))
    full = stub.ListSessions(pb.ListSessionsRequest(prefix="lsv.", view=pb.SESSION_VIEW_FULL))
    got = {s.session_id: MessageToDict(s.state) for s in full.sessions}
    assert got == {"lsv.a": {"user": "ann", "n": 2.0}, "lsv.b": {}, "lsv.c": {}}
    assert got["lsv.a"] == state(stub, "lsv.a")[0]
    basic = stub.ListSessions(pb.ListSessionsRequest(prefix="lsv."))
    assert [s.HasField("state") for s in basic.sessions] == [False, False, False]
    by_update = stub.ListSessions(
        pb.ListSessionsRequest(
            prefix="lsv.", order_by="update_time desc", view=pb.SESSION_VIEW_FULL
        )
    )
    assert MessageToDict(by_update.sessions[-1].state) == {"user": "ann", "n": 2.0}
    with Client(server.address) as client:
        pages = list(client.list_sessions(prefix="lsv.a", with_state=True))
    assert [dict(s.state) for p in pages for s in p.sessions] == [{"user": "ann", "n": 2.0}]
