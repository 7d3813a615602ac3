"""What the client's router makes of a call the transport or a proxy ended (issue 29): a read
stream resumes after any end with no ErrorInfo, a server's refusal stays fatal, and a proxy's
HTTP 502/503/504 is an answer (no primary right now), retried, never "cannot reach"."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from sessionlog_client._routing import Router, Step
from sessionlog_client._status import proxy_status, to_error, transport_end
from sessionlog_client.errors import Unavailable


class Ended(grpc.RpcError):  # type: ignore[misc]
    """An RpcError as grpc raises it: a code, details and, for a server's refusal, ErrorInfo."""

    def __init__(self, code: grpc.StatusCode, details: str, reason: str = "") -> None:
        self._code = code
        self._details = details
        self._trailers: tuple[tuple[str, bytes], ...] = ()
        if reason:
            info = any_pb2.Any()
            info.Pack(error_details_pb2.ErrorInfo(domain="sessionlog", reason=reason))
            status = status_pb2.Status(code=code.value[0], message=details, details=[info])
            self._trailers = (("grpc-status-details-bin", status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailers


U = grpc.StatusCode
STREAM_REMOVED = Ended(U.UNKNOWN, "Stream removed (Data frame with END_STREAM flag received)")
RST_STREAM = Ended(U.INTERNAL, "Received RST_STREAM with code 2")
RESET_CANCEL = Ended(U.CANCELLED, "Received RST_STREAM with code 8")
PROXY_503 = Ended(U.UNAVAILABLE, "Received http2 header with status: 503")
PROXY_502_JS = Ended(U.UNAVAILABLE, "Received HTTP status code 502")
SERVER_REFUSALS = [
    Ended(U.INVALID_ARGUMENT, "bad seq", "INVALID_ARGUMENT"),
    Ended(U.NOT_FOUND, "no such session", "SESSION_NOT_FOUND"),
    Ended(U.FAILED_PRECONDITION, "compacted", "FEED_POSITION_GONE"),
    Ended(U.UNKNOWN, "Exception iterating responses: boom"),  # a handler's crash
]


def _router(*addresses: str) -> Router:
    router = Router(list(addresses), lambda _: (None, {}), several=len(addresses) > 1)
    router.open()
    return router


@pytest.mark.parametrize("addresses", [("proxy:1",), ("m1:1", "m2:1")])
@pytest.mark.parametrize("ended", [STREAM_REMOVED, RST_STREAM, RESET_CANCEL, PROXY_503])
def test_a_stream_that_answered_resumes_after_a_transport_end(
    addresses: tuple[str, ...], ended: Ended
) -> None:
    """A read stream resumes (LATER) after an end with no ErrorInfo, and so does a unary call
    that retries (``deadline_moves``: a read, or a write with a request id); one that does not
    retry does not take UNKNOWN, INTERNAL or CANCELLED for UNAVAILABLE."""
    router = _router(*addresses)
    member = router.current()
    assert member is not None
    member.reached = True
    assert transport_end(ended)
    assert router.after(member, ended, retry=True, hops=0, stream=True) is Step.LATER
    assert router.after(member, ended, retry=True, hops=0, deadline_moves=True) is Step.LATER
    unary = router.after(member, ended, retry=True, hops=0)
    assert unary is (Step.LATER if ended.code() == U.UNAVAILABLE else Step.RAISE)


@pytest.mark.parametrize("refusal", SERVER_REFUSALS)
def test_a_servers_refusal_still_ends_a_stream(refusal: Ended) -> None:
    """INVALID_ARGUMENT, SESSION_NOT_FOUND, FEED_POSITION_GONE, a handler's crash: RAISE."""
    router = _router("proxy:1")
    member = router.current()
    assert member is not None
    member.reached = True
    assert not transport_end(refusal)
    assert router.after(member, refusal, retry=True, hops=0, stream=True) is Step.RAISE
    assert proxy_status(refusal) is None


def test_only_a_gateways_statuses_are_a_proxys_answer() -> None:
    """502, 503 and 504 (grpcio's and grpc-js's wording); not 500 or 404, not a server's
    refusal that quotes one."""
    assert [proxy_status(e) for e in (PROXY_503, PROXY_502_JS)] == [503, 502]
    for details in ("Received http2 header with status: 500", "Received HTTP status code 404"):
        assert proxy_status(Ended(U.UNKNOWN, details)) is None
    quoted = Ended(U.UNAVAILABLE, "Received HTTP status code 503", "STORAGE_IO_ERROR")
    assert proxy_status(quoted) is None


@pytest.mark.parametrize("answer", [PROXY_503, PROXY_502_JS])
def test_a_proxys_status_is_an_answer_not_an_unreachable_address(answer: Ended) -> None:
    """Before any server answered, a 503 is retried (a refused connection raises at once), and
    the error it turns into names the proxy's answer and the missing primary."""
    router = _router("proxy:1")
    member = router.current()
    assert member is not None
    assert router.after(member, answer, retry=True, hops=0) is Step.LATER
    assert router.after(member, answer, retry=False, hops=0) is Step.RAISE
    refused = Ended(U.UNAVAILABLE, "failed to connect to all addresses; connection refused")
    with pytest.raises(Unavailable, match="cannot reach"):
        router.after(member, refused, retry=True, hops=0)
    said = to_error(answer)
    assert isinstance(said, Unavailable)
    assert f"proxy answered HTTP {proxy_status(answer)}" in said.message
    assert "no primary" in said.message
