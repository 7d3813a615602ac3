"""The usage ledger end to end: totals per model over gRPC, after a replace, a fork, at a seq,
on GetSession and ListSessions, and refusals.

One server for the module; each test writes its own sessions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import (
    AsyncClient,
    Client,
    errors,
    event,
    event_from_dict,
    event_to_dict,
    usage_to_dict,
)
from tests.e2e._helpers import (
    ASSISTANT,
    STEP_END,
    TURN_END,
    TURN_START,
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

INVALID = grpc.StatusCode.INVALID_ARGUMENT
Row = tuple[str, int, int, int, int, int]
"""A ModelUsage as (model, input, output, cached input, reasoning, event count)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("usage") / "data") as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.SessionLogServiceStub:
    return server.stub()


def spent(
    event: event_pb2.Event, model: str, i: int = 0, o: int = 0, c: int = 0, r: int = 0
) -> event_pb2.Event:
    event.usage.model = model
    event.usage.input_tokens, event.usage.output_tokens = i, o
    event.usage.cached_input_tokens, event.usage.reasoning_tokens = c, r
    return event


def answer(model: str, i: int, o: int = 0, **more: int) -> event_pb2.Event:
    return spent(say("answer", ASSISTANT), model, i, o, **more)


def rows(usages: Any) -> list[Row]:
    return [
        (
            u.model,
            u.input_tokens,
            u.output_tokens,
            u.cached_input_tokens,
            u.reasoning_tokens,
            u.event_count,
        )
        for u in usages
    ]


def usage(stub: Any, session_id: str, at_seq: int | None = None, **fields: Any) -> Any:
    request = pb.GetUsageRequest(session_id=session_id, **fields)
    if at_seq is not None:
        request.at_seq = at_seq
    return stub.GetUsage(request)


def totals(stub: Any, session_id: str, at_seq: int | None = None) -> list[Row]:
    return rows(usage(stub, session_id, at_seq).usage)


def test_totals_are_kept_per_model(stub: Any) -> None:
    """Every event's usage sums per model (any event type may carry one), in model order; the
    stored events keep their usage as sent."""
    append(stub, "models", say("q"), answer("gpt-5", 100, 20, c=60, r=8))
    append(stub, "models", spent(ev(STEP_END), "claude", 30, 3), answer("gpt-5", 50, 5))
    assert totals(stub, "models") == [
        ("claude", 30, 3, 0, 0, 1),
        ("gpt-5", 150, 25, 60, 8, 2),
    ]
    reply = usage(stub, "models")
    assert reply.event_count == 4
    assert rows(reply.own_usage) == rows(reply.usage)
    assert log(stub, "models")[1].usage.cached_input_tokens == 60


def test_get_session_and_list_sessions_carry_usage(stub: Any) -> None:
    """Session.usage holds the totals; a listing's page adds its sessions' usage per model."""
    append(stub, "page.a", answer("m1", 10, 1))
    append(stub, "page.b", answer("m1", 5, 2), answer("m2", 7))
    append(stub, "page.c", say("no usage"))
    assert rows(get(stub, "page.b").usage) == [("m1", 5, 2, 0, 0, 1), ("m2", 7, 0, 0, 0, 1)]
    assert rows(get(stub, "page.c").usage) == []
    listed = stub.ListSessions(pb.ListSessionsRequest(prefix="page."))
    assert [rows(s.usage) for s in listed.sessions] == [
        [("m1", 10, 1, 0, 0, 1)],
        [("m1", 5, 2, 0, 0, 1), ("m2", 7, 0, 0, 0, 1)],
        [],
    ]
    assert rows(listed.usage_total) == [("m1", 15, 3, 0, 0, 2), ("m2", 7, 0, 0, 0, 1)]
    first = stub.ListSessions(pb.ListSessionsRequest(prefix="page.", page_size=1))
    assert rows(first.usage_total) == [("m1", 10, 1, 0, 0, 1)]


def test_a_replace_or_hide_never_lowers_the_totals(stub: Any) -> None:
    """Compaction changes the surface, not what was spent: the summary's own usage adds."""
    append(stub, "compact", say("a"), answer("m", 100, 10), answer("m", 200, 20))
    before = totals(stub, "compact")
    summary = spent(replace(0, 2, "summary"), "m", 40, 4)
    append(stub, "compact", summary)
    hide = ev(event_pb2.EVENT_TYPE_HIDE)
    hide.surface_op.replace.start_seq, hide.surface_op.replace.stop_seq = 0, 0  # the summary
    append(stub, "compact", hide)
    assert len(stub.Surface(pb.SurfaceRequest(session_id="compact")).events) == 0
    assert before == [("m", 300, 30, 0, 0, 2)]
    assert totals(stub, "compact") == [("m", 340, 34, 0, 0, 3)]


