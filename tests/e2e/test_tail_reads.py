"""Reads from the end: ListEvents newest first and paged DeriveMessages, over gRPC.

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
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import AsyncClient, Client, event
from sessionlog_client.errors import MalformedRequest
from tests.e2e._helpers import (
    ASSISTANT,
    STEP_START,
    USER,
    append,
    check,
    failure,
    log,
    replace,
    say,
)
from tests.e2e._proc import run_cli_here, running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("tail") / "data") as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.SessionLogServiceStub:
    return server.stub()


def list_events(stub: Any, session_id: str, **fields: Any) -> pb.ListEventsResponse:
    reply: pb.ListEventsResponse = stub.ListEvents(
        pb.ListEventsRequest(session_id=session_id, **fields)
    )
    return reply


def every_page(stub: Any, session_id: str, **fields: Any) -> list[list[int]]:
    """The seqs of every page of ListEvents, following next_page_token to the end."""
    pages: list[list[int]] = []
    token = ""
    for _ in range(1000):
        reply = list_events(stub, session_id, page_token=token, **fields)
        pages.append([e.seq for e in reply.events])
        token = reply.next_page_token
        if not token:
            return pages
    raise AssertionError("ListEvents did not stop paging")


def derive(stub: Any, session_id: str, **fields: Any) -> pb.DeriveMessagesResponse:
    reply: pb.DeriveMessagesResponse = stub.DeriveMessages(
        pb.DeriveMessagesRequest(session_id=session_id, **fields)
    )
    return reply


def derive_pages(stub: Any, session_id: str, **fields: Any) -> list[list[int]]:
    """The seqs of every page of a paged DeriveMessages, newest page first."""
    pages: list[list[int]] = []
    token = ""
    for _ in range(1000):
        reply = derive(stub, session_id, page_token=token, **fields)
        pages.append(list(reply.seqs))
        token = reply.next_page_token
        if not token:
            return pages
    raise AssertionError("DeriveMessages did not stop paging")


def chat(count: int, start: int = 0) -> list[Any]:
    """``count`` messages, alternating user and assistant, with a step marker every fifth."""
    return [
        say(f"m{i}", STEP_START if i % 5 == 4 else (ASSISTANT if i % 2 else USER))
        for i in range(start, start + count)
    ]


# -- ListEvents ---------------------------------------------------------------------------------


def test_newest_first_pages_back_through_the_whole_log(stub: Any) -> None:
    """order_by "seq desc": the first page holds the last events, newest first; the pages put
    together are the log reversed; "seq" pages forward the same events."""
    append(stub, "desc", *chat(23))
    first = list_events(stub, "desc", page_size=5, order_by="seq desc")
    assert [e.seq for e in first.events] == [22, 21, 20, 19, 18]
    assert first.event_count == 23
    assert first.events[0].data["content"] == "m22"
    pages = every_page(stub, "desc", page_size=5, order_by="seq desc")
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [s for p in pages for s in p] == list(range(22, -1, -1))
    forward = every_page(stub, "desc", page_size=10, order_by="seq")
    assert [s for p in forward for s in p] == list(range(23))
    assert [e.SerializeToString() for e in list_events(stub, "desc", page_size=23).events] == [
        e.SerializeToString() for e in log(stub, "desc")
    ]


def test_events_appended_while_paging_back_never_appear(stub: Any) -> None:
    """The newest-first walk is pinned where it began: later pages hold only older events."""
    append(stub, "grow", *chat(10))
    first = list_events(stub, "grow", page_size=4, order_by="seq desc")
    append(stub, "grow", *chat(6, start=10))
    fresh = every_page(stub, "grow", page_size=4, order_by="seq desc")
    assert fresh[0] == [15, 14, 13, 12]  # a new first page sees the new events
    second = list_events(
        stub, "grow", page_size=4, order_by="seq desc", page_token=first.next_page_token
    )
    assert [e.seq for e in second.events] == [5, 4, 3, 2]
    third = list_events(
        stub, "grow", page_size=4, order_by="seq desc", page_token=second.next_page_token
    )
    assert [e.seq for e in third.events] == [1, 0]
    assert third.next_page_token == ""


def test_defaults_and_an_unknown_session(stub: Any) -> None:
    """page_size 0 means 100, above 1000 means 1000; a session never written is an empty page
    with no token; "SEQ  DESC" is read as "seq desc"."""
    append(stub, "many", *chat(150))
    assert len(list_events(stub, "many").events) == 100
    assert len(list_events(stub, "many", page_size=5000).events) == 150
    assert list_events(stub, "many", order_by="SEQ  DESC", page_size=1).events[0].seq == 149
    empty = list_events(stub, "never-written", order_by="seq desc")
    assert (list(empty.events), empty.next_page_token, empty.event_count) == ([], "", 0)


def test_bad_requests_are_refused(stub: Any) -> None:
    """A token of another session, another order or no token at all is INVALID_PAGE_TOKEN; a
    negative page size, an order not offered and a bad id get their own reasons."""
    append(stub, "tok-a", *chat(5))
    append(stub, "tok-b", *chat(5))
    token = list_events(stub, "tok-a", page_size=2, order_by="seq desc").next_page_token
    assert token
    calls = [
        pb.ListEventsRequest(session_id="tok-b", order_by="seq desc", page_token=token),
        pb.ListEventsRequest(session_id="tok-a", order_by="seq", page_token=token),
        pb.ListEventsRequest(session_id="tok-a", order_by="seq desc", page_token=token + "x"),
        pb.ListEventsRequest(session_id="tok-a", order_by="seq desc", page_token="not a token!"),
        pb.ListEventsRequest(session_id="tok-a", order_by="seq desc", page_token=token[:-2]),
    ]
    for request in calls:
        check(failure(stub.ListEvents, request), INVALID, "INVALID_PAGE_TOKEN")
    check(failure(list_events, stub, "tok-a", page_size=-1), INVALID, "INVALID_PAGE_SIZE")
    check(failure(list_events, stub, "tok-a", order_by="time"), INVALID, "INVALID_ORDER_BY")
    check(failure(list_events, stub, "bad id!"), INVALID, "INVALID_SESSION_ID")
    messages = derive(stub, "tok-a", page_size=2).next_page_token
    error = failure(list_events, stub, "tok-a", order_by="seq desc", page_token=messages)
    check(error, INVALID, "INVALID_PAGE_TOKEN")


# -- paged DeriveMessages -----------------------------------------------------------------------


def test_the_last_messages_are_the_end_of_the_full_derive(stub: Any) -> None:
    """page_size N: the last N messages and their seqs, as the full derive has them; the pages
    put together are the full list; the replace generation is the session's."""
    append(stub, "msgs", *chat(30))
    append(stub, "msgs", replace(3, 12, "summary of 3..12"))
    append(stub, "msgs", *chat(7, start=31))
    append(stub, "msgs", replace(33, 34, "prune"))
    full = derive(stub, "msgs")
    last = derive(stub, "msgs", page_size=4)
    assert list(last.seqs) == list(full.seqs)[-4:]
    assert [m.SerializeToString() for m in last.messages] == [
        m.SerializeToString() for m in full.messages[-4:]
    ]
    assert (last.event_count, last.replace_generation) == (full.event_count, 2)
    assert last.next_page_token
    pages = derive_pages(stub, "msgs", page_size=4)
    assert [s for p in reversed(pages) for s in p] == list(full.seqs)
    assert all(len(p) == 4 for p in pages[:-1])
    assert full.next_page_token == ""


