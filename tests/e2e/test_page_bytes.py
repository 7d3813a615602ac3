"""Pages that fit: a list RPC whose items are large answers fewer than page_size of them, with a
next_page_token, so that the reply stays within the server's --max-message-size (AIP-158); only
an item that alone cannot fit is RESOURCE_EXHAUSTED / RESPONSE_TOO_LARGE."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from sessionlog import fold
from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import append, say
from tests.e2e._proc import running_server

LIMIT = 200 << 10
"""The server's --max-message-size, and the most the test's channel receives."""
EVENTS = fold.Limits(max_event_bytes=100 << 10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data = tmp_path_factory.mktemp("page-bytes") / "data"
    with running_server(data, max_message_bytes=LIMIT, limits=EVENTS) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> Iterator[pb_grpc.SessionLogServiceStub]:
    """A client that accepts replies up to the server's own message limit, no more."""
    options = [("grpc.max_receive_message_length", LIMIT)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        yield pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]


def with_state(stub: pb_grpc.SessionLogServiceStub, session_id: str, *values: str) -> None:
    """A session whose state holds one key per value (each key in an event of its own)."""
    for number, value in enumerate(values):
        event = say(f"turn {number}")
        event.state_delta.update({f"k{number}": value})
        append(stub, session_id, event)


def every_page(
    stub: pb_grpc.SessionLogServiceStub, request: pb.ListSessionsRequest
) -> list[pb.ListSessionsResponse]:
    pages: list[pb.ListSessionsResponse] = []
    for _ in range(100):  # bounded: far more pages than any listing here has
        page = stub.ListSessions(request)
        pages.append(page)
        if not page.next_page_token:
            return pages
        request.page_token = page.next_page_token
    raise AssertionError("the listing never ended")


@pytest.mark.workers  # each page may be read by another worker: a short page's token is theirs too
@pytest.mark.parametrize("order_by", ["", "update_time desc"])
def test_full_view_pages_of_large_states_fit_the_message_limit(
    stub: pb_grpc.SessionLogServiceStub, order_by: str
) -> None:
    """Ten sessions of 60 KiB state each (600 KiB) listed with page_size 100: each page holds
    fewer, fits the limit, and the pages together list every session once with its state."""
    prefix = f"big{len(order_by)}."
    states = {f"{prefix}{n}": "s" * (60 << 10) + str(n) for n in range(10)}
    for session_id, value in states.items():
        with_state(stub, session_id, value)
    request = pb.ListSessionsRequest(
        prefix=prefix, page_size=100, order_by=order_by, view=pb.SESSION_VIEW_FULL
    )
    pages = every_page(stub, request)
    assert len(pages) >= 3
    assert all(page.ByteSize() <= LIMIT for page in pages)
    assert all(page.sessions for page in pages)
    listed = [s for page in pages for s in page.sessions]
    assert sorted(s.session_id for s in listed) == sorted(states)
    assert {s.session_id: MessageToDict(s.state)["k0"] for s in listed} == states
    usage_pages = [len(page.usage_total) for page in pages]
    assert usage_pages == [0] * len(pages)  # no usage recorded: the totals stay empty


def test_small_sessions_still_fill_a_page(stub: pb_grpc.SessionLogServiceStub) -> None:
    """Bounding by bytes takes nothing from a page of small sessions: page_size is honoured."""
    for n in range(30):
        with_state(stub, f"small.{n:02}", "v")
    request = pb.ListSessionsRequest(prefix="small.", page_size=25, view=pb.SESSION_VIEW_FULL)
    first = stub.ListSessions(request)
    assert len(first.sessions) == 25
    assert first.next_page_token


def test_a_session_whose_state_alone_cannot_fit_is_response_too_large(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """A session whose state alone is over the limit: RESOURCE_EXHAUSTED / RESPONSE_TOO_LARGE
    with the size and the limit; the basic view still lists it, and the session before it
    is still listed on the page before."""
    with_state(stub, "huge.a", "a" * 100)
    with_state(stub, "huge.b", *("b" * (90 << 10) for _ in range(3)))  # 270 KiB of state
    request = pb.ListSessionsRequest(prefix="huge.", page_size=10, view=pb.SESSION_VIEW_FULL)
    first = stub.ListSessions(request)
    assert [s.session_id for s in first.sessions] == ["huge.a"]
    assert first.next_page_token
    request.page_token = first.next_page_token
    with pytest.raises(grpc.RpcError) as raised:
        stub.ListSessions(request)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(raised.value)
    assert (info.domain, info.reason) == ("sessionlog", "RESPONSE_TOO_LARGE")
    assert int(info.metadata["limit"]) == LIMIT
    assert int(info.metadata["size"]) > LIMIT
    assert "'huge.b'" in str(raised.value.details())
    basic = stub.ListSessions(pb.ListSessionsRequest(prefix="huge."))
    assert [s.session_id for s in basic.sessions] == ["huge.a", "huge.b"]


def every_message_page(
    stub: pb_grpc.SessionLogServiceStub, request: pb.DeriveMessagesRequest
) -> list[pb.DeriveMessagesResponse]:
    pages: list[pb.DeriveMessagesResponse] = []
    for _ in range(100):  # bounded: far more pages than any view here has
        page = stub.DeriveMessages(request)
        pages.append(page)
        if not page.next_page_token:
            return pages
        request.page_token = page.next_page_token
    raise AssertionError("the paging never ended")


@pytest.mark.workers  # a page cut short resumes its walk on whichever worker takes the next call
@pytest.mark.parametrize("replaced", [False, True])
@pytest.mark.parametrize("walked", [False, True])
def test_derive_messages_pages_of_large_messages_fit_the_message_limit(
    stub: pb_grpc.SessionLogServiceStub, replaced: bool, walked: bool
) -> None:
    """80 messages of 4 KiB (320 KiB) paged with page_size 100: each page holds fewer, fits the
    limit, and the pages, last first, give back the whole view in order; with a replace in it
    too, and for a view the memo does not hold (at_seq), whose walk back each page resumes."""
    session_id = f"msgs.{replaced}.{walked}"
    for batch in range(8):
        append(stub, session_id, *(say(f"{batch}.{n}" + "m" * (4 << 10)) for n in range(10)))
    if replaced:
        summary = say("summary")
        summary.surface_op.replace.start_seq, summary.surface_op.replace.stop_seq = 10, 19
        append(stub, session_id, summary)
    whole = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id, at_seq=9))
    assert len(whole.messages) == 10  # a view that fits is still read whole
    request = pb.DeriveMessagesRequest(session_id=session_id, page_size=100)
    if walked:  # the view before this last message: walked back, not served by the memo
        request.at_seq = append(stub, session_id, say("after the view")).next_seq - 2
    pages = every_message_page(stub, request)
    assert len(pages) >= 2
    assert all(page.ByteSize() <= LIMIT for page in pages)
    assert all(page.messages for page in pages)
    seqs = [seq for page in reversed(pages) for seq in page.seqs]
    expected = list(range(80))
    if replaced:
        expected = [*range(10), 80, *range(20, 80)]
    assert seqs == expected
    contents = [m.content for page in reversed(pages) for m in page.messages]
    assert contents[9].startswith("0.9")
    assert contents[-1].startswith("7.9")
