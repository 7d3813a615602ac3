"""What the gRPC handlers count, for metrics: a few integer increments per call.

Written on the event loop thread only. ``service.metrics`` reads it at scrape time (copying the
dicts first), so nothing on a request's path touches a metrics library or a lock.
"""

from __future__ import annotations

from sessionlog.stats import SECONDS_BUCKETS, Histogram

OK = "OK"
"""The reason recorded for a call that succeeded."""
CANCELLED = "CANCELLED"
"""The reason recorded for a call the client cancelled (or the server stopped) midway."""
INTERNAL = "INTERNAL"


class Counters:
    """Unary calls by method and result reason, their latency, reply bytes, dropped events."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}
        """(method, reason) -> calls; reason is OK or the SPEC reason of the error."""
        self.latency: dict[str, Histogram] = {}
        """method -> seconds from the request's arrival at the handler to its reply."""
        self.sent_bytes = 0
        """Bytes of unary replies (stream bytes are counted by the StreamLimiter)."""
        self.dropped_events: dict[str, int] = {}
        """reason -> events a lenient Append dropped."""

    def record(self, method: str, reason: str, seconds: float, sent: int) -> None:
        key = (method, reason)
        self.requests[key] = self.requests.get(key, 0) + 1
        histogram = self.latency.get(method)
        if histogram is None:
            histogram = self.latency[method] = Histogram(SECONDS_BUCKETS)
        histogram.observe(seconds)
        self.sent_bytes += sent

    def dropped(self, reason: str) -> None:
        self.dropped_events[reason] = self.dropped_events.get(reason, 0) + 1