def test_at_seq_gives_the_totals_of_a_prefix(stub: Any) -> None:
    """at_seq folds events 0..at_seq; past the end is BOUNDARY_OUT_OF_RANGE."""
    append(stub, "prefix", *[answer("m", 10 * (n + 1)) for n in range(4)])
    assert totals(stub, "prefix", 0) == [("m", 10, 0, 0, 0, 1)]
    assert totals(stub, "prefix", 2) == [("m", 60, 0, 0, 0, 3)]
    assert usage(stub, "prefix", 2).event_count == 3
    assert totals(stub, "prefix") == [("m", 100, 0, 0, 0, 4)]
    check(failure(usage, stub, "prefix", 4), INVALID, "BOUNDARY_OUT_OF_RANGE", next_seq=4)


def test_a_fork_counts_its_copies_but_a_tree_counts_them_once(stub: Any) -> None:
    """A child's totals include the copied events; its own_usage starts at parent_event_count;
    include_descendants adds each descendant's own part only."""
    append(stub, "root", answer("m", 100), answer("m", 200), answer("m", 400))
    fork = pb.ForkSessionRequest(parent_session_id="root", session_id="root.kid", at_seq=1)
    assert stub.ForkSession(fork).session.parent_event_count == 2
    assert totals(stub, "root.kid") == [("m", 300, 0, 0, 0, 2)]
    assert rows(usage(stub, "root.kid").own_usage) == []
    append(stub, "root.kid", answer("m", 7), answer("other", 1))
    kid = usage(stub, "root.kid")
    assert rows(kid.usage) == [("m", 307, 0, 0, 0, 3), ("other", 1, 0, 0, 0, 1)]
    assert rows(kid.own_usage) == [("m", 7, 0, 0, 0, 1), ("other", 1, 0, 0, 0, 1)]
    assert rows(usage(stub, "root.kid", 2).own_usage) == [("m", 7, 0, 0, 0, 1)]
    grandchild = pb.ForkSessionRequest(parent_session_id="root.kid", session_id="root.kid.kid")
    stub.ForkSession(grandchild)
    append(stub, "root.kid.kid", answer("m", 1000))
    tree = usage(stub, "root", include_descendants=True)
    assert list(tree.descendant_session_ids) == ["root.kid", "root.kid.kid"]
    assert rows(tree.usage) == [("m", 1707, 0, 0, 0, 5), ("other", 1, 0, 0, 0, 1)]
    assert rows(tree.own_usage) == [("m", 700, 0, 0, 0, 3)]
    assert totals(stub, "root") == [("m", 700, 0, 0, 0, 3)]
    error = failure(usage, stub, "root", 0, include_descendants=True)
    check(error, INVALID, "MALFORMED_REQUEST", field="at_seq")


def test_a_fork_of_a_turn_keeps_usage_inside_it(stub: Any) -> None:
    """Usage recorded on the events of a whole turn is copied with it."""
    append(stub, "turns", ev(TURN_START), answer("m", 5), spent(ev(TURN_END), "m", 1, 1))
    fork = pb.ForkSessionRequest(parent_session_id="turns", session_id="turns.f", at_seq=2)
    stub.ForkSession(fork)
    assert totals(stub, "turns.f") == [("m", 6, 1, 0, 0, 2)] == totals(stub, "turns")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"input_tokens": 5}, "usage.model"),
        ({"model": "m", "input_tokens": 1, "cached_input_tokens": 2}, "usage.cached_input_tokens"),
        ({"model": "m", "reasoning_tokens": 1}, "usage.reasoning_tokens"),
        ({"model": "m", "output_tokens": 1 << 33}, "usage.output_tokens"),
        ({"model": "a\x00b"}, "usage.model"),
    ],
)
def test_bad_usage_is_refused_and_changes_nothing(
    stub: Any, fields: dict[str, Any], field: str
) -> None:
    """A bad usage fails the whole append with INVALID_USAGE naming the event and field."""
    session = f"refused-{abs(hash(repr(fields)))}"
    append(stub, session, answer("m", 1))
    bad = say("bad", ASSISTANT)
    bad.usage.CopyFrom(event_pb2.Usage(**fields))
    error = failure(append, stub, session, answer("m", 2), bad)
    check(error, INVALID, "INVALID_USAGE", index=1, field=field)
    assert get(stub, session).event_count == 1
    assert totals(stub, session) == [("m", 1, 0, 0, 0, 1)]


def test_a_lenient_append_drops_only_the_bad_usage(stub: Any) -> None:
    """Lenient: the event with a bad usage is dropped and reported, the others count."""
    bad = spent(say("bad", ASSISTANT), "")
    bad.usage.input_tokens = 3
    reply = append(stub, "lenient", answer("m", 2), bad, answer("m", 3), lenient=True)
    assert [(d.index, d.reason) for d in reply.drops] == [(1, "INVALID_USAGE")]
    assert totals(stub, "lenient") == [("m", 5, 0, 0, 0, 2)]


