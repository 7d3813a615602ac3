"""Every write's result names the change-feed position --ack replica waits for: its own record's,
or, for a write that wrote nothing (a replayed request id, an empty append), the feed's head.
Real LMDB in a temporary folder."""

from __future__ import annotations

from pathlib import Path

from tests.integration.helpers import opened, user


def test_a_write_names_the_position_of_its_record(tmp_path: Path) -> None:
    """Appends, a fork and lease changes each get the next position; checksum_at finds it."""
    with opened(tmp_path / "d") as store:
        first = store.append("a", [user("one")])
        second = store.append("a", [user("two")], request_id="r")
        lease = store.submit_lease("acquire", "a", "w", 10**9).result()
        fork = store.submit_fork("a", 0, "b").result()
        assert [first.position, second.position, lease.position, fork.position] == [1, 2, 3, 4]
        assert store.head()[0] == 4
        assert store.checksum_at(4) is not None
        assert store.checksum_at(5) is None


def test_a_write_that_wrote_nothing_names_the_head(tmp_path: Path) -> None:
    """A replay returns the original events at the feed's head then (which covers the original
    write); an empty append likewise, so a reply never outruns what the replicas must hold."""
    with opened(tmp_path / "d") as store:
        original = store.append("a", [user("one")], request_id="r")
        store.append("b", [user("other")])
        replay = store.append("a", [user("one")], request_id="r")
        assert replay.events == original.events
        assert (original.position, replay.position) == (1, 2)
        assert store.append("a", []).position == 2
