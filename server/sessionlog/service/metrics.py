"""Prometheus metrics, read at scrape time from counters the server keeps anyway.

Nothing here runs on a request's path: the handlers bump plain integers (``Counters``,
``StreamLimiter``, ``WriterStats``) and :class:`SessionLogCollector` turns them into metric
families when Prometheus scrapes ``--metrics-listen``. Store-wide numbers (sessions, events, map
usage) come from LMDB's O(1) bookkeeping (``storage.usage``).

The same readings feed the web console's status panel through :func:`status`, summed the same way
when several workers share them (below).

Several workers (``sessionlog serve --workers N``)
--------------------------------------------------
The supervisor makes a fresh directory for each server it runs, names it in
``PROMETHEUS_MULTIPROC_DIR`` for its workers, and calls :func:`worker_died` for each worker that
exits. When that variable names a directory, every worker holds a :class:`SharedMetrics`: its
per-process numbers, copied into prometheus_client's multiprocess files there (one mmap'd file
per kind and pid), and a scrape of any worker merges every worker's files with prometheus_client's
``MultiProcessCollector``. Per metric:

- Counters and histograms (requests and their latency, dropped events, streams opened, bytes
  sent, events appended, commits, write errors, group sizes, commit durations,
  ``process_cpu_seconds``): summed over every worker the server has run, dead ones included.
  ``worker_died`` leaves a dead worker's counter and histogram files in place, so no total goes
  down when a worker dies or is restarted; its replacement has a new pid and files of its own.
- Gauges of live state: ``sessionlog_open_streams`` and the ``process_*`` memory and open files
  are summed over live workers (``livesum``), ``process_start_time_seconds`` is the oldest live
  worker's (``livemin``), ``process_max_fds`` the largest (``livemax``). ``worker_died`` removes
  a dead worker's gauge files: its streams are gone.
- The store's gauges (sessions, stored events, map size and use, readers, replication position
  and head time), ``sessionlog_info`` and a replica's gauges are not published: the worker that
  answers computes them once, from the LMDB environment every worker shares. Summed, they
  would count N times.

The request path still bumps plain integers. prometheus_client's own metrics in multiprocess mode
would cost 12 to 14 µs per unary call (a label lookup, a lock, a getpid and an mmap write for each
of the count, the latency bucket, its sum and the bytes) where the integers cost 0.6 µs. Instead,
a worker copies its numbers into its files every ``PUBLISH_SECONDS`` on its event loop, first
thing when it answers a scrape, and once more when it stops. A scrape shows the answering
worker's numbers as of now and the others' as of at most ``PUBLISH_SECONDS`` ago (longer only
while a worker's event loop is blocked). A worker killed outright loses at most its last
``PUBLISH_SECONDS`` of counts; no scrape has shown them (a worker publishes before it answers),
so no total goes backwards.

The files are named by pid: one server per process in this mode, which is how workers run.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, values
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from sessionlog.cluster.sync import SyncTracker
from sessionlog.service.counters import OK, Counters
from sessionlog.service.limits import StreamLimiter
from sessionlog.service.replication import ReplicaState
from sessionlog.stats import Histogram
from sessionlog.storage.store import Store
from sessionlog.storage.usage import usage
from sessionlog.storage.writer import WriterStats

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The variable naming the directory of the workers' metric files (prometheus_client's name)."""
PUBLISH_SECONDS = 0.25
"""How often a worker copies its numbers into its files: the most a scrape lags another worker."""

LIVE_GAUGES = {
    "sessionlog_open_streams": "livesum",
    "process_virtual_memory_bytes": "livesum",
    "process_resident_memory_bytes": "livesum",
    "process_open_fds": "livesum",
    "process_start_time_seconds": "livemin",
    "process_max_fds": "livemax",
}
"""How each published gauge combines over live workers (one not named here, should a newer
prometheus_client add a process gauge, adds up); counters and histograms add up."""


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

    @property
    def shared_metrics(self) -> SharedMetrics | None: ...

    @property
    def sync(self) -> SyncTracker | None: ...


