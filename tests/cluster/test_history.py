"""The history checker on made-up histories: a clean one passes, and each kind of anomaly,
planted alone, is caught (and only it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from tests.cluster.history import (
    KINDS,
    Append,
    Entry,
    EpochStart,
    Logs,
    check,
    check_groups,
    longest_gap,
)

EPOCHS = (EpochStart(1, "A", began_at=0.0), EpochStart(2, "B", began_at=10.0))


def appends() -> list[Append]:
    """A run with a failover from A (epoch 1) to B (epoch 2) at t=10."""
    return [
        Append("r1", "s", "A", 1.0, "ok", 1.1, seq=0, count=2, epoch=1),
        Append("r2", "s", "A", 2.0, "ok", 2.1, seq=2, epoch=1),
        Append("r3", "s", "A", 9.0, "timeout", 12.0),
        Append("r4", "s", "A", 11.0, "refused", 11.1, reason="NOT_PRIMARY"),
        Append("r5", "s", "B", 12.0, "ok", 12.1, seq=3, epoch=2),
        Append("r6", "t", "B", 13.0, "timeout", 16.0),
    ]


def log() -> dict[str, list[Entry]]:
    return {
        "s": [Entry(0, "r1", 0), Entry(1, "r1", 1), Entry(2, "r2"), Entry(3, "r5")],
        "t": [Entry(0, "r6")],
    }


def logs() -> dict[str, dict[str, list[Entry]]]:
    return {member: log() for member in ("A", "B", "C")}


def kinds(history: list[Append], final: Logs, epochs: tuple[EpochStart, ...] = EPOCHS) -> list[str]:
    return sorted({a.kind for a in check(history, final, "B", epochs)})


def test_a_clean_history_has_no_anomaly() -> None:
    """Failover, a timed-out append that landed and one that did not, a refusal: all fine."""
    assert check(appends(), logs(), "B", EPOCHS) == []


def test_an_acknowledged_append_missing_from_the_primary_is_lost() -> None:
    """r2 was acknowledged; the primary (and everyone) lost it, and seq 2 went to r5."""
    final = logs()
    for member in final.values():
        member["s"] = [Entry(0, "r1", 0), Entry(1, "r1", 1), Entry(2, "r5")]
    history = [dataclasses.replace(a, seq=2) if a.request_id == "r5" else a for a in appends()]
    assert kinds(history, final) == ["lost"]


def test_one_event_of_a_batch_missing_is_lost() -> None:
    """r1 had two events; the second one is gone (and the log stays dense)."""
    final = logs()
    for member in final.values():
        member["s"] = [Entry(0, "r1", 0), Entry(1, "r2"), Entry(2, "r5")]
    history = [
        dataclasses.replace(a, seq={"r2": 1, "r5": 2}[a.request_id])
        if a.request_id in ("r2", "r5")
        else a
        for a in appends()
    ]
    assert kinds(history, final) == ["lost"]


def test_an_append_present_twice_is_duplicated() -> None:
    """A retry of r5 applied again at seq 4 (on every member: they agree, wrongly)."""
    final = logs()
    for member in final.values():
        member["s"].append(Entry(4, "r5"))
    assert kinds(appends(), final) == ["duplicated"]


def test_an_append_at_another_seq_than_acknowledged_is_misplaced() -> None:
    history = [dataclasses.replace(a, seq=5) if a.request_id == "r5" else a for a in appends()]
    assert kinds(history, logs()) == ["misplaced"]


def test_an_event_nobody_sent_is_a_phantom() -> None:
    final = logs()
    for member in final.values():
        member["t"].append(Entry(1, "zz"))
    assert kinds(appends(), final) == ["phantom"]


def test_a_refused_append_on_the_primary_is_reported() -> None:
    final = logs()
    for member in final.values():
        member["s"].append(Entry(4, "r4"))
    assert kinds(appends(), final) == ["refused_present"]


def test_non_dense_seqs_are_a_gap() -> None:
    """A member whose log skips seq 1 (and so differs from the primary too)."""
    final = logs()
    final["C"]["s"] = [e for e in final["C"]["s"] if e.seq != 1]
    assert kinds(appends(), final) == ["diverged", "gap"]


def test_a_member_that_did_not_converge_diverged() -> None:
    """C lags one event behind: dense, but not the primary's log."""
    final = logs()
    final["C"]["s"] = final["C"]["s"][:-1]
    found = check(appends(), final, "B", EPOCHS)
    assert [a.kind for a in found] == ["diverged"]
    assert "C differs" in found[0].detail
    assert "from event 3" in found[0].detail


def test_two_servers_acknowledging_one_epoch_is_split_brain() -> None:
    """r6 acknowledged at epoch 2 by A as well as r5 by B (the epochs list left out, so only
    split_brain can see it)."""
    history = [
        dataclasses.replace(a, outcome="ok", seq=0, epoch=2, server="A")
        if a.request_id == "r6"
        else a
        for a in appends()
    ]
    assert kinds(history, logs(), epochs=()) == ["split_brain"]


def test_an_acknowledgement_from_a_server_that_did_not_lead_its_epoch() -> None:
    """r2 acknowledged at epoch 1 by B, which led only epoch 2 (r1 by A is at epoch 1 too)."""
    history = [dataclasses.replace(a, server="B") if a.request_id == "r2" else a for a in appends()]
    assert kinds(history, logs()) == ["split_brain", "wrong_leader"]


def test_a_deposed_primary_acknowledging_after_the_new_epoch_began_is_stale() -> None:
    """r5's twin: sent at t=12 (epoch 2 began at 10) and acknowledged by A at epoch 1."""
    history = [*appends(), Append("r7", "t", "A", 12.5, "ok", 12.6, seq=1, epoch=1)]
    final = logs()
    for member in final.values():
        member["t"].append(Entry(1, "r7"))
    assert kinds(history, final) == ["stale_ack"]


