"""One error per mistake (issue 35): a page token that is not one is INVALID_PAGE_TOKEN from
every listing RPC, an order_by one RPC does not offer is INVALID_ORDER_BY from every RPC that
takes one (one grammar: ``FIELD [asc|desc]``), and an import whose parent_event_count runs past
the events it says the session holds is INVALID_IMPORT; each refusal changes nothing.

One server for the module, auth off; each test writes its own sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.listing import encode_page_token
from sessionlog.service import paging
from sessionlog.testing import RunningServer
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client
from sessionlog_client.errors import InvalidPageSize, MalformedRequest
from tests.e2e._helpers import Stub, append, check, failure, get, say
from tests.e2e._proc import running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data: Path = tmp_path_factory.mktemp("one-error")
    with running_server(data) as running:
        stub = running.stub()
        for session_id in ("pt.a", "pt.b"):
            append(stub, session_id, *(say(f"m{i}") for i in range(5)))
        yield running


@pytest.fixture
def stub(server: RunningServer) -> Stub:
    return server.stub()


@pytest.fixture
def admin(server: RunningServer) -> Iterator[apb_grpc.AdminServiceStub]:
    with server.channel() as channel:
        yield apb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]


# -- page tokens ---------------------------------------------------------------------------------

NOT_TOKENS = ["not a token!", "AQ", "A" * 5000, "%%%"]


def _events_token(stub: Stub) -> str:
    token: str = stub.ListEvents(
        pb.ListEventsRequest(session_id="pt.a", page_size=2), timeout=5
    ).next_page_token
    assert token
    return token


def _messages_token(stub: Stub) -> str:
    token: str = stub.DeriveMessages(
        pb.DeriveMessagesRequest(session_id="pt.a", page_size=2), timeout=5
    ).next_page_token
    assert token
    return token


def _sessions_token(stub: Stub) -> str:
    token: str = stub.ListSessions(
        pb.ListSessionsRequest(prefix="pt.", page_size=1), timeout=5
    ).next_page_token
    assert token
    return token


def _refused(error: grpc.RpcError, rpc: str) -> None:
    check(error, INVALID, "INVALID_PAGE_TOKEN", field="page_token")
    assert rpc in (error.details() or ""), error.details()


@pytest.mark.parametrize("token", NOT_TOKENS)
def test_list_sessions_refuses_a_bad_token(stub: Stub, token: str) -> None:
    """ListSessions: INVALID_PAGE_TOKEN naming page_token (it was MALFORMED_REQUEST)."""
    error = failure(stub.ListSessions, pb.ListSessionsRequest(page_token=token), timeout=5)
    _refused(error, "ListSessions")


@pytest.mark.parametrize("token", NOT_TOKENS)
def test_list_lease_audit_refuses_a_bad_token(admin: apb_grpc.AdminServiceStub, token: str) -> None:
    """ListLeaseAudit: INVALID_PAGE_TOKEN naming page_token (it was MALFORMED_REQUEST)."""
    error = failure(admin.ListLeaseAudit, apb.ListLeaseAuditRequest(page_token=token), timeout=5)
    _refused(error, "ListLeaseAudit")


@pytest.mark.parametrize("token", NOT_TOKENS)
def test_list_events_refuses_a_bad_token(stub: Stub, token: str) -> None:
    """ListEvents: INVALID_PAGE_TOKEN naming page_token."""
    request = pb.ListEventsRequest(session_id="pt.a", page_token=token)
    _refused(failure(stub.ListEvents, request, timeout=5), "ListEvents")


@pytest.mark.parametrize("token", NOT_TOKENS)
def test_derive_messages_refuses_a_bad_token(stub: Stub, token: str) -> None:
    """Paged DeriveMessages: INVALID_PAGE_TOKEN naming page_token."""
    request = pb.DeriveMessagesRequest(session_id="pt.a", page_token=token)
    _refused(failure(stub.DeriveMessages, request, timeout=5), "DeriveMessages")


def test_each_listing_refuses_every_other_listings_token(
    stub: Stub, admin: apb_grpc.AdminServiceStub
) -> None:
    """A real token of one listing sent to another is INVALID_PAGE_TOKEN there, whichever pair;
    and each token still continues its own listing."""
    events, messages, sessions = _events_token(stub), _messages_token(stub), _sessions_token(stub)
    foreign = {
        "ListSessions": (events, messages, encode_page_token("pt.a", "other.")),
        "ListEvents": (messages, sessions, paging.encode(paging.ASCENDING, "pt.b", 2)),
        "DeriveMessages": (events, sessions),
        "ListLeaseAudit": (events, messages, sessions),
    }
    for token in foreign["ListSessions"]:
        listing = pb.ListSessionsRequest(prefix="pt.", page_token=token)
        _refused(failure(stub.ListSessions, listing, timeout=5), "ListSessions")
    for token in foreign["ListEvents"]:
        request = pb.ListEventsRequest(session_id="pt.a", page_size=2, page_token=token)
        _refused(failure(stub.ListEvents, request, timeout=5), "ListEvents")
    for token in foreign["DeriveMessages"]:
        asked = pb.DeriveMessagesRequest(session_id="pt.a", page_size=2, page_token=token)
        _refused(failure(stub.DeriveMessages, asked, timeout=5), "DeriveMessages")
    for token in foreign["ListLeaseAudit"]:
        audit = apb.ListLeaseAuditRequest(page_token=token)
        _refused(failure(admin.ListLeaseAudit, audit, timeout=5), "ListLeaseAudit")
    listed = stub.ListSessions(pb.ListSessionsRequest(prefix="pt.", page_token=sessions))
    assert [s.session_id for s in listed.sessions] == ["pt.b"]
    read = stub.ListEvents(pb.ListEventsRequest(session_id="pt.a", page_token=events))
    assert [e.seq for e in read.events] == [2, 3, 4]


# -- order_by ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order_by", "first"),
    [("", 0), ("seq", 0), ("  SEQ   ASC ", 0), ("seq desc", 4), ("Seq DESC", 4)],
)
def test_list_events_reads_order_by_with_the_one_grammar(
    stub: Stub, order_by: str, first: int
) -> None:
    """ListEvents: a field alone is ascending, case and extra spaces are insignificant."""
    page = stub.ListEvents(
        pb.ListEventsRequest(session_id="pt.a", page_size=1, order_by=order_by), timeout=5
    )
    assert [e.seq for e in page.events] == [first]


@pytest.mark.parametrize(
    ("order_by", "first"),
    [("", "pt.a"), ("session_id", "pt.a"), ("SESSION_ID asc", "pt.a"), ("update_time  desc", "")],
)
def test_list_sessions_reads_order_by_with_the_one_grammar(
    stub: Stub, order_by: str, first: str
) -> None:
    """ListSessions: the same grammar as ListEvents ("" names the newest update: whichever)."""
    page = stub.ListSessions(
        pb.ListSessionsRequest(prefix="pt.", page_size=1, order_by=order_by), timeout=5
    )
    assert len(page.sessions) == 1
    assert first in ("", page.sessions[0].session_id)


BAD_ORDERS = ["seq desc asc", "seq,seq", "seq sideways", "time", "desc", "session_id desc"]


@pytest.mark.parametrize("order_by", BAD_ORDERS)
def test_list_events_refuses_an_order_it_does_not_offer(stub: Stub, order_by: str) -> None:
    """ListEvents: INVALID_ORDER_BY naming the RPC and what it offers."""
    request = pb.ListEventsRequest(session_id="pt.a", order_by=order_by)
    error = failure(stub.ListEvents, request, timeout=5)
    check(error, INVALID, "INVALID_ORDER_BY", order_by=order_by, rpc="ListEvents")
    assert '"seq desc"' in (error.details() or "")


@pytest.mark.parametrize("order_by", [*BAD_ORDERS[:-1], "update_time", "update_time asc", "seq"])
def test_list_sessions_refuses_an_order_it_does_not_offer(stub: Stub, order_by: str) -> None:
    """ListSessions: the same error as ListEvents for the same kind of mistake."""
    error = failure(stub.ListSessions, pb.ListSessionsRequest(order_by=order_by), timeout=5)
    check(error, INVALID, "INVALID_ORDER_BY", order_by=order_by, rpc="ListSessions")
    assert '"update_time desc"' in (error.details() or "")


# -- imports -------------------------------------------------------------------------------------


def test_an_import_whose_parent_count_passes_its_events_is_refused(stub: Stub) -> None:
    """parent_event_count past the events sent (and past the record's event_count) is
    INVALID_IMPORT naming the field; nothing is created."""
    events = [say("a"), say("b")]
    for i, event in enumerate(events):
        event.seq = i
    plain = pb.ImportSessionRequest(
        session_id="imp.one", events=events, parent_session_id="pt.a", parent_event_count=3
    )
    error = failure(stub.ImportSession, plain, timeout=5)
    check(error, INVALID, "INVALID_IMPORT", field="parent_event_count")
    stated = pb.ImportSessionRequest(
        session_id="imp.one",
        events=events,
        parent_session_id="pt.a",
        parent_event_count=5,
        record=pb.Session(event_count=4),
    )
    error = failure(stub.ImportSession, stated, timeout=5)
    check(error, INVALID, "INVALID_IMPORT", field="parent_event_count")
    orphan = pb.ImportSessionRequest(session_id="imp.one", events=events, parent_event_count=1)
    error = failure(stub.ImportSession, orphan, timeout=5)
    check(error, INVALID, "INVALID_IMPORT", field="parent_event_count")
    assert get(stub, "imp.one").event_count == 0
    listed = stub.ListSessions(pb.ListSessionsRequest(prefix="imp."), timeout=5)
    assert list(listed.sessions) == []


def test_a_chunked_import_of_a_fork_states_its_length_in_the_record(stub: Stub) -> None:
    """A fork imported in chunks whose first chunk holds fewer events than the parent count
    is taken when the first chunk's record says how many events the session has."""
    first = [say("a"), say("b")]
    for i, event in enumerate(first):
        event.seq = i
    stub.ImportSession(
        pb.ImportSessionRequest(
            session_id="imp.two",
            events=first,
            parent_session_id="pt.a",
            parent_event_count=3,
            record=pb.Session(event_count=4),
        ),
        timeout=5,
    )
    rest = [say("c"), say("d")]
    for i, event in enumerate(rest, 2):
        event.seq = i
    stub.ImportSession(
        pb.ImportSessionRequest(
            session_id="imp.two",
            first_seq=2,
            events=rest,
            parent_session_id="pt.a",
            parent_event_count=3,
        ),
        timeout=5,
    )
    session = get(stub, "imp.two")
    assert (session.event_count, session.parent_event_count) == (4, 3)


# -- client-side refusals ------------------------------------------------------------------------

BAD_SEQS: list[Any] = [-1, 2**64, 1.5]


def test_the_python_client_refuses_a_bad_seq_with_its_typed_error(server: RunningServer) -> None:
    """A negative (or too large, or fractional) seq is MalformedRequest naming the argument,
    raised before anything is sent (it was protobuf's bare ValueError); nothing changes."""
    with Client(server.address) as client:
        for seq in BAD_SEQS:
            calls: dict[str, Callable[[], object]] = {
                "seq": lambda: client.since("pt.a", seq),  # noqa: B023
                "at_seq": lambda: client.surface("pt.a", at_seq=seq),  # noqa: B023
                "expected_seq": lambda: client.append(
                    "pt.a",
                    [{"type": "user_message"}],
                    expected_seq=seq,  # noqa: B023
                ),
                "seqs": lambda: client.redact_events("pt.a", [seq]),  # noqa: B023
                "start_seq": lambda: client.hide("pt.a", seq, 1),  # noqa: B023
                "n": lambda: client.last_events("pt.a", seq),  # noqa: B023
            }
            for field, call in calls.items():
                with pytest.raises(MalformedRequest) as refused:
                    call()
                assert refused.value.metadata == {"field": field}, (field, seq)
                assert refused.value.reason == "MALFORMED_REQUEST"
        with pytest.raises(MalformedRequest):
            client.fork_session("pt.a", at_seq=-1, session_id="pt.fork")
        assert client.get_session("pt.a").session.event_count == 5
        assert not client.get_session("pt.fork").session.exists


def test_the_async_client_refuses_a_bad_seq_alike(server: RunningServer) -> None:
    """The asyncio client raises the same MalformedRequest at the call."""

    async def refusals() -> list[str]:
        fields = []
        async with AsyncClient(server.address) as client:
            calls: list[Callable[[], Any]] = [
                lambda: client.since("pt.a", -1),
                lambda: client.follow("pt.a", -1),
                lambda: client.derive_messages("pt.a", at_seq=-1),
            ]
            for call in calls:
                try:
                    await call()
                except MalformedRequest as refused:
                    fields.append(refused.metadata["field"])
        return fields

    assert asyncio.run(refusals()) == ["seq", "seq", "at_seq"]


def test_the_python_clients_other_refusals_are_typed_too(server: RunningServer) -> None:
    """The client's own argument checks (no field to update, ttl and expire_time together)
    raise MalformedRequest naming the argument (they were bare ValueErrors); nothing is sent."""
    with Client(server.address) as client:
        with pytest.raises(MalformedRequest) as refused:
            client.update_session("pt.a")
        assert refused.value.metadata == {"field": "fields"}
        with pytest.raises(MalformedRequest) as refused:
            client.create_session("pt.ttl", ttl=60, expire_time="2999-01-01T00:00:00Z")
        assert refused.value.metadata == {"field": "ttl"}
        assert not client.get_session("pt.ttl").session.exists


def test_the_python_clients_refuse_a_bad_page_size_with_the_servers_error(
    server: RunningServer,
) -> None:
    """A negative page_size is InvalidPageSize from every listing of both clients, as the server
    says it (ListSessions' and ListLeaseAudit's unsigned fields made it protobuf's bare
    ValueError), and one past the field's range asks for the most a page holds (it was a bare
    ValueError from ListEvents and DeriveMessages)."""
    with Client(server.address) as client:
        calls: dict[str, Callable[[int], object]] = {
            "list_sessions": lambda size: next(iter(client.list_sessions(page_size=size))),
            "list_lease_audit": lambda size: next(iter(client.list_lease_audit(page_size=size))),
            "list_events": lambda size: client.list_events("pt.a", page_size=size),
            "derive_messages": lambda size: client.derive_messages("pt.a", page_size=size),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidPageSize) as refused:
                call(-1)
            assert refused.value.metadata == {"page_size": "-1"}, name
            call(2**40)
        assert len(client.list_events("pt.a", page_size=2**40).events) == 5
        with pytest.raises(MalformedRequest) as malformed:
            client.list_events("pt.a", page_size=1.5)  # type: ignore[arg-type]
        assert malformed.value.metadata == {"field": "page_size"}

    async def refusals() -> list[str]:
        refused = []
        async with AsyncClient(server.address) as client:
            calls: list[Callable[[], Any]] = [
                lambda: client.list_events("pt.a", page_size=-1),
                lambda: client.derive_messages("pt.a", page_size=-1),
                lambda: client.list_sessions(page_size=-1).__anext__(),
                lambda: client.list_lease_audit(page_size=-1).__anext__(),
            ]
            for call in calls:
                try:
                    await call()
                except InvalidPageSize as error:
                    refused.append(error.metadata["page_size"])
            await client.list_events("pt.a", page_size=2**40)
        return refused

    assert asyncio.run(refusals()) == ["-1"] * 4
