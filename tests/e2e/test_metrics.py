"""Prometheus metrics of a real `sessionlog serve` process, scraped over HTTP: every metric is
there, and each moves with the traffic it counts (appends, refusals, drops, follows, replication).
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli

pytestmark = pytest.mark.workers

MAP_SIZE = 64 << 20
TIMEOUT = 5.0

EXPECTED = {
    "sessionlog_info",
    "sessionlog_requests_total",
    "sessionlog_request_duration_seconds",
    "sessionlog_dropped_events_total",
    "sessionlog_open_streams",
    "sessionlog_streams_total",
    "sessionlog_sent_bytes_total",
    "sessionlog_appended_events_total",
    "sessionlog_commits_total",
    "sessionlog_syncs_total",
    "sessionlog_storage_write_errors_total",
    "sessionlog_commit_group_size",
    "sessionlog_commit_duration_seconds",
    "sessionlog_sessions",
    "sessionlog_stored_events",
    "sessionlog_lmdb_map_size_bytes",
    "sessionlog_lmdb_used_bytes",
    "sessionlog_lmdb_readers",
    "sessionlog_expiring_sessions",
    "sessionlog_purging_sessions",
    "sessionlog_replication_position",
    "sessionlog_replication_head_commit_time_seconds",
    "process_resident_memory_bytes",
}
REPLICA_ONLY = {
    "sessionlog_replication_primary_position",
    "sessionlog_replication_lag_positions",
    "sessionlog_replication_lag_seconds",
    "sessionlog_replication_connected",
    "sessionlog_replication_caught_up",
    "sessionlog_replication_last_contact_time_seconds",
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Every sample, keyed by (name, sorted labels); a family's name alone (no labels, value 0)
marks that the family was exposed, even before it has samples."""


class Primary:
    def __init__(self, process: ServerProcess, grpc_port: int, metrics_port: int) -> None:
        self.process = process
        self.address = f"127.0.0.1:{grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Primary]:
    """One server process with --metrics-listen, shared by this module's tests."""
    cwd = tmp_path_factory.mktemp("metrics")
    grpc_port, metrics_port = free_port(), free_port()
    args = ["--data", "data", "--listen", f"127.0.0.1:{grpc_port}", "--map-size", str(MAP_SIZE)]
    args += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
    with ServerProcess(args, cwd) as process:
        process.wait_serving(f"127.0.0.1:{grpc_port}")
        yield Primary(process, grpc_port, metrics_port)


