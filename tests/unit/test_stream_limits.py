"""The stream limiter's counts, and the send budget its caught-up follow streams share."""

from __future__ import annotations

import pytest

from sessionlog import errors
from sessionlog.service.limits import SendBudget, StreamLimiter


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_append_streams_and_follow_streams_fill_the_same_limit() -> None:
    """Every stream counts against --max-streams, whatever it carries, and leaves its place
    when released."""
    limiter = StreamLimiter(max_total=3, max_per_connection=3, send_rate=10)
    limiter.acquire("a")
    limiter.acquire("a")
    limiter.acquire("b")
    with pytest.raises(errors.TooManyStreams):
        limiter.acquire("c")
    limiter.release("a")
    limiter.release("a")
    assert limiter.total == 1
    limiter.acquire("c")


def test_open_streams_do_not_slow_a_stream_the_budget_can_serve() -> None:
    """The pace is the budget's, not a turn per open stream: with a thousand streams open at
    10 responses/s, the first live response still goes at once."""
    limiter = StreamLimiter(max_total=2000, max_per_connection=2000, send_rate=10)
    for _ in range(1000):
        limiter.acquire("a")
    assert limiter.pace() == 0.0


def test_a_full_budget_sends_its_burst_at_once_then_one_per_interval() -> None:
    """Up to ``burst`` sends go at once; each later one waits its own interval, in the order
    asked, so the sends per second stay at the rate however many streams ask."""
    clock = Clock()
    budget = SendBudget(1000, burst=3, clock=clock)
    waits = [budget.reserve() for _ in range(6)]
    assert waits[:3] == pytest.approx([0.0, 0.0, 0.0], abs=1e-9)
    assert waits[3:] == pytest.approx([0.001, 0.002, 0.003])


def test_the_budget_refills_at_its_rate_up_to_the_burst() -> None:
    """Unused time refills the bucket at the rate, never past the burst: after a long idle
    spell only ``burst`` sends go at once."""
    clock = Clock()
    budget = SendBudget(100, burst=2, clock=clock)
    assert [budget.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.01], abs=1e-9)
    clock.now += 0.02  # one interval since the third came due: one token back
    assert budget.reserve() == pytest.approx(0.0, abs=1e-9)
    assert budget.reserve() == pytest.approx(0.01)
    clock.now += 60.0
    assert [budget.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.01], abs=1e-9)


def test_the_default_burst_is_a_few_milliseconds_of_the_rate() -> None:
    """5 ms of the rate, and never less than one send (a rate of 1/s still sends at once)."""
    assert SendBudget(5000).burst == 25
    assert SendBudget(1).burst == 1
    with pytest.raises(ValueError, match="positive"):
        SendBudget(0)
