"""Prometheus metrics, read at scrape time from counters the server keeps anyway.

Nothing here runs on a request's path: the handlers bump plain integers (``Counters``,
``StreamLimiter``, ``WriterStats``) and :class:`SessionLogCollector` turns them into metric
families when Prometheus scrapes ``--metrics-listen``. Store-wide numbers (sessions, events, map
usage) come from LMDB's O(1) bookkeeping (``storage.usage``).

The same readings feed the web console's status panel through :func:`status`.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sessionlog.service.counters import Counters
from sessionlog.service.limits import StreamLimiter
from sessionlog.service.replication import ReplicaState
from sessionlog.stats import Histogram
from sessionlog.storage.store import Store
from sessionlog.storage.usage import usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Observed(Protocol):
    """What the metrics read from a running server (``SessionLogServer`` provides it)."""

    @property
    def store(self) -> Store | None: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def streams(self) -> StreamLimiter: ...

    @property
    def replica(self) -> ReplicaState | None: ...


def version() -> str:
    try:
        return metadata.version("sessionlog")
    except metadata.PackageNotFoundError:
        return "unknown"


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _add(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    buckets = [(_le(bound), count) for bound, count in histogram.cumulative()]
    family.add_metric(labels, buckets, histogram.sum)


class SessionLogCollector(Collector):
    """Every sessionlog metric, computed from the server's counters when scraped."""

    def __init__(self, server: Observed) -> None:
        self._server = server
        self._version = version()

    def describe(self) -> list[Metric]:
        return []  # registered without a trial collect: the store may not be open yet

    def collect(self) -> Iterator[Metric]:
        server = self._server
        role = "replica" if server.replica is not None else "primary"
        info = GaugeMetricFamily(
            "sessionlog_info", "This server's version and role", labels=["version", "role"]
        )
        info.add_metric([self._version, role], 1)
        yield info
        yield from self._requests(server.counters)
        yield from self._streams(server.streams, server.counters)
        if server.store is not None:
            yield from self._storage(server.store)
        if server.replica is not None:
            yield from self._replica(server.replica)

    def _requests(self, counters: Counters) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "sessionlog_requests",
            "Unary calls handled, by method and result reason (OK, or the error's reason)",
            labels=["method", "reason"],
        )
        for (method, reason), count in sorted(dict(counters.requests).items()):
            requests.add_metric([method, reason], count)
        yield requests
        latency = _histogram(
            "sessionlog_request_duration_seconds",
            "Time from a unary call reaching its handler to its reply (Append: durable)",
            ["method"],
        )
        for method, histogram in sorted(dict(counters.latency).items()):
            _add(latency, [method], histogram)
        yield latency
        dropped = CounterMetricFamily(
            "sessionlog_dropped_events",
            "Events a lenient Append dropped, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(dict(counters.dropped_events).items()):
            dropped.add_metric([reason], count)
        yield dropped

    def _streams(self, streams: StreamLimiter, counters: Counters) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "sessionlog_open_streams",
            "Open follow streams: Since, Changes and web console follows",
            value=streams.total,
        )
        yield CounterMetricFamily(
            "sessionlog_streams", "Follow streams opened since start", value=streams.opened
        )
        sent = CounterMetricFamily(
            "sessionlog_sent_bytes",
            "Bytes of replies sent: unary replies and stream responses",
            labels=["kind"],
        )
        sent.add_metric(["unary"], counters.sent_bytes)
        sent.add_metric(["stream"], streams.sent_bytes)
        yield sent

    def _storage(self, store: Store) -> Iterator[Metric]:
        stats = store.writer.stats
        yield CounterMetricFamily(
            "sessionlog_appended_events",
            "Events written (appends, creates, seeds, forks), counted at commit",
            value=stats.events,
        )
        yield CounterMetricFamily(
            "sessionlog_commits", "Write transactions committed", value=stats.commits
        )
        refused = CounterMetricFamily(
            "sessionlog_storage_write_errors",
            "Writes the storage refused, by reason and cause (STORAGE_FULL: map or disk; "
            "STORAGE_IO_ERROR: io or panic)",
            labels=["reason", "cause"],
        )
        for (reason, cause), count in sorted(dict(stats.write_errors).items()):
            refused.add_metric([reason, cause], count)
        yield refused
        groups = _histogram(
            "sessionlog_commit_group_size",
            "Commands that shared one group commit (one transaction, one fsync)",
            [],
        )
        _add(groups, [], stats.group_sizes)
        yield groups
        commits = _histogram(
            "sessionlog_commit_duration_seconds",
            "Time to commit one group, its fsync included",
            [],
        )
        _add(commits, [], stats.commit_seconds)
        yield commits
        used = usage(store.env, store.tables)
        yield GaugeMetricFamily("sessionlog_sessions", "Sessions stored", value=used.sessions)
        yield GaugeMetricFamily(
            "sessionlog_stored_events", "Events stored over every session", value=used.events
        )
        yield GaugeMetricFamily(
            "sessionlog_lmdb_map_size_bytes",
            "The most the data file may grow to (--map-size)",
            value=used.map_size,
        )
        yield GaugeMetricFamily(
            "sessionlog_lmdb_used_bytes",
            "Bytes of the LMDB map in use; STORAGE_FULL when it reaches the map size",
            value=used.used_bytes,
        )
        yield GaugeMetricFamily(
            "sessionlog_lmdb_readers", "LMDB reader slots in use", value=used.readers
        )
        yield GaugeMetricFamily(
            "sessionlog_replication_position",
            "Newest change-feed position stored here (primary: written; replica: applied)",
            value=used.position,
        )
        yield GaugeMetricFamily(
            "sessionlog_replication_head_commit_time_seconds",
            "Commit time of the newest change stored here, Unix seconds (0: none)",
            value=used.head_commit_ns / 1e9,
        )

    def _replica(self, state: ReplicaState) -> Iterator[Metric]:
        gauges = (
            ("primary_position", "Newest position the primary reported", state.primary_position),
            (
                "lag_positions",
                "Changes the primary has that this replica has not applied",
                state.lag_positions,
            ),
            (
                "lag_seconds",
                "Commit-time distance between the primary's head and this replica's",
                state.lag_ns / 1e9,
            ),
            ("connected", "1 while the replica is connected to its primary", int(state.connected)),
            (
                "caught_up",
                "1 once the replica has caught up with its primary (never while diverged)",
                int(state.caught_up and not state.diverged),
            ),
            (
                "diverged",
                "1 once the replica found its data is not on its primary's history",
                int(state.diverged),
            ),
            (
                "last_contact_time_seconds",
                "When the primary was last heard from, Unix seconds",
                state.last_contact_ns / 1e9,
            ),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(f"sessionlog_replication_{name}", doc, value=value)


def registry(server: Observed) -> CollectorRegistry:
    """A registry of its own (several servers may share a process in tests), with the process
    metrics (memory, CPU, open files) beside sessionlog's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SessionLogCollector(server))
    ProcessCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format."""
    return generate_latest(registry)


def status(server: Observed, listen: str = "") -> dict[str, Any]:
    """The numbers the web console shows at a glance, as JSON-ready values."""
    counters = server.counters
    requests: dict[str, int] = {}
    errors = 0
    for (method, reason), count in dict(counters.requests).items():
        requests[method] = requests.get(method, 0) + count
        if reason != "OK":
            errors += count
    out: dict[str, Any] = {
        "version": version(),
        "role": "replica" if server.replica is not None else "primary",
        "listen": listen,
        "requests": requests,
        "request_errors": errors,
        "open_streams": server.streams.total,
        "sent_bytes": counters.sent_bytes + server.streams.sent_bytes,
    }
    append = counters.latency.get("Append")
    out["append_mean_seconds"] = append.sum / append.count if append and append.count else None
    store = server.store
    if store is not None:
        used = usage(store.env, store.tables)
        stats = store.writer.stats
        out.update(
            sessions=used.sessions,
            events=used.events,
            position=used.position,
            head_commit_ms=used.head_commit_ns // 1_000_000,
            map_size=used.map_size,
            used_bytes=used.used_bytes,
            appended_events=stats.events,
            history_id=store.history()[0],
            commits=stats.commits,
            mean_group_size=stats.commands / stats.commits if stats.commits else None,
        )
    state = server.replica
    if state is not None:
        out["replication"] = {
            "primary": state.primary,
            "connected": state.connected,
            "caught_up": state.caught_up and not state.diverged,
            "diverged": state.diverged,
            "detail": state.detail,
            "primary_history_id": state.primary_history_id,
            "primary_position": state.primary_position,
            "applied_position": state.applied_position,
            "lag_positions": state.lag_positions,
            "lag_seconds": state.lag_ns / 1e9,
            "last_contact_ms": state.last_contact_ns // 1_000_000,
        }
    return out
