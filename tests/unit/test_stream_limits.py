"""The stream limiter's counts: an AppendStream is bounded like a follow stream, paced not."""

from __future__ import annotations

import pytest

from sessionlog import errors
from sessionlog.service.limits import StreamLimiter


def test_append_streams_count_against_the_limits_but_not_the_pace() -> None:
    """Streams that follow no commits (``follows=False``) fill --max-streams as follow streams
    do, and leave the follow streams' pace as if they were not there."""
    limiter = StreamLimiter(max_total=3, max_per_connection=3, send_rate=10)
    limiter.acquire("a", follows=False)
    limiter.acquire("a", follows=False)
    assert limiter.pace() == 0.0
    limiter.acquire("b")
    assert limiter.pace() == pytest.approx(0.1)
    with pytest.raises(errors.TooManyStreams):
        limiter.acquire("c", follows=False)
    limiter.release("a", follows=False)
    limiter.release("a", follows=False)
    assert (limiter.total, limiter.unpaced) == (1, 0)
    assert limiter.pace() == pytest.approx(0.1)
