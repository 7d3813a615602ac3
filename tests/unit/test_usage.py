"""The usage ledger's pure part: usage validation, per-model sums, own and tree usage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog import errors
from sessionlog.fold import (
    MAX_USAGE_TOKENS,
    ModelTotals,
    fold_usage,
    own_usage,
    sum_usage,
    tree_usage,
    usage_problem,
)
from sessionlog.storage.schema import UsageRecord
from sessionlog.v1.event_pb2 import Event, Usage
from tests.unit._events import ASSISTANT, HIDE, STEP_END, USER, ev, lenient, log, strict_error, text


def spent(event: Event, model: str, i: int = 0, o: int = 0, c: int = 0, r: int = 0) -> Event:
    """The event, carrying a usage of ``model``."""
    event.usage.CopyFrom(
        Usage(
            model=model, input_tokens=i, output_tokens=o, cached_input_tokens=c, reasoning_tokens=r
        )
    )
    return event


def test_no_usage_means_no_totals() -> None:
    """A log whose events carry no usage has no totals (not a zero row per model)."""
    assert fold_usage(log([text("a"), text("b", ASSISTANT)])) == {}


def test_totals_are_summed_per_model() -> None:
    """Each field is summed per model, and event_count counts the events that named it."""
    events = log(
        [
            text("q"),
            spent(text("a", ASSISTANT), "gpt", i=100, o=20, c=40, r=5),
            spent(ev(STEP_END), "gpt", i=50, o=10),
            spent(text("b", ASSISTANT), "gemini", i=7, o=3, r=1),
        ]
    )
    assert fold_usage(events) == {
        "gpt": ModelTotals(150, 30, 40, 5, 2),
        "gemini": ModelTotals(7, 3, 0, 1, 1),
    }


def test_shadowed_and_hidden_events_still_count() -> None:
    """A replace or hide changes the surface, never the totals: the tokens were spent."""
    events = log(
        [
            spent(text("a", ASSISTANT), "m", i=10, o=1),
            spent(text("b", ASSISTANT), "m", i=20, o=2),
            spent(text("sum", ASSISTANT, replace=(0, 1)), "m", i=5, o=1),
            ev(HIDE, replace=(2, 2)),
        ]
    )
    assert fold_usage(events) == {"m": ModelTotals(35, 4, 0, 0, 3)}


def test_start_seq_leaves_out_a_forks_copied_prefix() -> None:
    """fold_usage(events, n) counts seqs n.. only: a fork's own usage from parent_event_count."""
    events = log([spent(text(str(i), ASSISTANT), "m", i=10 * (i + 1)) for i in range(4)])
    assert fold_usage(events, 2) == {"m": ModelTotals(30 + 40, 0, 0, 0, 2)}
    assert fold_usage(events, 4) == {}


def test_own_usage_subtracts_the_inherited_part() -> None:
    """own = totals - inherited, per model; a model spent only before the cut drops out."""
    totals = {"a": ModelTotals(10, 5, 0, 0, 3), "b": ModelTotals(4, 4, 0, 0, 1)}
    inherited = {"a": ModelTotals(6, 1, 0, 0, 2), "b": ModelTotals(4, 4, 0, 0, 1)}
    assert own_usage(totals, inherited) == {"a": ModelTotals(4, 4, 0, 0, 1)}


def test_a_tree_counts_copied_events_once() -> None:
    """A parent and its fork: the tree is the parent's totals plus the fork's own part only."""
    parent = log([spent(text(str(i), ASSISTANT), "m", i=100) for i in range(3)])
    own = spent(text("z", ASSISTANT), "m", i=7)
    own.seq = 2
    child = [*parent[:2], own]  # a fork at seq 1, then one event of its own
    child_totals, copied = fold_usage(child), fold_usage(child[:2])
    assert child_totals == {"m": ModelTotals(207, 0, 0, 0, 3)}
    tree = tree_usage(fold_usage(parent), [own_usage(child_totals, copied)])
    assert tree == {"m": ModelTotals(307, 0, 0, 0, 4)}