def version() -> str:
    try:
        return metadata.version("sessionlog-server")
    except metadata.PackageNotFoundError:
        return "unknown"


# -- one process's numbers as metric families ---------------------------------------------------


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _add(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    buckets = [(_le(bound), count) for bound, count in histogram.cumulative()]
    family.add_metric(labels, buckets, histogram.sum)


def _requests(counters: Counters) -> Iterator[Metric]:
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


def _streams(streams: StreamLimiter, counters: Counters) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "sessionlog_open_streams",
        "Open streams: Since, Changes, AppendStream and web console follows",
        value=streams.total,
    )
    yield CounterMetricFamily(
        "sessionlog_streams",
        "Streams opened since start (those of sessionlog_open_streams)",
        value=streams.opened,
    )
    sent = CounterMetricFamily(
        "sessionlog_sent_bytes",
        "Bytes of replies sent: unary replies and stream responses",
        labels=["kind"],
    )
    sent.add_metric(["unary"], counters.sent_bytes)
    sent.add_metric(["stream"], streams.sent_bytes)
    yield sent


def _writes(stats: WriterStats) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "sessionlog_appended_events",
        "Events written (appends, creates, seeds, forks), counted at commit",
        value=stats.events,
    )
    yield CounterMetricFamily(
        "sessionlog_commits", "Write transactions committed", value=stats.commits
    )
    yield CounterMetricFamily(
        "sessionlog_syncs",
        "Syncs of the data file made apart from commits (--durability group: when no commit "
        "followed to cover the last one's meta page)",
        value=stats.syncs,
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


def _own(server: Observed, process: ProcessCollector | None = None) -> list[Metric]:
    """This process's counts (and its process metrics, given ``process``): the families a
    worker publishes, in exposition order."""
    families = [*_requests(server.counters), *_streams(server.streams, server.counters)]
    if server.store is not None:
        families += _writes(server.store.writer.stats)
    if process is not None:
        families += process.collect()
    return families


def per_process(server: Observed) -> list[Metric]:
    """The per-process families: summed over every worker when they share their metrics,
    this process's own otherwise."""
    shared = server.shared_metrics
    return _own(server) if shared is None else shared.summed(server)


# -- several workers: prometheus_client's multiprocess files ------------------------------------


def multiprocess_directory() -> str | None:
    """The directory ``PROMETHEUS_MULTIPROC_DIR`` names, if it names one."""
    directory = os.environ.get(MULTIPROCESS_ENV, "")
    return directory if directory and os.path.isdir(directory) else None


def worker_died(pid: int, directory: str) -> None:
    """For the supervisor, once a worker has exited (however): drop its live gauges (open
    streams, memory) from the sums and keep its counters and histograms, which still count."""
    mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


class _Published:
    """One value in this process's files: ``base`` is what the file held when this process
    first wrote it (a dead worker's count, should the pid come round again), kept under it."""

    __slots__ = ("base", "last", "value")

    def __init__(self, value: Any, base: float) -> None:
        self.value = value
        self.base = base
        self.last: float | None = None


class SharedMetrics:
    """This worker's per-process numbers in prometheus_client's multiprocess files, and the
    sums over every worker's files (see the module docstring for what each metric becomes)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        # The process's own multiprocess value class when prometheus_client made one at import
        # (the variable was set): then nothing else in the process writes these files apart.
        shared_class = values.ValueClass
        self._value_class: Any = (
            shared_class
            if getattr(shared_class, "_multiprocess", False)
            else values.MultiProcessValue()  # type: ignore[no-untyped-call]
        )
        self._values: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Published] = {}
        self._process = ProcessCollector(registry=None)
        self._failing = False

    @classmethod
    def from_environment(cls) -> SharedMetrics | None:
        directory = multiprocess_directory()
        return None if directory is None else cls(directory)

    def publish(self, server: Observed) -> None:
        """Copy this worker's numbers into its files. A failure (the directory's disk full)
        is logged once; the numbers are copied whole at the next try."""
        self._write(_own(server, self._process))

    def summed(self, server: Observed) -> list[Metric]:
        """Every per-process family summed over the workers, this worker's numbers current.
        A family no worker has samples for yet is still there, empty."""
        own = _own(server, self._process)
        self._write(own)
        files = glob.glob(os.path.join(self.directory, "*.db"))
        merge = MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
        merged: dict[str, Metric] = {family.name: family for family in merge}
        return [merged.get(family.name, family) for family in own]

    def _write(self, families: Iterable[Metric]) -> None:
        try:
            for family in families:
                self._write_family(family)
        except OSError as exc:
            if not self._failing:
                log.warning(
                    "cannot write this worker's metrics; scrapes show its last numbers",
                    extra={"directory": self.directory, "error": str(exc)},
                )
            self._failing = True
            return
        self._failing = False

    def _write_family(self, family: Metric) -> None:
        mode = LIVE_GAUGES.get(family.name, "livesum") if family.type == "gauge" else ""
        for name, labels, number in _file_values(family):
            key = (family.name, name, labels)
            published = self._values.get(key)
            if published is None:
                value = self._value_class(
                    family.type,
                    family.name,
                    name,
                    [label for label, _ in labels],
                    [text for _, text in labels],
                    family.documentation,
                    multiprocess_mode=mode,
                )
                base = 0.0 if mode else float(value.get())
                published = self._values[key] = _Published(value, base)
            if published.last != number:
                published.value.set(published.base + number)
                published.last = number


def _file_values(family: Metric) -> Iterator[tuple[str, tuple[tuple[str, str], ...], float]]:
    """(sample name, sorted labels, value) as prometheus_client's files hold them: a histogram
    bucket holds its own count, not the cumulative one, and no ``_count`` (the merge derives
    both from the buckets)."""
    below: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in family.samples:
        labels = tuple(sorted(sample.labels.items()))
        if family.type != "histogram":
            yield sample.name, labels, sample.value
        elif sample.name.endswith("_bucket"):
            series = tuple(pair for pair in labels if pair[0] != "le")
            yield sample.name, labels, sample.value - below.get(series, 0.0)
            below[series] = sample.value
        elif sample.name.endswith("_sum"):
            yield sample.name, labels, sample.value


async def keep_published(server: Observed, shared: SharedMetrics) -> None:
    """Publish every ``PUBLISH_SECONDS`` until cancelled, and once more then (a worker that
    stops leaves its final numbers)."""
    try:
        while True:
            await asyncio.sleep(PUBLISH_SECONDS)
            shared.publish(server)
    finally:
        shared.publish(server)


# -- the exposition -----------------------------------------------------------------------------


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
        yield from per_process(server)
        if server.store is not None:
            yield from self._storage(server.store)
        if server.replica is not None:
            yield from self._replica(server.replica)
        if server.sync is not None and server.sync.required:
            yield from _sync(server.sync)

    def _storage(self, store: Store) -> Iterator[Metric]:
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
            "sessionlog_expiring_sessions",
            "Unpinned sessions with an expire_time (the retention sweeper's expiry index)",
            value=store.expiring(),
        )
        yield GaugeMetricFamily(
            "sessionlog_purging_sessions",
            "Deleted long sessions whose rows are still being freed in chunks (table purges)",
            value=store.purging_count(),
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
                "1 from the replica catching up with its primary until its link has been down "
                "longer than --replica-timeout (health is NOT_SERVING while 0; never 1 while "
                "diverged)",
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


def _sync(sync: SyncTracker) -> Iterator[Metric]:
    """--ack replica: what writes wait for, and how they fared. Not published: --ack replica
    runs one process, which holds every report."""
    yield GaugeMetricFamily(
        "sessionlog_sync_required_replicas",
        "Replicas that must hold a write before it is acknowledged (--sync-replicas)",
        value=sync.required,
    )
    yield GaugeMetricFamily(
        "sessionlog_sync_counting_replicas",
        "Replicas that count now: reporting, and on this primary's history",
        value=sync.counting(),
    )
    yield GaugeMetricFamily(
        "sessionlog_sync_position",
        "Newest change-feed position that enough replicas hold (0: fewer count)",
        value=sync.sync_position,
    )
    if sync.grouped:
        yield GaugeMetricFamily(
            "sessionlog_sync_set_members",
            "Members of the synchronous set this cluster leader last had etcd confirm (they "
            "alone may take over from it)",
            value=len(sync.members),
        )
    position = GaugeMetricFamily(
        "sessionlog_sync_replica_position",
        "Newest position each replica reported holding durably",
        labels=["replica"],
    )
    counts = GaugeMetricFamily(
        "sessionlog_sync_replica_counts",
        "1 while a replica counts toward --sync-replicas",
        labels=["replica"],
    )
    for replica in sync.replicas():
        position.add_metric([replica.name], replica.position)
        counts.add_metric([replica.name], int(replica.counts))
    yield position
    yield counts
    waits = _histogram(
        "sessionlog_sync_wait_seconds",
        "Time acknowledged writes waited, after their commit, for their replicas",
        [],
    )
    _add(waits, [], sync.stats.waits)
    yield waits
    yield CounterMetricFamily(
        "sessionlog_sync_timeouts",
        "Writes that failed REPLICAS_UNAVAILABLE (committed here, not acknowledged)",
        value=sync.stats.timeouts,
    )
    yield CounterMetricFamily(
        "sessionlog_sync_mismatches",
        "Replica report streams found on another history (never counted)",
        value=sync.stats.mismatches,
    )


def registry(server: Observed) -> CollectorRegistry:
    """A registry of its own (several servers may share a process in tests), with the process
    metrics (memory, CPU, open files) beside sessionlog's: this process's, or summed over the
    workers when they share their metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SessionLogCollector(server))
    if server.shared_metrics is None:
        ProcessCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format."""
    return generate_latest(registry)


# -- the console's status panel -----------------------------------------------------------------


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(families: Iterable[Metric]) -> Samples:
    """Every sample's labels and value, by sample name."""
    out: Samples = {}
    for family in families:
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _total(samples: Samples, name: str, **labels: str) -> int:
    """The sum of ``name``'s samples that carry ``labels``, as the whole number it counts."""
    matching = samples.get(name, [])
    return round(sum(v for have, v in matching if labels.items() <= have.items()))