def scrape(url: str) -> tuple[str, Samples]:
    """The response's content type and every sample, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        kind = response.headers["Content-Type"]
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        samples.setdefault((name, ()), 0.0)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return kind, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def names(samples: Samples) -> set[str]:
    found = {name for name, _ in samples}
    for suffix in ("_bucket", "_sum", "_count"):
        found |= {n[: -len(suffix)] for n in found if n.endswith(suffix)}
    return found


def message(kind: int, content: str) -> event_pb2.Event:
    event = event_pb2.Event(type=kind)  # type: ignore[arg-type]
    event.data.update({"content": content})
    return event


def stub(address: str) -> tuple[grpc.Channel, pb_grpc.SessionLogServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]


def test_every_metric_is_exposed(primary: Primary) -> None:
    """A scrape answers in Prometheus' text format with every sessionlog metric a primary has,
    the process metrics beside them, and no replica-only ones."""
    kind, samples = scrape(primary.metrics_url)
    assert kind.startswith("text/plain")
    found = names(samples)
    assert found >= EXPECTED, f"missing: {sorted(EXPECTED - found)}"
    assert not found & REPLICA_ONLY
    assert value(samples, "sessionlog_info", role="primary", version="0.1.0") == 1
    assert value(samples, "sessionlog_lmdb_map_size_bytes") == MAP_SIZE


def test_appends_move_the_counters(primary: Primary) -> None:
    """Accepted, refused and lenient appends move requests by reason, events, commits, the
    latency and group-size histograms, bytes sent, sessions, stored events and map usage."""
    _, before = scrape(primary.metrics_url)
    channel, client = stub(primary.address)
    with channel:
        user = message(event_pb2.EVENT_TYPE_USER_MESSAGE, "hello")
        for _ in range(3):
            client.Append(pb.AppendRequest(session_id="metrics-a", events=[user, user]))
        with pytest.raises(grpc.RpcError):
            client.Append(
                pb.AppendRequest(session_id="metrics-a", events=[user], expected_seq=0),
                timeout=TIMEOUT,
            )
        bad = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
        bad.surface_op.replace.start_seq = 0
        client.Append(
            pb.AppendRequest(session_id="metrics-b", events=[user, bad], lenient=True),
            timeout=TIMEOUT,
        )

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # A server of several workers publishes each worker's counts a moment after it counts.
    deadline = time.monotonic() + 30.0
    _, after = scrape(primary.metrics_url)
    while moved("sessionlog_request_duration_seconds_count", method="Append") < 5:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        _, after = scrape(primary.metrics_url)
    assert moved("sessionlog_requests_total", method="Append", reason="OK") == 4
    assert moved("sessionlog_requests_total", method="Append", reason="SEQ_CONFLICT") == 1
    assert moved("sessionlog_dropped_events_total", reason="SURFACE_OP_ON_NON_SURFACE_EVENT") == 1
    assert moved("sessionlog_appended_events_total") == 7
    assert moved("sessionlog_stored_events") == 7
    assert moved("sessionlog_sessions") == 2
    assert moved("sessionlog_commits_total") >= 4
    assert moved("sessionlog_commit_group_size_count") >= 4
    assert moved("sessionlog_commit_duration_seconds_count") >= 4
    assert moved("sessionlog_commit_duration_seconds_sum") > 0
    assert moved("sessionlog_request_duration_seconds_count", method="Append") == 5
    assert value(after, "sessionlog_request_duration_seconds_bucket", method="Append", le="+Inf")
    assert moved("sessionlog_sent_bytes_total", kind="unary") > 0
    assert moved("sessionlog_replication_position") >= 4
    assert value(after, "sessionlog_replication_head_commit_time_seconds") > time.time() - 60
    assert 0 < value(after, "sessionlog_lmdb_used_bytes") <= MAP_SIZE


def test_stream_appends_are_counted_one_by_one(primary: Primary) -> None:
    """Each AppendStream request is counted as a call of method AppendStream by its reason, with
    its latency and a lenient request's drops; its replies count as stream bytes."""
    _, before = scrape(primary.metrics_url)
    user = message(event_pb2.EVENT_TYPE_USER_MESSAGE, "hello")
    bad = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
    bad.surface_op.replace.start_seq = 0
    appends = [
        pb.AppendRequest(session_id="metrics-stream", events=[user]),
        pb.AppendRequest(session_id="metrics-stream", events=[user], expected_seq=0),
        pb.AppendRequest(session_id="metrics-stream", events=[user, bad], lenient=True),
    ]
    channel, client = stub(primary.address)
    with channel:
        sent = (pb.AppendStreamRequest(correlation_id=n, append=a) for n, a in enumerate(appends))
        replies = list(client.AppendStream(sent, timeout=TIMEOUT))
    assert [r.WhichOneof("result") for r in replies] == ["append", "error", "append"]

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    deadline = time.monotonic() + 30.0
    _, after = scrape(primary.metrics_url)
    while moved("sessionlog_request_duration_seconds_count", method="AppendStream") < 3:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        _, after = scrape(primary.metrics_url)
    assert moved("sessionlog_requests_total", method="AppendStream", reason="OK") == 2
    assert moved("sessionlog_requests_total", method="AppendStream", reason="SEQ_CONFLICT") == 1
    assert moved("sessionlog_request_duration_seconds_count", method="AppendStream") == 3
    assert moved("sessionlog_dropped_events_total", reason="SURFACE_OP_ON_NON_SURFACE_EVENT") == 1
    assert moved("sessionlog_sent_bytes_total", kind="stream") > 0


