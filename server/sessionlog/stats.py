"""Fixed-bucket histograms the hot paths fill with one bisect and two additions.

Storage and service code count here without importing a metrics library; ``service.metrics``
reads these at scrape time and exposes them in Prometheus' format. Each histogram is written by
one thread (the writer thread, or the event loop); a reader in another thread may see an
observation in ``counts`` a moment before it shows in ``sum``, never a torn integer.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds for durations: 100 µs to 10 s."""

GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Upper bounds for the number of commands sharing one commit (the writer takes at most 256)."""


class Histogram:
    """How many observations fell at or under each bound (not cumulative), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """One slot per bound, then one for observations above every bound."""
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(bound, observations at or under it) for each bound, then (inf, all of them)."""
        counts = list(self.counts)
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            out.append((bound, running))
        return out
