"""The bench's case 7 and its h2load rows, run small against a real `sessionlog serve` and the
echo server, both started as the bench starts them (``bench.procs``).

Needs Debian's nghttp2-client for h2load (`make test` installs it with apt-get).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from bench import cases, ceilings, checksums, echo, h2load, procs, sessions
from bench.common import Measurement, Settings, append_request
from bench.procs import ServerProcess
from bench.report import Results, Row, memory_table, sessions_table, table, targets
from sessionlog.storage.changes import ReceivedChange
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event, EventType

SETTINGS = replace(Settings.quick(), duration=1.0, warmup=0.2, sessions_list_passes=1)
SMALL = cases.AppendCase(9, clients=3, events_per_call=1)
"""An append case of three clients, one event per call: sessions h2-c9-0 .. h2-c9-2."""


@dataclass
class Servers:
    sessionlog: ServerProcess
    echo: ServerProcess
    work: Path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """A sessionlog server and the echo server for the module, stopped by PID at its end."""
    work = tmp_path_factory.mktemp("bench")
    with (
        procs.sessionlog_server(work / "data", work / "sessionlog.log") as server,
        procs.echo_server(work / "echo.log") as echo,
    ):
        yield Servers(server, echo, work)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ServerProcess]:
    """A sessionlog server of its own, for a test that needs an empty store."""
    with procs.sessionlog_server(tmp_path / "data", tmp_path / "sessionlog.log") as server:
        yield server


@pytest.fixture(scope="module")
def h2load_path() -> str:
    found = shutil.which("h2load")
    if found is None:
        pytest.fail(
            "h2load is missing: run `make test` (it installs nghttp2-client) "
            "or apt-get install -y nghttp2-client"
        )
    return found


def test_sessions_case_lists_every_session_and_reads_server_memory(servers: Servers) -> None:
    """Case 7 fills 250 sessions, lists all of them at both page sizes, and reads the RSS."""
    result = sessions.run_sessions(SETTINGS, servers.sessionlog, count=250)

    assert (result.fill.errors, result.fill.first_error) == (0, "")
    assert result.fill.calls == 250
    assert result.fill.events == 250 * SETTINGS.sessions_events
    pages = {100: 3, 1000: 1}
    for listing in result.listings:
        size = listing.details["page_size"]
        assert (listing.errors, listing.first_error) == (0, ""), size
        assert listing.details["sessions_listed_per_pass"] == [250], size
        assert listing.calls == pages[size]
        assert listing.events_per_second > 0
    assert [s.when for s in result.memory] == [
        "before filling",
        "after filling 250 sessions x 100 ev",
        "after paging",
    ]
    for sample in result.memory:
        assert sample.kib["VmRSS"] > 0
        assert sample.kib["RssAnon"] > 0
    assert "7 list 250 sessions x 100 ev, page 1000" in sessions_table(result)
    assert "growth while filling" in memory_table(result)


def test_sessions_case_counts_a_short_listing_as_an_error(fresh: ServerProcess) -> None:
    """Listing fewer sessions than the case expects is an error of the listing."""
    sessions.fill_sessions(SETTINGS, fresh, 40)

    listing = sessions.list_sessions(SETTINGS, fresh, 41, 100)

    assert listing.errors == 2  # the untimed pass and the timed one
    assert listing.first_error == "listed 40 sessions, expected 41 (c7-...)"


def test_h2load_drives_sessionlog_and_echo_and_the_stored_events_match(
    servers: Servers, h2load_path: str
) -> None:
    """h2load appends for a second from three clients, and echoes; every call is accounted for."""
    load, appended = cases.run_append_h2load(SETTINGS, servers.sessionlog, SMALL, servers.work)
    echoed = ceilings.echo_unary_h2load(load, servers.echo, servers.work)
    handed = ceilings.echo_unary_h2load(load, servers.echo, servers.work, via_thread=True)

    for measurement in (appended, echoed, handed):
        assert (measurement.errors, measurement.first_error) == (0, ""), measurement.name
        assert measurement.calls > 0
        assert measurement.details["load_client"] == "h2load"
        assert len(measurement.details["succeeded_per_client"]) == 3
        assert measurement.client_cpu_seconds > 0
        assert measurement.client_processes == 3
        assert measurement.p50_ms is not None
        assert measurement.server_us_per_call is not None
        assert measurement.server_us_per_call > 0
    assert appended.name == "9 append 1 ev/call, 3 clients (h2load)"
    assert echoed.name == "echo unary 79 B, 3 clients (h2load)"
    assert handed.name == "echo unary 79 B via a thread, 3 clients (h2load)"
    stored = appended.details["stored_events_per_client"]
    for counted, grown in zip(appended.details["succeeded_per_client"], stored, strict=True):
        assert counted <= grown <= counted + 1


def test_table_and_targets_give_server_cpu_per_call() -> None:
    """The table shows each side's server CPU per call; the targets compare the 16-client
    append's with the echo's (issue 14: at most 1.5x)."""
    label = "2 append 1 ev/call, 16 clients (h2load)"
    append = Measurement(label, events=1000, calls=1000, seconds=1.0, client_cpu_seconds=0.1)
    append.server_cpu_seconds = 0.3  # 300 us per call
    append.details["load_client"] = "h2load"
    echo = Measurement("echo unary", events=2000, calls=2000, seconds=1.0, client_cpu_seconds=0.1)
    echo.server_cpu_seconds = 0.4  # 200 us per call
    lmdb = Measurement("bare LMDB", events=100, calls=100, seconds=1.0, client_cpu_seconds=0.5)
    rows = [Row(label, append, echo, "echo"), Row(label, append, lmdb, "lmdb")]

    header, _, with_echo, with_lmdb = (
        re.split(r"\s{2,}", line) for line in table(rows).split("\n")
    )
    columns = [i for i, name in enumerate(header) if name == "srv us/call"]
    assert len(columns) == 2
    assert [with_echo[i] for i in columns] == ["300", "200"]
    assert [with_lmdb[i] for i in columns] == ["300", "-"]  # no server process behind bare LMDB
    found = {t.what: t for t in targets(Results(rows, [], [], []))}
    cost = found["append 1 ev/call, 16 clients: server CPU per call vs echo's (h2load)"]
    assert (cost.measured, cost.met) == ("1.50x", True)
    append.server_cpu_seconds = 0.31
    again = {t.what: t for t in targets(Results(rows, [], [], []))}
    assert again[cost.what].met is False


def test_h2load_grpc_errors_are_caught_by_the_stored_count(
    servers: Servers, h2load_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC error is an HTTP 200 to h2load; the stored-event check still counts it."""
    invalid = append_request("-not-a-session-id", 1)
    monkeypatch.setattr(cases, "append_request", lambda session_id, n: invalid)
    case = cases.AppendCase(8, clients=1, events_per_call=1)

    _, appended = cases.run_append_h2load(SETTINGS, servers.sessionlog, case, servers.work)

    assert appended.calls > 0  # h2load saw only successes
    assert appended.errors == 1
    assert "session h2-c8-0: h2load counted" in appended.first_error
    with grpc.insecure_channel(servers.sessionlog.address) as channel:
        assert cases.next_seq(channel, "h2-c8-0") == 0