def test_a_retried_append_counts_once(stub: Any) -> None:
    """A replayed request_id writes nothing, so its usage is not added again."""
    for _ in range(2):
        append(stub, "retried", answer("m", 40, 4), request_id="r-1")
    assert totals(stub, "retried") == [("m", 40, 4, 0, 0, 1)]


def test_a_seeded_or_created_session_counts_its_events(stub: Any) -> None:
    """CreateSession's initial events carry usage like an append's."""
    created = pb.CreateSessionRequest(session_id="created", events=[answer("m", 11, 1)])
    stub.CreateSession(created)
    assert totals(stub, "created") == [("m", 11, 1, 0, 0, 1)]


def test_an_unknown_session_has_no_usage(stub: Any) -> None:
    """Never written: no totals, no error; a bad id is INVALID_SESSION_ID."""
    reply = usage(stub, "never-written")
    assert (rows(reply.usage), reply.event_count) == ([], 0)
    check(failure(usage, stub, "bad id!"), INVALID, "INVALID_SESSION_ID")


# -- clients and CLI ------------------------------------------------------------------------------


def test_python_clients_record_and_read_usage(server: RunningServer) -> None:
    """Client and AsyncClient: event(usage=...) and event dicts append usage, get_usage reads it
    (at_seq, include_descendants), usage_to_dict makes a dict of it."""
    with Client(server.address) as client:
        client.append(
            "py",
            [
                event(
                    "assistant_message", {"content": "a"}, usage={"model": "m", "input_tokens": 9}
                ),
                event_from_dict({"type": "step_end", "usage": {"model": "m", "output_tokens": 4}}),
            ],
        )
        reply = client.get_usage("py")
        assert usage_to_dict(reply.usage) == {
            "m": {
                "input_tokens": 9,
                "output_tokens": 4,
                "cached_input_tokens": 0,
                "reasoning_tokens": 0,
                "event_count": 2,
            }
        }
        assert usage_to_dict(client.get_usage("py", at_seq=0).usage)["m"]["output_tokens"] == 0
        logged = [event_to_dict(e) for e in client.since("py")]
        assert logged[1]["usage"] == {
            "model": "m",
            "input_tokens": 0,
            "output_tokens": 4,
            "cached_input_tokens": 0,
            "reasoning_tokens": 0,
        }
        assert "usage" not in event_to_dict(event("user_message", {"content": "x"}))
        client.fork_session("py", session_id="py.fork", at_seq=0)
        with pytest.raises(errors.InvalidUsage):
            client.append("py", [event("step_end", usage={"model": ""})])

    async def read_async() -> tuple[list[str], int]:
        async with AsyncClient(server.address) as client:
            tree = await client.get_usage("py", include_descendants=True)
            return list(tree.descendant_session_ids), tree.usage[0].input_tokens

    assert asyncio.run(read_async()) == (["py.fork"], 9)


def test_cli_prints_usage(server: RunningServer) -> None:
    """`sessionlog usage SESSION` prints a table per model with a total (--at-seq, --tree,
    --json); `sessions` adds the tokens of sessions with usage and a total line."""
    with Client(server.address) as client:
        client.append(
            "cli.u",
            [
                event(
                    "assistant_message",
                    usage={"model": "big", "input_tokens": 100, "output_tokens": 7},
                ),
                event(
                    "step_end",
                    usage={"model": "small", "input_tokens": 5, "cached_input_tokens": 2},
                ),
            ],
        )
        client.append("cli.v", [event("user_message", {"content": "none"})])

    def ok(*args: str) -> str:
        result = run_cli_here([*args, "--server", server.address])
        assert result.returncode == 0, result.stderr
        return result.stdout

    table = ok("usage", "cli.u").splitlines()
    assert table[0] == "2 events"
    assert table[1].split() == ["model", "input", "cached", "output", "reasoning", "events"]
    assert [line.split() for line in table[2:]] == [
        ["big", "100", "0", "7", "0", "1"],
        ["small", "5", "2", "0", "0", "1"],
        ["total", "105", "2", "7", "0", "2"],
    ]
    assert ok("usage", "cli.u", "--at-seq", "0").splitlines()[2].split()[:2] == ["big", "100"]
    described = json.loads(ok("usage", "cli.u", "--json"))
    assert [u["model"] for u in described["usage"]] == ["big", "small"]
    assert ok("usage", "cli.v").splitlines() == ["1 events", "no usage recorded"]
    assert ok("sessions", "--prefix", "cli.").splitlines() == [
        "cli.u\t2 events\t105 in / 7 out tokens",
        "cli.v\t1 events",
        "total\t2 sessions\t105 in / 7 out tokens",
    ]
    tail = ok("tail", "cli.u", "--no-follow").splitlines()
    assert tail[0].endswith("usage big 100 in / 7 out")
    refused = run_cli_here(["usage", "cli.u", "--at-seq", "9", "--server", server.address])
    assert refused.returncode == 1
    assert "BOUNDARY_OUT_OF_RANGE" in refused.stderr