def status(server: Observed, listen: str = "") -> dict[str, Any]:
    """The numbers the web console shows at a glance, as JSON-ready values: the same per-process
    numbers as the metrics (summed over the workers when they share them)."""
    samples = _samples(per_process(server))
    requests: dict[str, int] = {}
    errors = 0
    for labels, count in samples.get("sessionlog_requests_total", []):
        requests[labels["method"]] = requests.get(labels["method"], 0) + round(count)
        if labels["reason"] != OK:
            errors += round(count)
    out: dict[str, Any] = {
        "version": version(),
        "role": "replica" if server.replica is not None else "primary",
        "listen": listen,
        "requests": requests,
        "request_errors": errors,
        "open_streams": _total(samples, "sessionlog_open_streams"),
        "sent_bytes": _total(samples, "sessionlog_sent_bytes_total"),
    }
    appends = _total(samples, "sessionlog_request_duration_seconds_count", method="Append")
    append_seconds = sum(
        v
        for labels, v in samples.get("sessionlog_request_duration_seconds_sum", [])
        if labels.get("method") == "Append"
    )
    out["append_mean_seconds"] = append_seconds / appends if appends else None
    store = server.store
    if store is not None:
        used = usage(store.env, store.tables)
        commits = _total(samples, "sessionlog_commits_total")
        grouped = _total(samples, "sessionlog_commit_group_size_sum")
        out.update(
            sessions=used.sessions,
            events=used.events,
            position=used.position,
            head_commit_ms=used.head_commit_ns // 1_000_000,
            map_size=used.map_size,
            used_bytes=used.used_bytes,
            appended_events=_total(samples, "sessionlog_appended_events_total"),
            history_id=store.history()[0],
            commits=commits,
            mean_group_size=grouped / commits if commits else None,
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