def test_h2load_is_reported_missing_with_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without h2load on PATH the rows are skipped with a note saying how to install it."""
    monkeypatch.setenv("PATH", "/nonexistent")

    assert "apt-get install -y nghttp2-client" in h2load.unavailable()


def test_echo_via_thread_returns_each_request_unchanged(servers: Servers) -> None:
    """The hand-off ceiling does what the plain echo does, through its worker thread."""
    with grpc.insecure_channel(servers.echo.address) as channel:
        call = channel.unary_unary(echo.UNARY_VIA_THREAD)
        requests = [bytes([i]) * (i * 100) for i in range(1, 20)]
        assert [call(r, timeout=10) for r in requests] == requests


def test_checksum_case_measures_both_ways_and_writes_the_records_accordingly(
    tmp_path: Path,
) -> None:
    """Case 8 appends with and without change-record checksums; the store it measures without
    them really writes records with none, and the default one chains them."""
    quick = replace(SETTINGS, duration=0.3, warmup=0.05)
    rows = checksums.run_checksums(quick, tmp_path)
    assert [row.kind for row in rows] == ["unchecked"] * len(checksums.CASES)
    for row in rows:
        assert row.sessionlog.details["checksums"] is True
        assert row.ceiling.details["checksums"] is False
        assert row.sessionlog.events > 0
        assert row.ceiling.events > 0
    for enabled in (True, False):
        store = Store(tmp_path / f"store-{enabled}", StoreConfig(record_checksums=enabled))
        try:
            store.append("s", [Event(type=EventType.EVENT_TYPE_USER_MESSAGE)])
            record = ReceivedChange.parse(store.read_changes(1)[0]).change
            assert bool(record.checksum) is enabled
        finally:
            store.close()