def test_sum_usage_does_not_alias_its_inputs() -> None:
    """Summing copies: adding more later leaves the parts as they were."""
    part = {"m": ModelTotals(1, 1, 0, 0, 1)}
    total = sum_usage([part])
    total["m"].add(Usage(model="m", input_tokens=5))
    assert part == {"m": ModelTotals(1, 1, 0, 0, 1)}
    assert sum_usage([part, part, {"n": ModelTotals(2, 0, 0, 0, 1)}]) == {
        "m": ModelTotals(2, 2, 0, 0, 2),
        "n": ModelTotals(2, 0, 0, 0, 1),
    }


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        (Usage(input_tokens=3), "model"),
        (Usage(model="x" * 257), "model"),
        (Usage(model="gpt\n5"), "model"),
        (Usage(model="m", input_tokens=MAX_USAGE_TOKENS + 1), "input_tokens"),
        (Usage(model="m", input_tokens=1, output_tokens=1 << 40), "output_tokens"),
        (Usage(model="m", input_tokens=4, cached_input_tokens=5), "cached_input_tokens"),
        (Usage(model="m", output_tokens=1, reasoning_tokens=2), "reasoning_tokens"),
    ],
)
def test_bad_usage_is_named_by_field(usage: Usage, field: str) -> None:
    """Each rule names the field it failed on."""
    problem = usage_problem(usage)
    assert problem is not None
    assert problem[0] == field


def test_good_usage_passes() -> None:
    """Zero counts, the limits themselves and a non-ASCII model are fine."""
    assert usage_problem(Usage(model="m")) is None
    top = MAX_USAGE_TOKENS
    assert usage_problem(Usage(model="m", input_tokens=top, cached_input_tokens=top)) is None
    assert usage_problem(Usage(model="modèle-" + "x" * 240)) is None


def test_an_append_with_bad_usage_fails_with_invalid_usage() -> None:
    """Strict: the whole append fails naming the event and field; lenient: that event drops."""
    good = spent(text("ok", ASSISTANT), "m", i=1)
    bad = spent(ev(STEP_END), "m", i=1, c=2)
    error = strict_error([good, bad])
    assert isinstance(error, errors.InvalidUsage)
    assert error.metadata == {"index": "1", "field": "usage.cached_input_tokens"}
    assert lenient([good, bad, text("after", USER)]) == ([0, 2], [(1, "INVALID_USAGE")])


def test_usage_record_round_trips() -> None:
    """The ledger's packed row decodes to what was encoded; another format is refused."""
    record = UsageRecord(ModelTotals(1, 2, 3, 4, 5), ModelTotals(6, 7, 8, 9, 10))
    raw = record.encode()
    assert UsageRecord.decode(raw) == record
    with pytest.raises(ValueError, match="format"):
        UsageRecord.decode(b"\x09" + raw[1:])


@st.composite
def spending_logs(draw: st.DrawFn) -> list[Event]:
    """A log where some events carry a usage of one of three models."""
    events = []
    for _ in range(draw(st.integers(min_value=0, max_value=30))):
        event = text("x", ASSISTANT)
        if draw(st.booleans()):
            counts = st.integers(min_value=0, max_value=1000)
            spent(event, draw(st.sampled_from(["a", "b", "c"])), draw(counts), draw(counts))
        events.append(event)
    return log(events)


@settings(max_examples=200, deadline=None)
@given(spending_logs(), st.data())
def test_totals_add_up_over_any_cut(events: list[Event], data: st.DataObject) -> None:
    """Totals are additive: the ledger's per-append sums equal one fold of the whole log, and a
    fork's copied part plus its own part is its whole (so a tree counts each event once)."""
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    appended = sum_usage([fold_usage(events[:cut]), fold_usage(events[cut:])])
    assert appended == fold_usage(events)
    whole, copied = fold_usage(events), fold_usage(events[:cut])
    assert sum_usage([copied, own_usage(whole, copied)]) == whole
    assert own_usage(whole, copied) == fold_usage(events, cut)