def test_pages_stay_pinned_while_the_session_grows_and_is_compacted(stub: Any) -> None:
    """A token folds the log as the first page saw it: appends and a summary over everything
    committed after it change nothing in the later pages."""
    append(stub, "pinned", *chat(20))
    before = derive(stub, "pinned")
    first = derive(stub, "pinned", page_size=3)
    append(stub, "pinned", replace(0, 25, "summary of everything"), *chat(4, start=21))
    token = first.next_page_token
    rest: list[int] = []
    while token:
        page = derive(stub, "pinned", page_size=3, page_token=token)
        assert page.event_count == 20
        rest = list(page.seqs) + rest
        token = page.next_page_token
    assert rest + list(first.seqs) == list(before.seqs)
    now = derive(stub, "pinned", page_size=3)
    assert list(now.seqs) == list(derive(stub, "pinned").seqs)[-3:]
    assert now.event_count == 25


def test_at_seq_pages_a_prefix(stub: Any) -> None:
    """at_seq pins the view to events 0..at_seq; the token must come back with the same
    at_seq; past the end is BOUNDARY_OUT_OF_RANGE."""
    append(stub, "prefix", *chat(12))
    append(stub, "prefix", replace(2, 4, "sum"))
    full = derive(stub, "prefix", at_seq=8)
    pages = derive_pages(stub, "prefix", page_size=2, at_seq=8)
    assert [s for p in reversed(pages) for s in p] == list(full.seqs)
    first = derive(stub, "prefix", page_size=2, at_seq=8)
    assert (first.event_count, first.replace_generation) == (9, 0)
    for wrong in ({}, {"at_seq": 7}):
        error = failure(derive, stub, "prefix", page_token=first.next_page_token, **wrong)
        check(error, INVALID, "INVALID_PAGE_TOKEN")
    check(failure(derive, stub, "prefix", page_size=2, at_seq=13), INVALID, "BOUNDARY_OUT_OF_RANGE")


