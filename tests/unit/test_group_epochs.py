"""Epochs per group: two groups elect their leaders apart, so one client writing to both (through
HAProxy) keeps one highest epoch per group and sends each write its own group's."""

from __future__ import annotations

from typing import Any

import pytest

from sessionlog import errors
from sessionlog.service.servicer import caller_epoch
from sessionlog_client._routing import EPOCH_GROUP_KEY, EPOCH_KEY, Member, Router
from sessionlog_client._shards import slot_of
from sessionlog_client.errors import LeadershipLost


def _router() -> Router:
    def open_member(address: str) -> tuple[Any, dict[str, Any]]:
        return None, {}

    router = Router(["proxy:1"], open_member, several=False)
    router.open()
    return router


def _member(router: Router) -> Member:
    member = router.current()
    assert member is not None
    return member


def test_a_server_ignores_an_epoch_of_another_group() -> None:
    """g2 takes no notice of g1's epoch; its own, or one that names no group, counts."""
    g1 = [(EPOCH_KEY, "11"), (EPOCH_GROUP_KEY, "g1")]
    assert caller_epoch(g1, "g1") == 11
    assert caller_epoch(g1, "g2") == 0
    assert caller_epoch([(EPOCH_KEY, "11")], "g2") == 11  # a client that names no group
    assert caller_epoch([], "g2") == 0
    with pytest.raises(errors.MalformedRequest):
        caller_epoch([(EPOCH_KEY, "x"), (EPOCH_GROUP_KEY, "g2")], "g2")


def test_the_client_keeps_one_epoch_per_group_and_sends_the_sessions_own() -> None:
    """After g1 answered at 11 and g2 at 9, a write for g2's session carries 9 and 'g2'."""
    router = _router()
    member = _member(router)
    a, b = "alpha", "beta"
    assert slot_of(a) != slot_of(b)
    assert router.write_metadata((), a) == ()  # nothing learnt yet
    router.accepted(member, [(EPOCH_KEY, "11"), (EPOCH_GROUP_KEY, "g1")], a)
    router.accepted(member, [(EPOCH_KEY, "9"), (EPOCH_GROUP_KEY, "g2")], b)
    assert router.write_metadata((), a) == ((EPOCH_KEY, "11"), (EPOCH_GROUP_KEY, "g1"))
    assert router.write_metadata((), b) == ((EPOCH_KEY, "9"), (EPOCH_GROUP_KEY, "g2"))
    assert router.write_metadata((), "a-session-of-an-unknown-slot") == ()
    assert router.epoch == 11


def test_a_lower_epoch_of_the_same_group_is_still_a_deposed_leader() -> None:
    """Per group, the fence holds: g1 answering at 10 after 11 is not an acknowledgement."""
    router = _router()
    member = _member(router)
    router.accepted(member, [(EPOCH_KEY, "11"), (EPOCH_GROUP_KEY, "g1")], "alpha")
    router.accepted(member, [(EPOCH_KEY, "3"), (EPOCH_GROUP_KEY, "g2")], "beta")  # g2's own
    with pytest.raises(LeadershipLost):
        router.accepted(member, [(EPOCH_KEY, "10"), (EPOCH_GROUP_KEY, "g1")], "alpha")


def test_without_groups_it_is_one_epoch_as_before() -> None:
    """An unsharded server names no group: every write carries the highest epoch seen."""
    router = _router()
    member = _member(router)
    router.accepted(member, [(EPOCH_KEY, "4")], "alpha")
    assert router.write_metadata((("k", "v"),), "beta") == (("k", "v"), (EPOCH_KEY, "4"))
    with pytest.raises(LeadershipLost):
        router.accepted(member, [(EPOCH_KEY, "3")], "beta")
