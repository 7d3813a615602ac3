"""Malformed filters are refused by every RPC that takes one (ListSessions, FollowSessions,
AdminService.EraseSessions) with INVALID_FILTER naming the position, and an erase refused so
erases nothing: a typo never reads as "matched no session" (nor, with !=, as every session:
a value no session can hold is refused too). One server for the module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import check, failure, get, user
from tests.e2e._proc import running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT
ANNS = ("ann.1", "ann.2")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("filters") / "data") as running:
        stub = running.stub()
        for session_id in ANNS:
            stub.CreateSession(
                pb.CreateSessionRequest(session_id=session_id, owner="ann", events=[user()]),
                timeout=30,
            )
        yield running


def owned_by_ann(stub: Any) -> list[str]:
    reply = stub.ListSessions(pb.ListSessionsRequest(filter='owner = "ann"'), timeout=30)
    return [session.session_id for session in reply.sessions]


def first_change(stub: Any, text: str) -> Any:
    request = pb.FollowSessionsRequest(filter=text, from_start=True)
    return next(stub.FollowSessions(request, timeout=10))


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("owner ==ann", 8),
        ("labels.team ==", 14),
        ("owner = ann AND", 16),
        # values no session can hold: = would match nothing, != every session
        ("owner = \u201cann\u201d", 9),
        ("labels.team = core,infra", 15),
        ("labels.team != core,infra", 16),
        ("status != open.", 11),
        ("parent = \u201cann.1\u201d", 10),
        ('owner = "\\ud800"', 9),  # a lone surrogate: no stored text holds one
    ],
)
def test_every_rpc_refuses_a_malformed_filter(
    server: RunningServer, text: str, position: int
) -> None:
    """ListSessions, FollowSessions and EraseSessions each answer INVALID_FILTER with the
    position; the erase removed nothing (ann's sessions stay)."""
    stub = server.stub()
    admin = apb_grpc.AdminServiceStub(server.channel())  # type: ignore[no-untyped-call]
    assert owned_by_ann(stub) == list(ANNS)
    listing = failure(stub.ListSessions, pb.ListSessionsRequest(filter=text), timeout=30)
    check(listing, INVALID, "INVALID_FILTER", position=position)
    assert f"character {position}" in (listing.details() or "")
    following = failure(first_change, stub, text)
    check(following, INVALID, "INVALID_FILTER", position=position)
    erase = apb.EraseSessionsRequest(filter=text, reason="gdpr")
    erasing = failure(admin.EraseSessions, erase, timeout=30)
    check(erasing, INVALID, "INVALID_FILTER", position=position)
    assert owned_by_ann(stub) == list(ANNS)
    assert all(get(stub, session_id).exists for session_id in ANNS)


def test_the_quoted_spelling_is_read(server: RunningServer) -> None:
    """The same value written in double quotes is a comparison with "=ann": valid, and it
    matches no session (nobody is called "=ann")."""
    reply = server.stub().ListSessions(pb.ListSessionsRequest(filter='owner = "=ann"'), timeout=30)
    assert list(reply.sessions) == []


@pytest.mark.parametrize("prefix", ["ann*", "ann 1", " ann", "ann/"])
def test_an_erase_under_a_prefix_no_session_id_can_start_with_is_refused(
    server: RunningServer, prefix: str
) -> None:
    """A prefix holding what no session id holds (a glob's '*', a space) is a typo, not an
    erasure that found nothing: INVALID_REDACTION naming the prefix, nothing erased."""
    stub = server.stub()
    admin = apb_grpc.AdminServiceStub(server.channel())  # type: ignore[no-untyped-call]
    erase = apb.EraseSessionsRequest(prefix=prefix, reason="gdpr")
    erasing = failure(admin.EraseSessions, erase, timeout=30)
    check(erasing, INVALID, "INVALID_REDACTION", field="prefix")
    assert owned_by_ann(stub) == list(ANNS)
    nothing = admin.EraseSessions(apb.EraseSessionsRequest(prefix="nobody.", reason="gdpr"))
    assert nothing.session_count == 0  # a well-formed prefix that matches nothing is no typo