def test_incremental_derive_goes_on_from_the_last_page(stub: Any) -> None:
    """The last page's (event_count, replace_generation) work as known_*: a caller showing the
    last messages then appends only the new ones."""
    append(stub, "inc", *chat(8))
    last = derive(stub, "inc", page_size=2)
    append(stub, "inc", say("new one"))
    tail = derive(
        stub,
        "inc",
        known_event_count=last.event_count,
        known_replace_generation=last.replace_generation,
    )
    assert tail.incremental
    assert [m.content for m in tail.messages] == ["new one"]


def test_paged_derive_refusals(stub: Any) -> None:
    """A token of another session or of ListEvents, a negative page size: refused."""
    append(stub, "dref-a", *chat(6))
    append(stub, "dref-b", *chat(6))
    token = derive(stub, "dref-a", page_size=2).next_page_token
    check(failure(derive, stub, "dref-b", page_token=token), INVALID, "INVALID_PAGE_TOKEN")
    events_token = list_events(stub, "dref-a", page_size=2).next_page_token
    check(failure(derive, stub, "dref-a", page_token=events_token), INVALID, "INVALID_PAGE_TOKEN")
    check(failure(derive, stub, "dref-a", page_size=-3), INVALID, "INVALID_PAGE_SIZE")
    empty = derive(stub, "never-derived", page_size=5)
    assert (list(empty.seqs), empty.next_page_token, empty.event_count) == ([], "", 0)


# -- clients ------------------------------------------------------------------------------------


def test_python_clients_read_the_last_events_and_messages(server: RunningServer) -> None:
    """Client and AsyncClient: last_events(n) in seq order, last_messages(n) across pages (n
    above a page's 1000), list_events pages and derive_messages(page_size=...)."""
    with Client(server.address) as client:
        client.append("py-tail", [event("user_message", {"content": f"m{i}"}) for i in range(1203)])
        client.append("py-tail", [event("turn_start")])
        assert [e.seq for e in client.last_events("py-tail", 3)] == [1201, 1202, 1203]
        assert len(client.last_events("py-tail", 1100)) == 1100
        assert len(client.last_events("py-tail", 5000)) == 1204
        assert client.last_events("py-tail", 0) == []
        page = client.list_events("py-tail", page_size=2, order_by="seq desc")
        older = client.list_events(
            "py-tail", page_size=2, order_by="seq desc", page_token=page.next_page_token
        )
        assert [e.seq for e in [*page.events, *older.events]] == [1203, 1202, 1201, 1200]
        last = client.last_messages("py-tail", 2)
        assert [m.content for m in last.messages] == ["m1201", "m1202"]
        assert list(last.seqs) == [1201, 1202]
        many = client.last_messages("py-tail", 1150)
        assert list(many.seqs) == list(range(53, 1203))
        assert many.next_page_token
        assert len(client.last_messages("py-tail", 2000).messages) == 1203
        paged = client.derive_messages("py-tail", page_size=1, at_seq=5)
        assert list(paged.seqs) == [5]
        with pytest.raises(MalformedRequest, match="n must be a whole number") as refused:
            client.last_events("py-tail", -1)
        assert refused.value.metadata == {"field": "n"}

    async def read_async() -> tuple[list[int], list[int]]:
        async with AsyncClient(server.address) as client:
            events = await client.last_events("py-tail", 2)
            messages = await client.last_messages("py-tail", 1001)
            return [e.seq for e in events], list(messages.seqs)

    events, seqs = asyncio.run(read_async())
    assert events == [1202, 1203]
    assert seqs == list(range(202, 1203))


def test_cli_prints_the_last_messages(server: RunningServer) -> None:
    """`sessionlog messages SESSION --last N` prints the last N of the transcript (and --json
    them with their seqs); `tail --last N --no-follow` the last N events."""
    with Client(server.address) as client:
        client.append("cli-tail", [event("user_message", {"content": f"m{i}"}) for i in range(40)])

    def ok(*args: str) -> str:
        result = run_cli_here([*args, "--server", server.address])
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert ok("messages", "cli-tail", "--last", "2").splitlines() == [
        "[38] user: m38",
        "[39] user: m39",
    ]
    shown = json.loads(ok("messages", "cli-tail", "--last", "3", "--at-seq", "9", "--json"))
    assert [m["seq"] for m in shown["messages"]] == [7, 8, 9]
    assert shown["event_count"] == 10
    assert len(ok("tail", "cli-tail", "--last", "3", "--no-follow").splitlines()) == 3
    refused = run_cli_here(["messages", "cli-tail", "--last", "-1"])
    assert refused.returncode == 2
