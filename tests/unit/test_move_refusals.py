"""A slot move's refusals in the client's router: SLOT_MOVING and WRONG_GROUP wrote nothing, so
every call waits and tries them again on the same member (WRONG_GROUP for ``wrong_group_for``
only), unless a shard-map client reroutes WRONG_GROUP itself."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from sessionlog_client import Retry
from sessionlog_client._routing import Router, Step, move_budget


class Refusal(grpc.RpcError):  # type: ignore[misc]
    """An RpcError as grpc raises it, with a sessionlog ErrorInfo."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(domain="sessionlog", reason=reason))
        status = status_pb2.Status(code=code.value[0], message=reason, details=[info])
        self._code = code
        self._trailers = (("grpc-status-details-bin", status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused"

    def trailing_metadata(self) -> Any:
        return self._trailers


def _router(*addresses: str) -> Router:
    router = Router(list(addresses), lambda _: (None, {}), several=len(addresses) > 1)
    router.open()
    return router


SLOT_MOVING = Refusal(grpc.StatusCode.UNAVAILABLE, "SLOT_MOVING")
WRONG_GROUP = Refusal(grpc.StatusCode.FAILED_PRECONDITION, "WRONG_GROUP")


@pytest.mark.parametrize("addresses", [("proxy:1",), ("m1:1", "m2:1")])
@pytest.mark.parametrize("retry", [True, False])
def test_every_call_waits_out_a_move_on_the_same_member(
    addresses: tuple[str, ...], retry: bool
) -> None:
    """SLOT_MOVING and WRONG_GROUP: LATER, retried or not, and the current member stays."""
    router = _router(*addresses)
    member = router.current()
    assert member is not None
    for refusal in (SLOT_MOVING, WRONG_GROUP):
        assert router.after(member, refusal, retry=retry, hops=0) is Step.LATER
        assert router.current() is member


def test_a_shard_map_client_gets_wrong_group_at_once() -> None:
    """With retry_wrong_group off (the clients of a shard_map= client) WRONG_GROUP is raised
    to the shard routing, and SLOT_MOVING still waited out."""
    router = _router("g1:1")
    router.retry_wrong_group = False
    member = router.current()
    assert member is not None
    assert router.after(member, WRONG_GROUP, retry=True, hops=0) is Step.RAISE
    assert router.after(member, SLOT_MOVING, retry=True, hops=0) is Step.LATER


def test_wrong_group_has_a_budget_of_its_own() -> None:
    """WRONG_GROUP is retried for wrong_group_for seconds (0: not at all), SLOT_MOVING for the
    whole give_up_after."""
    retry = Retry(give_up_after=30.0, wrong_group_for=0.0)
    assert move_budget(WRONG_GROUP, retry) == 0.0
    assert move_budget(SLOT_MOVING, retry) is None
    backoff = retry.backoff()
    assert backoff.next(move_budget(WRONG_GROUP, retry)) is None
    assert retry.backoff().next(move_budget(SLOT_MOVING, retry)) is not None
