"""A server's share of the workers' metrics (PROMETHEUS_MULTIPROC_DIR), in this process: what
it publishes reads back as its own numbers, histograms bucket by bucket, and a server that
finds its pid's files already written (a dead worker's pid come round again) adds to them."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.core import Metric

from sessionlog.service import metrics
from sessionlog.stats import Histogram
from sessionlog.testing import ThreadedServer, running_server
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setenv(metrics.MULTIPROCESS_ENV, str(directory))
    return directory


def append(server: ThreadedServer, session_id: str, count: int) -> None:
    event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": "hi"})
    for _ in range(count):
        server.stub().Append(pb.AppendRequest(session_id=session_id, events=[event]), timeout=5)


def samples(server: ThreadedServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The per-process samples, summed over every worker's files, read on the server's loop."""

    async def read() -> list[Metric]:
        return metrics.per_process(server.server)

    out = {}
    for family in server.run(read()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def buckets(histogram: Histogram, **labels: str) -> dict[tuple[tuple[str, str], ...], int]:
    """A histogram's cumulative bucket counts, keyed by their sorted labels ``le`` included."""
    out = {}
    for bound, count in histogram.cumulative():
        le = "+Inf" if bound == float("inf") else repr(bound)
        out[tuple(sorted({**labels, "le": le}.items()))] = count
    return out


def test_one_worker_sums_to_its_own_numbers(tmp_path: Path, shared: Path) -> None:
    """Published and merged back, every count, bucket and sum equals the server's own."""
    with running_server(tmp_path / "data") as server:
        assert server.server.shared_metrics is not None
        append(server, "s", 4)
        summed = samples(server)
        counters, stats = server.server.counters, server.store.writer.stats
        latency = counters.latency["Append"]
        label = (("method", "Append"), ("reason", "OK"))
        assert summed[("sessionlog_requests_total", label)] == counters.requests[("Append", "OK")]
        assert summed[("sessionlog_appended_events_total", ())] == stats.events == 4
        assert summed[("sessionlog_commits_total", ())] == stats.commits
        for name, histogram, labels in (
            ("sessionlog_request_duration_seconds", latency, {"method": "Append"}),
            ("sessionlog_commit_group_size", stats.group_sizes, {}),
            ("sessionlog_commit_duration_seconds", stats.commit_seconds, {}),
        ):
            for key, count in buckets(histogram, **labels).items():
                assert summed[(f"{name}_bucket", key)] == count, (name, key)
            key = tuple(sorted(labels.items()))
            assert summed[(f"{name}_count", key)] == histogram.count
            assert summed[(f"{name}_sum", key)] == pytest.approx(histogram.sum)
        assert summed[("sessionlog_open_streams", ())] == 0
        assert summed[("process_resident_memory_bytes", ())] > 0
    assert {path.name.split("_")[0] for path in shared.iterdir()} == {
        "counter",
        "histogram",
        "gauge",
    }


def test_a_reused_pid_adds_to_what_its_files_hold(tmp_path: Path, shared: Path) -> None:
    """A second server in this process (same pid, so the same files, as a worker whose pid a
    dead one had) counts on from the first one's final numbers, which it left when it stopped."""
    with running_server(tmp_path / "first") as first:
        append(first, "s", 3)
    with running_server(tmp_path / "second") as second:
        append(second, "s", 2)
        summed = samples(second)
    label = (("method", "Append"), ("reason", "OK"))
    assert summed[("sessionlog_requests_total", label)] == 5
    assert summed[("sessionlog_appended_events_total", ())] == 5
    assert summed[("sessionlog_request_duration_seconds_count", (("method", "Append"),))] == 5


def test_without_the_variable_nothing_is_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No PROMETHEUS_MULTIPROC_DIR: the server keeps its numbers to itself, as it always did."""
    monkeypatch.delenv(metrics.MULTIPROCESS_ENV, raising=False)
    with running_server(tmp_path / "data") as server:
        assert server.server.shared_metrics is None
        append(server, "s", 1)
        label = (("method", "Append"), ("reason", "OK"))
        assert samples(server)[("sessionlog_requests_total", label)] == 1