def test_an_append_sent_before_the_new_epoch_may_be_acknowledged_at_the_old_one() -> None:
    """Sent at 9.9, acknowledged at epoch 1 at 10.5: the old primary committed it in time."""
    history = [*appends(), Append("r7", "t", "A", 9.9, "ok", 10.5, seq=1, epoch=1)]
    final = logs()
    for member in final.values():
        member["t"].append(Entry(1, "r7"))
    assert check(history, final, "B", EPOCHS) == []


def test_behind_a_proxy_the_server_rules_skip_the_proxys_acknowledgements() -> None:
    """Acknowledged through a proxy: the history names the proxy, which led no epoch; a stale
    acknowledgement is still caught."""
    history = [dataclasses.replace(a, server="P") for a in appends()]
    assert check(history, logs(), "B", EPOCHS, proxy="P") == []
    assert sorted({a.kind for a in check(history, logs(), "B", EPOCHS)}) == ["wrong_leader"]
    late = [*history, Append("r7", "t", "P", 10.5, "ok", 10.6, seq=1, epoch=1)]
    final = logs()
    for member in final.values():
        member["t"].append(Entry(1, "r7"))
    assert [a.kind for a in check(late, final, "B", EPOCHS, proxy="P")] == ["stale_ack"]


GROUP_OF = {"s": "g1", "t": "g1", "u": "g2"}.__getitem__
"""Two groups: g1 owns s and t (the single-group history above), g2 owns u."""
G2_EPOCHS = (EpochStart(5, "X", began_at=0.0),)


def group_history() -> tuple[list[Append], dict[str, dict[str, dict[str, list[Entry]]]]]:
    """g1: the failover run above; g2: one member X (epoch 5, a higher epoch than g1's: each
    group's epochs are its own) and a replica Y, which took u's appends while g1 failed over."""
    history = [
        *appends(),
        Append("u1", "u", "X", 10.5, "ok", 10.6, seq=0, epoch=5),
        Append("u2", "u", "X", 11.5, "ok", 11.6, seq=1, epoch=5),
    ]
    u = [Entry(0, "u1"), Entry(1, "u2")]
    return history, {"g1": logs(), "g2": {"X": {"u": u}, "Y": {"u": list(u)}}}


def kinds_of_groups(history: list[Append], final: Mapping[str, Logs]) -> list[str]:
    epochs = {"g1": EPOCHS, "g2": G2_EPOCHS}
    found = check_groups(history, final, {"g1": "B", "g2": "X"}, GROUP_OF, epochs)
    return sorted({a.kind for a in found})


def test_groups_are_checked_each_against_their_own_epochs_and_primary() -> None:
    """Clean; g2's epoch 5 is above g1's 2 yet makes none of g1's acknowledgements stale."""
    history, final = group_history()
    assert kinds_of_groups(history, final) == []
    as_one = check(appends(), logs(), "B", (*EPOCHS, *G2_EPOCHS))
    assert {a.kind for a in as_one} == {"stale_ack"}, "g2's epochs would make g1's stale"


def test_a_session_in_a_group_that_does_not_own_it_is_misrouted() -> None:
    """u also in g1's member C (listed, its events unreadable there): misrouted, once."""
    history, final = group_history()
    final["g1"]["C"]["u"] = []
    found = check_groups(history, final, {"g1": "B", "g2": "X"}, GROUP_OF)
    assert [a.kind for a in found] == ["misrouted"]
    assert found[0].detail.startswith("g1: C holds session 'u'")


def test_an_anomaly_of_one_group_names_it() -> None:
    history, final = group_history()
    final["g2"]["X"]["u"] = final["g2"]["X"]["u"][:1]
    final["g2"]["Y"]["u"] = final["g2"]["Y"]["u"][:1]
    found = check_groups(history, final, {"g1": "B", "g2": "X"}, GROUP_OF)
    assert [(a.kind, a.detail[:3]) for a in found] == [("lost", "g2:")]


def test_appends_to_a_group_without_logs_are_an_error() -> None:
    history, final = group_history()
    del final["g2"]
    with pytest.raises(ValueError, match="no logs of the groups"):
        check_groups(history, final, {"g1": "B"}, GROUP_OF)


def test_the_longest_gap_between_acknowledgements() -> None:
    """Acknowledged at 1.1, 2.1, 11.1 (refused), 12.1 and 16.0 (a timeout): within [0, 14],
    the longest gap is 2.1 to 12.1; the window's edges count."""
    assert longest_gap(appends(), 0.0, 14.0) == pytest.approx((10.0, 2.1))
    assert longest_gap(appends(), 12.5, 20.0) == pytest.approx((7.5, 12.5))
    assert longest_gap([], 3.0, 4.0) == (1.0, 3.0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_planted_by_one_test_above(kind: str) -> None:
    """The list of kinds and the tests agree: no rule goes untested."""
    names = [name for name in globals() if name.startswith("test_")]
    words = {
        "lost": "lost",
        "misplaced": "misplaced",
        "duplicated": "duplicated",
        "phantom": "phantom",
        "refused_present": "refused",
        "gap": "gap",
        "diverged": "diverged",
        "split_brain": "split_brain",
        "wrong_leader": "did_not_lead",
        "stale_ack": "stale",
        "misrouted": "misrouted",
    }
    assert any(words[kind] in name for name in names)


def test_the_primary_must_have_a_log() -> None:
    with pytest.raises(ValueError, match="has no log"):
        check(appends(), logs(), "D", EPOCHS)
