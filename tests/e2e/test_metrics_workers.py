"""Metrics over several worker processes (PROMETHEUS_MULTIPROC_DIR, as `--workers N` sets it):
a scrape of any one worker sums every worker's counts, counts outlive a killed worker, live
gauges drop once the supervisor marks it dead, and the store's gauges are never summed.

Each worker here is a real `sessionlog serve` process with its own data folder (enough to show
the sums: the store's gauges are then each one's own, which is how this test tells a summed
metric from one computed once)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from sessionlog.service.metrics import worker_died
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import ServerProcess, clean_env, free_port
from tests.e2e._web import get
from tests.e2e.test_metrics import Samples, message, names, scrape, stub, value

TIMEOUT = 5.0
SUMMED_WITHIN = 30.0
"""How long a test waits for another worker's numbers (they are published every 0.25 s; a
busy machine can delay a publish by seconds)."""


class Worker:
    """One `sessionlog serve` process sharing the metrics directory, with its own data folder;
    its metrics (and web console) on one HTTP port."""

    def __init__(self, cwd: Path, env: dict[str, str], data: str) -> None:
        grpc_port, http_port = free_port(), free_port()
        self.address = f"127.0.0.1:{grpc_port}"
        self.http = f"http://127.0.0.1:{http_port}"
        web = f"127.0.0.1:{http_port}"
        args = ["--data", data, "--listen", self.address, "--map-size", str(64 << 20)]
        args += ["--metrics-listen", web, "--http-listen", web]
        self.process = ServerProcess(args, cwd, env=env, name=data)
        self.channel, self.client = stub(self.address)

    def wait_serving(self) -> Worker:
        self.process.wait_serving(self.address)
        return self

    def scrape(self) -> Samples:
        return scrape(f"{self.http}/metrics")[1]

    def append(self, session_id: str, events: int, expected_seq: int | None = None) -> None:
        user = message(event_pb2.EVENT_TYPE_USER_MESSAGE, "hello")
        request = pb.AppendRequest(session_id=session_id, events=[user] * events)
        if expected_seq is not None:
            request.expected_seq = expected_seq
        self.client.Append(request, timeout=TIMEOUT)

    def follow(self, session_id: str) -> grpc.Future:
        """A live Since stream, read until caught up (so it is open on the server)."""
        stream = self.client.Since(pb.SinceRequest(session_id=session_id, follow=True))
        for response in stream:
            if response.caught_up:
                break
        return stream

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[[str], Worker]]:
    """Start workers on demand, all with one fresh PROMETHEUS_MULTIPROC_DIR; stop them after."""
    shared = tmp_path / "metrics"
    shared.mkdir()
    # Each process here stands for one worker, so each is a one-process server in either mode.
    env = clean_env(workers=False, SESSIONLOG_WORKERS="1", PROMETHEUS_MULTIPROC_DIR=str(shared))
    with ExitStack() as stack:

        def start(data: str) -> Worker:
            worker = Worker(tmp_path, env, data)
            stack.enter_context(worker.process)  # started here, stopped by PID at the end
            stack.callback(worker.close)
            return worker.wait_serving()

        yield start


def until(scraped: Callable[[], Samples], done: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``done`` holds (another worker publishes a moment after it counts)."""
    deadline = time.monotonic() + SUMMED_WITHIN
    samples = scraped()
    while not done(samples) and time.monotonic() < deadline:
        time.sleep(0.05)
        samples = scraped()
    return samples


def appends_ok(samples: Samples) -> float:
    return value(samples, "sessionlog_requests_total", method="Append", reason="OK")


