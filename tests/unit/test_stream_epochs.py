"""An AppendStream's epochs in the Python clients (``_routing.StreamEpochs``): the epoch a
stream carries, and how each reply is judged by the one its server named as it opened."""

from __future__ import annotations

from typing import Any

import pytest

from sessionlog_client._routing import EPOCH_GROUP_KEY, EPOCH_KEY, Router, StreamEpochs
from sessionlog_client.errors import LeadershipLost, NotPrimary


def _router(*addresses: str) -> Router:
    def open_member(address: str) -> tuple[Any, dict[str, Any]]:
        return None, {}

    router = Router(addresses, open_member, several=len(addresses) > 1)
    router.open()
    return router


def _refusal(primary: str, epoch: int) -> NotPrimary:
    return NotPrimary("a replica", primary=primary, epoch=epoch)


def test_a_stream_carries_its_first_sessions_group_else_the_one_group_known() -> None:
    """The first append's group's epoch; with no group known for it, that of the only group."""
    router = _router("proxy:1")
    member = router.members[0]
    assert router.stream_metadata((), "alpha") == ()  # nothing learnt yet
    router.accepted(member, [(EPOCH_KEY, "7"), (EPOCH_GROUP_KEY, "g1")], "alpha")
    only = ((EPOCH_KEY, "7"), (EPOCH_GROUP_KEY, "g1"))
    assert router.stream_metadata((), "alpha") == only
    assert router.stream_metadata((), "unknown-slot") == only
    router.accepted(member, [(EPOCH_KEY, "3"), (EPOCH_GROUP_KEY, "g2")], "beta")
    assert router.stream_metadata((), "beta") == ((EPOCH_KEY, "3"), (EPOCH_GROUP_KEY, "g2"))
    assert router.stream_metadata((), "unknown-slot") == ()  # two groups: none to guess


def test_an_ack_is_judged_by_the_headers_against_the_epoch_seen_when_it_arrives() -> None:
    """Headers at 2: acknowledged while 2 is the highest seen, LeadershipLost once 3 is."""
    router = _router("a:1", "b:1")
    a, b = router.members
    stream = StreamEpochs(router, a)
    stream.opened([(EPOCH_KEY, "2")])
    assert router.epoch == 2
    stream.judge("s", None)
    router.accepted(b, [(EPOCH_KEY, "3")], "t")  # another reply: a newer primary
    with pytest.raises(LeadershipLost) as lost:
        stream.judge("s", None)
    assert lost.value.committed is True


def test_not_primary_in_a_stream_follows_a_current_hint_only() -> None:
    """A current server's hint becomes current; a deposed one's is passed over (next address)."""
    router = _router("replica:1", "primary:1", "third:1")
    replica, primary, _ = router.members
    stream = StreamEpochs(router, replica)
    stream.opened([(EPOCH_KEY, "2")])
    stream.judge("s", _refusal("primary:1", 2))
    assert router.current() is primary

    router.accepted(primary, [(EPOCH_KEY, "5")], "s")
    deposed = StreamEpochs(router, primary)
    deposed.opened([(EPOCH_KEY, "4")])  # opened below the epoch seen: deposed
    deposed.judge("s", _refusal("replica:1", 4))
    current = router.current()
    assert current is not None
    assert current.address == "third:1"  # its hint (replica:1) not followed
