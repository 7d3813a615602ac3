"""The leadership record in the writer's transaction, over a real LMDB: epochs stamped on the
records, NOT_PRIMARY from the record, and the ``may_write`` hook before apply and before reply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb


def user(text: str) -> event_pb2.Event:
    made = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    made.data.update({"content": text})
    return made


def epochs(store: Store) -> list[int]:
    return [rpb.Change.FromString(raw).epoch for raw in store.read_changes(1)]


def test_the_first_write_takes_epoch_1_and_every_record_carries_it(store: Store) -> None:
    """A fresh folder is a primary at epoch 0; its first write takes epoch 1 at position 1."""
    assert store.leadership().epoch == 0
    store.append("s", [user("a")])
    store.submit_lease("acquire", "s", "w", ttl_ns=10**9).result()
    store.append("s", [user("b")], lease_holder="w")
    assert epochs(store) == [1, 1, 1]
    assert store.leadership().history == ((1, 1),)


def test_a_fence_refuses_every_write_also_after_reopening(tmp_path: Path) -> None:
    """After a fence, appends, creates, forks and leases fail NOT_PRIMARY with the new primary
    and epoch, writing nothing; reopened as a primary, the folder still refuses."""
    store = Store(tmp_path / "data")
    try:
        store.append("s", [user("a")])
        store.submit_fence(4, "n:9").result()
        attempts: list[Callable[[], object]] = [
            lambda: store.append("s", [user("b")]),
            lambda: store.append("new", [user("b")], create_only=True),
            lambda: store.submit_fork("s", None, "child").result(),
            lambda: store.submit_lease("acquire", "s", "w", ttl_ns=10**9).result(),
        ]
        for attempt in attempts:
            with pytest.raises(errors.NotPrimary) as caught:
                attempt()
            assert caught.value.metadata == {"primary": "n:9", "epoch": "4"}
        assert store.head()[0] == 1
    finally:
        store.close()
    reopened = Store(tmp_path / "data")
    try:
        with pytest.raises(errors.NotPrimary):
            reopened.append("s", [user("c")])
        assert reopened.head()[0] == 1
    finally:
        reopened.close()


def test_may_write_off_before_apply_writes_nothing(tmp_path: Path) -> None:
    """A hook that says no refuses the write with LEADERSHIP_LOST before anything is written."""
    store = Store(tmp_path / "data", may_write=lambda: False)
    try:
        with pytest.raises(errors.LeadershipLost) as caught:
            store.append("s", [user("a")])
        assert caught.value.metadata["committed"] == "False"
        assert store.head()[0] == 0
    finally:
        store.close()


def test_may_write_off_after_the_commit_is_not_acknowledged(tmp_path: Path) -> None:
    """A hook that turns off while the group commits: the write is stored, but its caller gets
    LEADERSHIP_LOST (UNAVAILABLE), never a success; a retry by request id finds it."""
    answers = iter([True, False])
    store = Store(tmp_path / "data", may_write=lambda: next(answers, True))
    try:
        with pytest.raises(errors.LeadershipLost) as caught:
            store.append("s", [user("a")], request_id="r1")
        assert caught.value.metadata["committed"] == "True"
        assert store.head()[0] == 1
        again = store.append("s", [user("a")], request_id="r1")
        assert again.next_seq == 1
        assert store.head()[0] == 1
    finally:
        store.close()


def test_a_promotion_takes_a_new_epoch_and_history(tmp_path: Path) -> None:
    """A replica folder promoted in place takes epoch 2 from its next position and a new
    history id; its writes then carry epoch 2."""
    primary = Store(tmp_path / "data")
    primary.append("s", [user("a")])
    primary.close()
    replica = Store(tmp_path / "data", StoreConfig(replica_of="p:1"))
    try:
        with pytest.raises(errors.NotPrimary):
            replica.append("s", [user("b")])
        history_before = replica.history()[0]
        before, after = replica.submit_promote().result()
        assert (before.role, after.role, after.epoch) == ("replica", "primary", 2)
        assert after.history == ((1, 1), (2, 2))
        assert replica.history()[0] != history_before
        replica.append("s", [user("b")])
        assert epochs(replica) == [1, 2]
        with pytest.raises(errors.AlreadyPrimary):
            replica.submit_promote().result()
    finally:
        replica.close()


def test_a_replica_keeps_the_primary_it_turned_to_until_its_replica_of_changes(
    tmp_path: Path,
) -> None:
    """A replica opened with --replica-of A that turned to B by itself (A deposed by epoch 3,
    naming B) and then to C follows C when opened again with the same, stale, --replica-of A;
    opened with any other --replica-of, it follows that one (the operator chose), and the
    record forgets the turn."""
    data = tmp_path / "data"
    store = Store(data, StoreConfig(replica_of="a:1"))
    try:
        assert store.leadership().primary == "a:1"
        store.submit_follow(3, "b:1").result()
        store.submit_follow(4, "c:1").result()
        turned = store.leadership()
        assert (turned.primary, turned.turned_from, turned.epoch) == ("c:1", "a:1", 4)
    finally:
        store.close()
    store = Store(data, StoreConfig(replica_of="a:1"))
    try:
        kept = store.leadership()
        assert (kept.role, kept.primary, kept.turned_from) == ("replica", "c:1", "a:1")
        with pytest.raises(errors.NotPrimary):
            store.append("s", [user("x")])
    finally:
        store.close()
    store = Store(data, StoreConfig(replica_of="d:1"))
    try:
        chosen = store.leadership()
        assert (chosen.role, chosen.primary, chosen.turned_from) == ("replica", "d:1", "")
    finally:
        store.close()
    store = Store(data, StoreConfig(replica_of="a:1"))
    try:
        assert store.leadership().primary == "a:1"  # the turn was forgotten with d:1
    finally:
        store.close()
