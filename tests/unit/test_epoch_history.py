"""Epoch histories (``storage.leadership``): where two feeds part, and the record's rules."""

from __future__ import annotations

import pytest

from sessionlog import errors
from sessionlog.storage import leadership
from sessionlog.storage.leadership import FENCED, PRIMARY, REPLICA, Leadership


def test_the_cut_is_the_first_record_of_an_epoch_one_side_never_saw() -> None:
    """Old primary wrote on in epoch 1 past 100; the new one began epoch 2 at 101: cut 101."""
    old = ((1, 1),)
    new = ((1, 1), (2, 101))
    assert leadership.divergence(old, new, limit=106) == 101
    assert leadership.divergence(new, old, limit=106) == 101


def test_no_cut_when_the_histories_agree_up_to_the_shorter_feed() -> None:
    """A folder behind the new primary, on its history, keeps everything (cut = its head + 1)."""
    mine = ((1, 1), (2, 50))
    theirs = ((1, 1), (2, 50), (3, 90))
    assert leadership.divergence(mine, theirs, limit=81) == 81


def test_a_cut_inside_an_epoch_only_one_side_wrote_in() -> None:
    """Histories that agree on epoch 1 but where each began its own next epoch part where the
    earlier of the two began."""
    mine = ((1, 1), (2, 40))
    theirs = ((1, 1), (3, 45))
    assert leadership.divergence(mine, theirs, limit=60) == 40


def test_records_from_before_epochs_count_as_epoch_0() -> None:
    """An upgraded store whose first epoch began at 30 agrees with a replica of it up to 29."""
    assert leadership.epoch_at(((1, 30),), 29) == 0
    assert leadership.divergence(((1, 30),), ((1, 30), (2, 35)), limit=40) == 35


def test_promotion_takes_at_least_epoch_2_and_refuses_a_stale_one() -> None:
    """Epoch 1 belongs to a store's first primary (taken with its first write)."""
    fresh_replica = Leadership(role=REPLICA, primary="p:1")
    assert leadership.promoted(fresh_replica, 1) == Leadership(2, PRIMARY, "", ((2, 1),))
    seen_3 = Leadership(3, REPLICA, "p:1", ((1, 1), (3, 9)))
    assert leadership.promoted(seen_3, 12).history[-1] == (4, 12)
    assert leadership.promoted(seen_3, 12, epoch=10).epoch == 10
    with pytest.raises(errors.StaleEpoch):
        leadership.promoted(seen_3, 12, epoch=3)
    # A replica that has not yet received its primary's first record knows no epoch at all:
    # epoch 1 is still its primary's, never the promoted one's.
    with pytest.raises(errors.StaleEpoch):
        leadership.promoted(fresh_replica, 1, epoch=1)
    assert leadership.promoted(fresh_replica, 1, epoch=2).epoch == 2


def test_a_fence_stops_a_primary_and_only_records_the_epoch_elsewhere() -> None:
    """A newer epoch fences a primary; a replica keeps its role; an older one changes nothing."""
    primary = Leadership(1, PRIMARY, "", ((1, 1),))
    assert leadership.fenced(primary, 2, "n:2") == Leadership(2, FENCED, "n:2", ((1, 1),))
    assert leadership.fenced(primary, 1, "n:2") == primary
    replica = Leadership(1, REPLICA, "p:1", ((1, 1),))
    assert leadership.fenced(replica, 5, "") == Leadership(5, REPLICA, "p:1", ((1, 1),))
    refused = leadership.not_primary(leadership.fenced(primary, 2, "n:2"))
    assert refused.metadata == {"primary": "n:2", "epoch": "2"}


def test_the_record_round_trips() -> None:
    record = Leadership(4, FENCED, "[::1]:5", ((1, 1), (4, 77)))
    assert Leadership.decode(record.encode()) == record


def test_a_replica_that_turns_to_a_new_primary_names_it_and_keeps_its_history() -> None:
    """A replica told of the primary of a newer epoch records that primary (writes refused
    there name it) and the epoch, whatever it knew before, and the primary it turned from (its
    --replica-of); its history is untouched (it holds no record of the new epoch yet). A folder
    that takes writes is fenced instead."""
    replica = Leadership(2, REPLICA, "old:1", ((1, 1),))
    turned = leadership.followed(replica, 2, "new:2")
    assert turned == Leadership(2, REPLICA, "new:2", ((1, 1),), turned_from="old:1")
    again = leadership.followed(turned, 3, "newer:3")  # still from the --replica-of it opened with
    assert (again.primary, again.turned_from) == ("newer:3", "old:1")
    assert leadership.followed(Leadership(1, REPLICA, "old:1", ((1, 1),)), 3, "new:2").epoch == 3
    primary = Leadership(1, PRIMARY, "", ((1, 1),))
    assert leadership.followed(primary, 2, "new:2") == Leadership(2, FENCED, "new:2", ((1, 1),))


def test_a_caller_that_saw_a_newer_epoch_is_refused_and_nothing_changes() -> None:
    """A write from a caller that has seen epoch 3 is refused by a primary at epoch 2
    (NOT_PRIMARY naming no primary, the folder's epoch); at or below its epoch it goes on."""
    primary = Leadership(2, PRIMARY, "", ((1, 1), (2, 9)))
    refusal = leadership.behind(primary, 3)
    assert isinstance(refusal, errors.NotPrimary)
    assert refusal.metadata == {"primary": "", "epoch": "2"}
    assert "seen epoch 3" in refusal.message
    assert leadership.behind(primary, 2) is None
    assert leadership.behind(primary, 0) is None


def test_an_election_takes_its_epoch_from_any_role_and_is_idempotent() -> None:
    """A group member that wins epoch E takes it as a fresh folder, a replica, a fenced former
    primary, or a primary of an older epoch (a member that led before); already leading at E
    changes nothing; an epoch below what the folder knows is refused."""
    fresh = Leadership()
    assert leadership.elected(fresh, 1, 7) == Leadership(7, PRIMARY, "", ((7, 1),))
    replica = Leadership(5, REPLICA, "a:1", ((5, 1),))
    assert leadership.elected(replica, 30, 9) == Leadership(9, PRIMARY, "", ((5, 1), (9, 30)))
    old_primary = Leadership(5, PRIMARY, "", ((5, 1),))
    assert leadership.elected(old_primary, 30, 9).history == ((5, 1), (9, 30))
    leading = Leadership(9, PRIMARY, "", ((5, 1), (9, 30)))
    assert leadership.elected(leading, 44, 9) is leading
    # Fenced at E by a feed reader that learnt E from the new leader's followers: still E's.
    told = Leadership(9, FENCED, "", ((5, 1),))
    assert leadership.elected(told, 30, 9).role == PRIMARY
    with pytest.raises(errors.StaleEpoch):
        leadership.elected(leading, 44, 8)
    with pytest.raises(errors.StaleEpoch):
        leadership.elected(replica, 30, 5)


def test_a_follower_names_its_leader_and_takes_no_writes() -> None:
    """``following`` keeps the epoch and history, and refuses writes naming the leader."""
    fenced = Leadership(9, FENCED, "", ((5, 1),))
    record = leadership.following(fenced, "b:2")
    assert record == Leadership(9, REPLICA, "b:2", ((5, 1),))
    assert not record.may_write
    assert leadership.not_primary(record).metadata["primary"] == "b:2"