def test_follow_streams_show_while_open(primary: Primary) -> None:
    """An open follow stream counts in open_streams and streams_total and its bytes in
    sent_bytes{kind=stream}; once cancelled, open_streams drops back."""
    channel, client = stub(primary.address)
    with channel:
        client.Append(
            pb.AppendRequest(
                session_id="metrics-follow",
                events=[message(event_pb2.EVENT_TYPE_USER_MESSAGE, "x" * 500)],
            ),
            timeout=TIMEOUT,
        )
        _, before = scrape(primary.metrics_url)
        stream = client.Since(pb.SinceRequest(session_id="metrics-follow", follow=True))
        for response in stream:
            if response.caught_up:
                break
        # A --workers N worker publishes its counts a moment after it counts: poll for them.
        deadline = time.monotonic() + TIMEOUT
        while True:
            _, during = scrape(primary.metrics_url)
            opened = value(during, "sessionlog_open_streams")
            if opened > value(before, "sessionlog_open_streams") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        stream.cancel()
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            _, after = scrape(primary.metrics_url)
            if value(after, "sessionlog_open_streams") == value(before, "sessionlog_open_streams"):
                break
            time.sleep(0.05)
    assert value(during, "sessionlog_open_streams") == value(before, "sessionlog_open_streams") + 1
    assert (
        value(during, "sessionlog_streams_total") == value(before, "sessionlog_streams_total") + 1
    )
    sent = value(during, "sessionlog_sent_bytes_total", kind="stream")
    assert sent >= value(before, "sessionlog_sent_bytes_total", kind="stream") + 500
    assert value(after, "sessionlog_open_streams") == value(before, "sessionlog_open_streams")


def test_replica_exposes_its_lag(primary: Primary, tmp_path: Path) -> None:
    """A replica's scrape says role=replica, connected and caught up, with the primary's
    position and zero lag once it has applied everything."""
    grpc_port, metrics_port = free_port(), free_port()
    args = ["--data", "replica", "--listen", f"127.0.0.1:{grpc_port}"]
    args += ["--replica-of", primary.address, "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    channel, client = stub(primary.address)
    with channel:
        user = message(event_pb2.EVENT_TYPE_USER_MESSAGE, "for the replica")
        client.Append(pb.AppendRequest(session_id="metrics-lag", events=[user]), timeout=TIMEOUT)
    head = 0.0
    deadline = time.monotonic() + 10  # workers publish their numbers every quarter second
    while head <= 0 and time.monotonic() < deadline:
        _, primary_samples = scrape(primary.metrics_url)
        head = value(primary_samples, "sessionlog_replication_position")
        time.sleep(0.05)
    assert head > 0
    with ServerProcess(args, tmp_path, name="replica") as replica:
        replica.wait_serving(f"127.0.0.1:{grpc_port}")
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            _, samples = scrape(url)
            if value(samples, "sessionlog_replication_position") >= head:
                break
            time.sleep(0.05)
    assert names(samples) >= REPLICA_ONLY
    assert value(samples, "sessionlog_info", role="replica", version="0.1.0") == 1
    assert value(samples, "sessionlog_replication_connected") == 1
    assert value(samples, "sessionlog_replication_caught_up") == 1
    assert value(samples, "sessionlog_replication_primary_position") >= head
    assert value(samples, "sessionlog_replication_position") >= head
    assert value(samples, "sessionlog_replication_lag_positions") == 0


def test_metrics_are_off_by_default(tmp_path: Path) -> None:
    """Without the flag nothing serves metrics: --print-config shows metrics_listen and
    http_listen empty by default, and set from SESSIONLOG_METRICS_LISTEN when given."""
    plain = run_cli(["serve", "--print-config"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert 'metrics_listen = ""  # default' in plain.stdout
    assert 'http_listen = ""  # default' in plain.stdout
    env = clean_env(SESSIONLOG_METRICS_LISTEN="127.0.0.1:9999")
    with_env = run_cli(["serve", "--print-config"], tmp_path, env=env)
    assert 'metrics_listen = "127.0.0.1:9999"  # env SESSIONLOG_METRICS_LISTEN' in with_env.stdout


def test_bad_or_busy_metrics_address_is_one_line(tmp_path: Path) -> None:
    """A malformed --metrics-listen is a usage error (exit 2); a busy one stops the server at
    start (exit 1); each says so in one line naming the flag."""
    bad = run_cli(["serve", "--data", "d", "--metrics-listen", "nowhere"], tmp_path)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "--metrics-listen" in bad.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["serve", "--data", "d", "--listen", f"127.0.0.1:{free_port()}"]
        args += ["--metrics-listen", f"127.0.0.1:{port}"]
        taken = run_cli(args, tmp_path)
    assert taken.returncode == 1
    assert len(taken.stderr.strip().splitlines()) == 1
    assert "--metrics-listen" in taken.stderr