def test_a_scrape_of_one_worker_sums_every_worker(workers: Callable[[str], Worker]) -> None:
    """Counters, histograms and open streams add up over two workers in either worker's scrape
    and its console status; the store's gauges and sessionlog_info are the answering worker's."""
    a, b = workers("a"), workers("b")
    for _ in range(3):
        a.append("on-a", 1)
    for _ in range(2):
        b.append("on-b", 2)
    with pytest.raises(grpc.RpcError) as refused:
        b.append("on-b", 1, expected_seq=0)
    assert refused.value.code() == grpc.StatusCode.ABORTED
    streams = [a.follow("on-a"), b.follow("on-b")]
    try:

        def settled(samples: Samples) -> bool:
            return value(samples, "sessionlog_open_streams") == 2 and appends_ok(samples) == 5

        summed = until(a.scrape, settled)
        from_b = until(b.scrape, settled)
        _, _, console = get(f"{a.http}/api/status")
    finally:
        for stream in streams:
            stream.cancel()

    for samples in (summed, from_b):
        assert appends_ok(samples) == 5
        assert (
            value(samples, "sessionlog_requests_total", method="Append", reason="SEQ_CONFLICT") == 1
        )
        assert value(samples, "sessionlog_appended_events_total") == 3 + 4
        assert value(samples, "sessionlog_request_duration_seconds_count", method="Append") == 6
        assert (
            value(samples, "sessionlog_request_duration_seconds_bucket", method="Append", le="+Inf")
            == 6
        )
        assert value(samples, "sessionlog_request_duration_seconds_sum", method="Append") > 0
        commits = value(samples, "sessionlog_commits_total")
        assert commits >= 5
        assert value(samples, "sessionlog_commit_group_size_count") == commits
        assert value(samples, "sessionlog_commit_duration_seconds_count") == commits
        assert value(samples, "sessionlog_streams_total") == 2
        assert value(samples, "sessionlog_sent_bytes_total", kind="stream") > 0
        assert value(samples, "sessionlog_info", role="primary", version="0.1.0") == 1
        assert value(samples, "sessionlog_lmdb_map_size_bytes") == 64 << 20
        assert names(samples) >= {"sessionlog_dropped_events_total", "process_open_fds"}
    assert value(summed, "sessionlog_stored_events") == 3
    assert value(summed, "sessionlog_sessions") == 1
    assert value(from_b, "sessionlog_stored_events") == 4

    assert console["requests"]["Append"] == 6
    assert console["request_errors"] == 1
    assert console["open_streams"] == 2
    assert console["appended_events"] == 7
    assert console["commits"] == commits
    assert console["events"] == 3
    assert console["append_mean_seconds"] > 0


def test_counts_outlive_a_killed_worker(workers: Callable[[str], Worker]) -> None:
    """SIGKILL one worker: its counts stay in the sums; its open stream still counts until the
    supervisor's worker_died, then no more; a replacement's counts add to the dead one's, and
    one that stops leaves its final numbers without waiting for the next publish."""
    a, b = workers("a"), workers("b")
    a.append("on-a", 1)
    for _ in range(3):
        b.append("on-b", 1)
    stream = b.follow("on-b")
    try:
        before = until(
            a.scrape, lambda s: appends_ok(s) == 4 and value(s, "sessionlog_open_streams") == 1
        )
        assert value(before, "sessionlog_open_streams") == 1
        b.process.kill()
    finally:
        stream.cancel()
    b.close()

    unmarked = a.scrape()
    assert appends_ok(unmarked) == 4
    assert value(unmarked, "sessionlog_open_streams") == 1  # its file says so until marked dead
    shared = a.process.env["PROMETHEUS_MULTIPROC_DIR"]
    worker_died(b.process.pid, shared)
    after = a.scrape()
    assert appends_ok(after) == 4
    assert value(after, "sessionlog_appended_events_total") == 4
    assert value(after, "sessionlog_streams_total") == 1
    assert value(after, "sessionlog_open_streams") == 0
    for name in ("sessionlog_commits_total", "sessionlog_request_duration_seconds_count"):
        labels = {"method": "Append"} if "duration" in name else {}
        assert value(after, name, **labels) == value(before, name, **labels)

    replacement = workers("b")
    replacement.append("on-b", 2)
    replacement.process.stop()
    worker_died(replacement.process.pid, shared)
    final = a.scrape()
    assert appends_ok(final) == 5
    assert value(final, "sessionlog_appended_events_total") == 6
    assert value(final, "sessionlog_open_streams") == 0
