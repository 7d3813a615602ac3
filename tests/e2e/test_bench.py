"""The bench's case 7, its h2load rows, its etcd rows and its --workers rows, run small against
a real `sessionlog serve` (of one worker and of two), the echo server and a real etcd, started as
the bench starts them (``bench.procs``, ``bench.etcd``).

Needs Debian's nghttp2-client for h2load and etcd-server for etcd (`make test` installs both with
apt-get), and redis-server and postgresql for case 12's peers.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from bench import (
    ack,
    appendload,
    cases,
    ceilings,
    checksums,
    deletes,
    echo,
    etcd,
    frameworks,
    h2load,
    last,
    procs,
    sessions,
    streams,
    tail,
    workers,
)
from bench.common import Measurement, Settings, append_request, page_events, process_cpu_seconds
from bench.load import UnaryLoad
from bench.procs import ServerProcess
from bench.report import (
    Results,
    Row,
    etcd_table,
    memory_table,
    render,
    sessions_table,
    stream_table,
    table,
    targets,
    workers_table,
    workers_tail_table,
)
from sessionlog.storage.changes import ReceivedChange
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event, EventType
from sessionlog.v1.session_log_service_pb2 import SinceRequest

pytestmark = pytest.mark.serial
"""Serial (tests/conftest.py): every case here measures under load it makes itself, with short
warm-ups (0.2 s) and follow-up checks of who served what; beside other test processes on a
2-core machine, an h2load warm-up answered nothing and a tail follower took no sample."""

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
        procs.sessionlog_server(work / "data", work / "sessionlog.log", workers=1) as server,
        procs.echo_server(work / "echo.log") as echo,
    ):
        yield Servers(server, echo, work)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ServerProcess]:
    """A sessionlog server of its own, for a test that needs an empty store."""
    with procs.sessionlog_server(
        tmp_path / "data", tmp_path / "sessionlog.log", workers=1
    ) as server:
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


@pytest.fixture(scope="module")
def etcd_server(
    tmp_path_factory: pytest.TempPathFactory, h2load_path: str
) -> Iterator[etcd.EtcdProcess]:
    """etcd as the bench starts it (its own data dir, free ports), stopped by PID at the end."""
    if shutil.which("etcd") is None:
        pytest.fail(
            "etcd is missing: run `make test` (it installs etcd-server) "
            "or apt-get install -y etcd-server"
        )
    with etcd.etcd_server(tmp_path_factory.mktemp("etcd")) as server:
        yield server


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


def test_delete_case_times_appends_during_both_deletes(tmp_path: Path) -> None:
    """Case 14 deletes the same long sessions one after another in one transaction each and in
    chunks, timing the appends to other sessions before, during and after the deletes (a quiet
    span as long as each delete after it, whose p99s the deletes' p99s are checked against),
    and leaves nothing behind."""
    tiny = replace(SETTINGS, duration=0.3, delete_events=9_000, delete_sessions=3)
    [row] = deletes.run_deletes(tiny, tmp_path)
    assert row.kind == "one-step"
    assert row.ceiling.details["chunks"] == 0
    assert row.sessionlog.details["chunks"] >= 3  # 3 sessions of 3,000 events, 2,000 keys a chunk
    for measured in (row.sessionlog, row.ceiling):
        assert measured.calls > 0
        assert measured.details["long_events"] == 3_000
        assert measured.details["long_sessions"] == 3
        assert len(measured.details["whole_delete_s"]) == 3
        for span in ("quiet", "after"):  # the figures without a delete, before and after them
            assert measured.details[f"{span}_p99_ms"] is not None
        assert "p50/p99/max: before " in deletes.note(measured)
        assert ", after " in deletes.note(measured)
        p99s = measured.details["noise_p99s_ms"]  # the quiet spans' p99s, measured
        assert len(p99s) >= 3  # one after each delete, and those that fit before the first
        mine = measured.details["deletes_p99s_ms"]
        assert len(mine) == 3
        p_value, bound = measured.details["p_value"], measured.details["ratio_bound"]
        assert 0 < p_value <= 1
        assert 0 < measured.details["ratio"] <= bound
        verdict = measured.details["verdict"]
        if p_value < deletes.LEVEL:
            assert verdict == "not met"
        elif bound <= deletes.MARGIN:
            assert verdict == "met"
        else:
            assert verdict == "inconclusive"
        assert measured.details["met"] == (verdict == "met")
        assert 0 <= measured.details["above_share"] <= 1
        assert deletes.note(measured).endswith(f"unchanged within noise {verdict}")
        assert ("rank test p < 0.0001" in deletes.note(measured)) == (p_value < 0.0001)
    assert list(tmp_path.iterdir()) == []


def test_the_rank_test_of_case_14_counts_the_labellings_as_high() -> None:
    """Case 14's verdict: the share of the ways of labelling the spans whose deletes rank as
    high as the measured ones, counted (or, past EXACT_LABELLINGS, drawn with a seed)."""
    # Three deletes above three quiet spans: 1 labelling of C(6, 3) = 20 is as high.
    assert deletes.rank_p([5.0, 6.0, 7.0], [1.0, 2.0, 3.0]) == 1 / 20
    assert deletes.above([5.0, 6.0, 7.0], [1.0, 2.0, 3.0]) == 9
    # All below: every labelling is at least as high.
    assert deletes.rank_p([1.0, 2.0], [5.0, 6.0, 7.0]) == 1.0
    # Deletes ranked 2 and 4 of 4 (rank sum 6): of the C(4, 2) = 6 labellings, {2, 4} (6)
    # and {3, 4} (7) rank as high; {1, 4} and {2, 3} (5) do not.
    assert deletes.rank_p([2.0, 4.0], [1.0, 3.0]) == 2 / 6
    # Tied values share their mean rank (1, 2.5, 2.5, 4): deletes {2.5, 4} sum 6.5, and so
    # do {2.5, 4} the other way: 2 of 6 again, with {2.5, 2.5} (5) and the rest below.
    assert deletes.rank_p([3.0, 5.0], [3.0, 1.0]) == 2 / 6
    assert deletes.above([3.0, 5.0], [3.0, 1.0]) == 3.5  # 3 > 1, 3 = 3 (half), 5 > both
    # Past EXACT_LABELLINGS the labellings are drawn, reproducibly, near the exact share; the
    # measured labelling counts among them, so a drawn p is never 0.
    quiet = [float(v) for v in range(40)]
    mine = [35.5, 36.5, 37.5, 38.5, 20.5, 10.5]
    drawn = deletes.rank_p(mine, quiet)
    assert drawn == deletes.rank_p(mine, quiet)
    assert 0.0 < drawn < 0.2
    assert deletes.rank_p([100.0 + v for v in range(6)], quiet) == 1 / 20_001


def test_the_ratio_bound_of_case_14_is_the_rank_tests_confidence_bound() -> None:
    """The deletes' p99 as a ratio of the quiet spans' (the median of the pairs' ratios) and its
    upper bound at 95%: for 6 and 6 spans, chance alone keeps U at 7 or below with a
    probability of 0.047 (at 8 or below, 0.066), so the bound is the 8th largest pair ratio."""
    quiet = [1.0, 1.02, 1.04, 1.06, 1.08, 1.10]
    mine = [q * 1.5 for q in quiet]
    ratio, bound = deletes.ratio_bound(mine, quiet)
    ratios = sorted(d / q for d in mine for q in quiet)
    assert abs(ratio - (ratios[17] * ratios[18]) ** 0.5) < 1e-9  # the median of 36, on logs
    assert abs(bound - ratios[36 - 8]) < 1e-9
    assert bound >= ratio >= 1.4
    # One span of each: no U is that unlikely, so no bound holds.
    assert deletes.ratio_bound([2.0], [1.0]) == (2.0, float("inf"))


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


def test_last_case_reads_the_end_and_the_whole_log_and_tabulates_both(tmp_path: Path) -> None:
    """Case 11 on a small session: the last 10 events and messages (checked against the whole
    log's end by the case itself) beside Since from 0 and a full derive, with their ratios."""
    small = replace(SETTINGS, last_events=3_000, derive_calls=2, last_full_calls=1)
    measured = last.run_last(small, tmp_path)
    assert [m.name for m in measured] == [
        "11 last 10 events (ListEvents desc)",
        "11 events, page back (x100, token)",
        "11 last 10 messages (walk back)",
        "11 messages, page back (x100, token)",
        "11 last 10 messages (memo warm)",
    ]
    for m in measured:
        d = m.details
        assert d["events_in_log"] == 3_000
        assert d["warm_ms"] > 0
        assert d["baseline_warm_ms"] > 0
        assert d["warm_ratio"] == pytest.approx(d["baseline_warm_ms"] / d["warm_ms"])
    assert [m.details["cold_ms"] is None for m in measured] == [False, True, False, True, True]
    report = render(Results([], [], [], [], last=measured), SETTINGS, "quick", _machine())
    assert "11 last 10 messages (walk back)" in report
    assert "full DeriveMessages" in report
    assert "One session of 3,000 events" in report


# -- the etcd peer ------------------------------------------------------------------------------


def test_etcd_puts_and_txns_are_counted_against_its_revision(
    servers: Servers, etcd_server: etcd.EtcdProcess
) -> None:
    """h2load puts and sends Txns of 100 Puts for a second each; the revision and every key's
    version account for each call h2load counted, and the table shows them beside sessionlog."""
    puts = etcd.run_writes(
        SETTINGS, etcd_server, etcd.WriteCase(clients=3, puts_per_call=1), servers.work
    )
    txns = etcd.run_writes(
        SETTINGS, etcd_server, etcd.WriteCase(clients=2, puts_per_call=100), servers.work
    )

    for measurement, clients in ((puts, 3), (txns, 2)):
        assert (measurement.errors, measurement.first_error) == (0, ""), measurement.name
        assert measurement.calls > 0
        assert measurement.server_cpu_seconds is not None
        assert measurement.server_cpu_seconds > 0
        applied = measurement.details["applied_calls_per_client"]
        counted = measurement.details["succeeded_per_client"]
        assert len(applied) == clients
        for done, seen in zip(counted, applied, strict=True):
            assert done <= seen <= done + 1
        assert measurement.details["revision_growth"] == sum(applied)
    assert puts.events == puts.calls
    assert txns.events == txns.calls * 100
    assert puts.name == "etcd Put 1 key, 3 clients (h2load)"
    assert txns.name == "etcd Txn of 100 Puts, 2 clients (h2load)"
    with grpc.insecure_channel(etcd_server.address) as channel:
        keys = etcd.versions(channel, b"bench/txn/1/")
    assert sorted(keys) == [b"bench/txn/1/%03d" % n for n in range(100)]
    assert len(set(keys.values())) == 1

    _, appended = cases.run_append_h2load(SETTINGS, servers.sessionlog, SMALL, servers.work)
    rows = [Row(appended.name, appended, puts, "etcd")]
    shown = etcd_table(rows)
    assert "9 append 1 ev/call, 3 clients (h2load)" in shown
    assert "  etcd Put 1 key, 3 clients (h2load)" in shown
    assert f"{appended.events_per_second / puts.events_per_second:.2f}" in shown
    assert "srv us/call" in shown
    report = render(Results([], [], [], [], etcd=rows), SETTINGS, "quick", _machine())
    assert shown in report
    assert "append 1 ev/call, 16 clients vs etcd Put (h2load)" in report
    assert workers.etcd_writes([*rows, Row(txns.name, appended, txns, "etcd")]) == {
        1: puts,
        100: txns,
    }


def test_an_etcd_error_is_caught_by_the_revision_check(
    servers: Servers, etcd_server: etcd.EtcdProcess
) -> None:
    """etcd refuses a Txn of more than 128 operations with a gRPC error, an HTTP 200 to h2load:
    the keys and the revision show that nothing was applied."""
    too_many = etcd.WriteCase(clients=1, puts_per_call=129)

    refused = etcd.run_writes(SETTINGS, etcd_server, too_many, servers.work)

    assert refused.calls > 0  # h2load saw only successes
    assert refused.errors >= 1
    assert refused.first_error.startswith("client 0: ")
    assert "(expected 129 keys, all alike)" in refused.first_error
    assert refused.details["applied_calls_per_client"] == [0]
    assert refused.details["revision_growth"] == 0


def test_etcd_range_page_and_since_page_read_whole_pages(
    servers: Servers, etcd_server: etcd.EtcdProcess
) -> None:
    """Both read rows fill a log of the same length and read its last page; every reply counted
    is complete, and a page is as many events as one Since batch."""
    small = replace(SETTINGS, page_log_events=4_000)
    page = min(page_events(), small.page_log_events)

    since = cases.run_since_page_h2load(small, servers.sessionlog, 2, servers.work)
    ranged = etcd.run_range_pages(small, etcd_server, 2, small.page_log_events, servers.work)

    for measurement in (since, ranged):
        assert (measurement.errors, measurement.first_error) == (0, ""), measurement.name
        assert measurement.calls > 0
        assert measurement.events == measurement.calls * page
        assert measurement.details["page_events"] == page
        reply = measurement.details["reply_bytes"]
        for calls, received in zip(
            measurement.details["succeeded_per_client"],
            measurement.details["received_bytes_per_client"],
            strict=True,
        ):
            assert calls * reply <= received <= (calls + 1) * reply
    assert since.name == f"since last page of {page:,} ev, 2 clients (h2load)"
    assert ranged.name == f"etcd Range page of {page:,} keys, 2 clients (h2load)"
    with grpc.insecure_channel(etcd_server.address) as channel:
        assert etcd.key_count(channel, etcd.LOG_PREFIX) == small.page_log_events
    assert workers.etcd_writes([Row(since.name, since, ranged, "etcd")]) == {}


def test_a_read_reply_missing_its_message_is_an_error(servers: Servers, h2load_path: str) -> None:
    """A Since that the server refuses is an HTTP 200 without a message: the byte count shows it
    for every client."""
    bad = SinceRequest(session_id="-not-a-session-id").SerializeToString()
    load = UnaryLoad(
        target=servers.sessionlog.address,
        method=cases.SINCE,
        requests=(bad, bad),
        events_per_call=1,
        duration=0.5,
        warmup=0,
        max_calls=1000,
        processes=2,
    )

    outcome = h2load.measure(load, "refused since", servers.sessionlog.cpu_seconds, servers.work)
    h2load.check_replies(outcome, 100)

    assert outcome.measurement.calls > 0
    assert outcome.measurement.errors == 2
    assert "received 0 bytes of replies" in outcome.measurement.first_error


def test_etcd_is_reported_missing_with_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without etcd on PATH its rows are skipped with a note saying how to install it."""
    monkeypatch.setenv("PATH", "/nonexistent")

    assert "apt-get install -y etcd-server" in etcd.unavailable()


# -- --workers 1 beside --workers N -------------------------------------------------------------


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of two worker processes, as the workers group starts it, stopped by PID."""
    work = tmp_path_factory.mktemp("workers")
    with procs.sessionlog_server(work / "data", work / "sessionlog.log", workers=2) as server:
        yield server


def test_a_server_of_two_workers_counts_both_workers_cpu_connections_and_commits(
    servers: Servers, two_workers: ServerProcess, h2load_path: str
) -> None:
    """16 h2load clients on two workers: each worker holds some of the connections, the server's
    CPU is both workers' (the supervisor serves nothing), and the writers' commits read from
    /metrics, summed over the workers, hold exactly the events stored."""
    pids = two_workers.worker_pids()
    supervisor_before = process_cpu_seconds(two_workers.pid) or 0.0
    case = cases.AppendCase(9, clients=16, events_per_call=1)

    _, appended = cases.run_append_h2load(SETTINGS, two_workers, case, servers.work)

    supervisor = (process_cpu_seconds(two_workers.pid) or 0.0) - supervisor_before
    assert (appended.errors, appended.first_error) == (0, "")
    assert appended.name == "9 append 1 ev/call, 16 clients (h2load, --workers 2)"
    assert len(pids) == 2
    assert two_workers.pid not in pids
    spread = appended.details["connections_per_worker"]
    assert len(spread) == 2
    assert sum(spread) == 16
    assert min(spread) > 0
    assert appended.server_cpu_seconds is not None
    assert appended.server_cpu_seconds > 2 * supervisor
    writer = appended.details["writer"]
    assert writer["events"] == sum(appended.details["stored_events_per_client"])
    assert 0 < writer["commits"] <= writer["events"]
    assert writer["commands_per_group"] >= 1
    assert writer["commit_ms"] > 0


def test_a_worker_without_connections_is_an_error_only_when_chance_cannot_explain_it() -> None:
    """16 clients over two workers all on one is an error; 4 all on one is only shown; a
    client not connected at the count (finished, or not started) is not; no count at all is."""

    def checked(clients: int, spread: list[int]) -> Measurement:
        measurement = Measurement("m", events=0, calls=0, seconds=1.0, client_cpu_seconds=0.0)
        cases._check_spread(measurement, 2, clients, spread)
        return measurement

    assert checked(16, [16, 0]).first_error == "16 clients, and a worker held none of them: [16, 0]"
    assert checked(4, [4, 0]).errors == 0
    assert checked(16, [9, 7]).errors == 0
    assert checked(16, [5, 6]).errors == 0
    assert checked(16, []).first_error == "16 clients, but the workers held no connections midway"


def test_the_tail_pins_its_writer_and_followers_to_different_workers(
    two_workers: ServerProcess,
) -> None:
    """With two workers the tail's writer is on worker 0 and its follower on worker 1: every
    event crosses workers, and every acknowledged one arrives."""
    measured = tail.run_tail(replace(SETTINGS, duration=0.5), two_workers, 1)

    assert (measured.errors, measured.first_error) == (0, "")
    assert measured.name == "5 live tail 1,000 ap/s, 1 follower, --workers 2"
    assert measured.details["samples"] == measured.calls > 0
    assert measured.details["writer_workers"] == [0]
    assert measured.details["follower_workers"] == [1]


def test_the_workers_group_runs_each_case_at_one_and_two_workers_with_etcd_beside(
    servers: Servers, etcd_server: etcd.EtcdProcess
) -> None:
    """The group measures every write case (h2load) and the tail at one worker and at two, reuses
    what it is given, puts etcd's Put and Txn beside the two-worker rows, and reports issue 14's
    targets."""
    small = replace(SETTINGS, duration=0.5, tail_followers=(1, 3))
    put = etcd.run_writes(small, etcd_server, etcd.PUTS, servers.work)

    rows = workers.run_group(
        small, servers.work, servers.sessionlog, {}, [], {1: put}, lambda _: None, workers=2
    )

    assert [row.case for row in rows] == [
        "1 append 1 ev/call, 1 client",
        "2 append 1 ev/call, 16 clients",
        "3 append 100 ev/call, 4 clients",
        "5 live tail 1,000 ap/s, 1 follower",
        "5 live tail 1,000 ap/s, 3 followers",
    ]
    for row in rows:
        for measurement in row.measurements():
            assert (measurement.errors, measurement.first_error) == (0, ""), measurement.name
            assert measurement.calls > 0, measurement.name
        assert (row.one.details["workers"], row.many.details["workers"]) == (1, 2)
    writes, tails = rows[:3], rows[3:]
    for row in writes:
        assert row.ratio == row.many.events_per_second / row.one.events_per_second
        assert len(row.many.details["connections_per_worker"]) == 2
        assert row.many.details["writer"]["events"] > 0
    assert rows[0].peer is None
    assert rows[1].peer is put  # given, not measured again
    assert rows[2].peer is not None
    assert rows[2].peer.details["puts_per_call"] == 100
    assert rows[2].peer_ratio == rows[2].many.events_per_second / rows[2].peer.events_per_second
    for row in tails:
        assert row.ratio is None
        assert row.many.details["writer_workers"] == [0]
        assert row.many.details["follower_workers"] == [1]

    report = render(Results([], [], [], [], workers=rows), small, "quick", _machine())
    assert workers_table(rows) in report
    assert workers_tail_table(rows) in report
    assert "  etcd Txn of 100 Puts, 4 clients (h2load)" in workers_table(rows)
    for what in (
        "append 1 ev/call, 16 clients, --workers 2 vs --workers 1 (h2load)",
        "append 100 ev/call, 4 clients, --workers 2 vs --workers 1 (h2load)",
        "append 100 ev/call, 4 clients, --workers 2 vs etcd Txn of 100 Puts",
        "append 1 ev/call, 16 clients, --workers 2 vs etcd Put (h2load)",
        "live tail p99 ack->arrival, 100 followers, --workers 2",
        "live tail p99 ack->arrival, 1 follower, --workers 2",
    ):
        assert what in report


# -- case 13: AppendStream through the compiled appendload --------------------------------------


@pytest.fixture(scope="module")
def appendload_binary(servers: Servers) -> Path:
    """bench/go/appendload built as the bench builds it (offline, GOPATH mode)."""
    assert not appendload.unavailable(), appendload.unavailable()
    return appendload.build(servers.work)


@pytest.mark.timeout(appendload.BUILD_SECONDS + 120)
def test_appendload_streams_and_calls_at_one_and_two_workers_beside_etcd(
    servers: Servers,
    two_workers: ServerProcess,
    etcd_server: etcd.EtcdProcess,
    appendload_binary: Path,
) -> None:
    """Case 13 small: AppendStream of 1 and of 100 events and unary Append, at one worker and at
    two, every session grown by exactly what appendload was acknowledged, etcd's Put and Txn
    beside (and its Put with 4 in flight, checked against its revision); the table and issue
    33's targets."""
    small = replace(SETTINGS, duration=0.5, stream_window=4)
    peers = {
        1: etcd.run_writes(small, etcd_server, etcd.PUTS, servers.work),
        100: etcd.run_writes(small, etcd_server, etcd.TXNS, servers.work),
    }
    pipelined = etcd.run_writes(small, etcd_server, etcd.pipelined_puts(4), servers.work)

    rows = streams.measure_rows(
        appendload_binary,
        small,
        servers.work,
        servers.sessionlog,
        two_workers,
        peers,
        lambda _: None,
        pipelined,
    )

    assert (pipelined.errors, pipelined.first_error) == (0, "")
    assert pipelined.details["in_flight"] == 4
    assert [row.pipelined_peer for row in rows] == [pipelined, None, None]
    assert [row.case for row in rows] == [
        "AppendStream 1 ev, 16 streams x 4 in flight",
        "Append 1 ev, 16 unary callers",
        "AppendStream 100 ev, 4 streams x 4 in flight",
    ]
    for row in rows:
        for measurement in (row.one, row.many):
            assert (measurement.errors, measurement.first_error) == (0, ""), measurement.name
            details = measurement.details
            assert details["load_client"] == "appendload"
            assert measurement.calls > 0
            assert measurement.events == measurement.calls * details["events_per_call"]
            assert details["acked_events_per_client"] == details["stored_events_per_client"]
            assert min(details["acked_events_per_client"]) > 0
            assert measurement.p50_ms is not None
            assert 0 < measurement.p50_ms <= (measurement.p99_ms or 0)
            assert (measurement.server_cpu_seconds or 0.0) > 0
            assert sum(details["connections_per_worker"]) == details["clients"]
        assert row.one.name.endswith("(appendload)")
        assert row.many.name.endswith("(appendload, --workers 2)")
        assert len(row.many.details["connections_per_worker"]) == 2
        assert row.ratio == row.many.events_per_second / row.one.events_per_second
    assert [row.peer for row in rows] == [peers[1], peers[1], peers[100]]
    assert rows[2].one.details["writer"]["events"] == rows[2].one.events

    shown = stream_table(rows)
    assert shown.count("  etcd Put 1 key, 16 clients (h2load)") == 1
    assert "  etcd Txn of 100 Puts, 4 clients (h2load)" in shown
    assert "  etcd Put 1 key, 16 clients x 4 in flight (h2load)" in shown
    report = render(Results([], [], [], [], streams=rows), small, "quick", _machine())
    assert shown in report
    found = {t.what: t for t in targets(Results([], [], [], [], streams=rows))}
    for what in (
        "AppendStream 1 ev, 16 streams x 4 in flight, --workers 1 vs etcd Put 1 key, 16 clients",
        "AppendStream 1 ev, 16 streams x 4 in flight, --workers 2 vs etcd Put 1 key, 16 clients",
        "AppendStream 100 ev, 4 streams x 4 in flight, --workers 1 vs etcd Txn of 100 Puts, "
        "4 clients",
        "Append 1 ev, 16 unary callers: --workers 2 vs 1",
    ):
        assert found[what].met is not None, what
        assert found[what].measured.endswith("x"), what


@pytest.mark.timeout(appendload.BUILD_SECONDS + 60)
@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_appendload_reports_a_refused_append(
    servers: Servers, appendload_binary: Path, mode: str
) -> None:
    """A session id the server refuses: appendload counts each answer as an error and says
    why (over AppendStream the stream goes on; the bench's warm-up stops the row)."""
    refused = appendload.LoadCase(mode, 2, 2, 1, session_prefix="x" * 240)
    small = replace(SETTINGS, duration=0.3, warmup=0.3)

    with pytest.raises(RuntimeError, match=r"appendload warm-up failed: .*INVALID_SESSION_ID"):
        appendload.run(appendload_binary, small, servers.sessionlog, refused, servers.work)


def test_appendload_is_reported_missing_with_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without go on PATH case 13 is skipped with a note saying how to install it."""
    monkeypatch.setattr(shutil, "which", lambda name: None)

    assert "make go-tools" in appendload.unavailable()


def _machine() -> dict[str, object]:
    return {"cpus": 2, "load_average_at_start": [0.0], "python": "3", "grpc": "1", "lmdb": "1"}


def test_ack_case_runs_both_modes_and_the_replica_rows_wait_for_the_replica(
    tmp_path: Path,
) -> None:
    """Case 9 appends through a primary with one replica under --ack local and --ack replica:
    every acknowledged event is stored (checked by the case), no write timed out, and only the
    --ack replica rows waited for the replica, once per call."""
    quick = replace(SETTINGS, duration=0.5, warmup=0.1)
    rows = ack.run_group(quick, tmp_path, lambda message: None)
    assert [row.kind for row in rows] == [ack.KIND] * len(ack.CASES)
    for row, case in zip(rows, ack.CASES, strict=True):
        assert case.label in row.case
        for measurement, mode in ((row.sessionlog, "replica"), (row.ceiling, "local")):
            assert measurement.name == f"--ack {mode}"
            assert (measurement.errors, measurement.events > 0) == (0, True)
            assert measurement.details["sessionlog_sync_timeouts_total"] == 0
        waited = row.sessionlog.details["sessionlog_sync_wait_seconds_count"]
        assert waited >= row.sessionlog.calls > 0
        assert row.ceiling.details["sessionlog_sync_wait_seconds_count"] == 0


# -- case 12, the framework backends beside SQLite, Redis and Postgres ---------------------------

TINY = replace(
    SETTINGS,
    frameworks_calls=6,
    frameworks_whole_calls=2,
    frameworks_items=120,
    frameworks_sessions=15,
)
STORES = {
    frameworks.OPENAI: ["sessionlog", "SQLite", "Redis", "Postgres"],
    frameworks.ADK: ["sessionlog", "SQLite", "Postgres"],
    frameworks.CLAUDE: ["sessionlog", "SQLite", "Redis", "Postgres"],
    frameworks.CONCURRENT: ["sessionlog", "SQLite", "Redis", "Postgres"],
    frameworks.LANGGRAPH: ["sessionlog", "SQLite", "Postgres"],
}


def test_frameworks_case_times_every_call_on_sessionlog_and_each_peer(servers: Servers) -> None:
    """Case 12 with tiny settings: every call of every framework on sessionlog, SQLite, Redis
    (OpenAI only) and a Postgres cluster of its own, each timed as often as asked, in the table
    with a ratio and a target each peer row either meets or not."""
    rows = frameworks.run_group(TINY, servers.sessionlog, servers.work, lambda _: None)

    skipped = [f"{r.framework} {r.call} {r.store}: {r.skipped}" for r in rows if r.skipped]
    # every peer runs in CI: make test runs make bench-tools (redis-server, postgresql)
    assert skipped == [], "peers missing: run `make bench-tools` as root"
    calls = {
        frameworks.OPENAI: frameworks.OPENAI_CALLS,
        frameworks.ADK: frameworks.ADK_CALLS,
        frameworks.LANGGRAPH: frameworks.LANGGRAPH_CALLS,
        frameworks.CLAUDE: frameworks.CLAUDE_CALLS,
        frameworks.CONCURRENT: frameworks.CONCURRENT_CALLS,
    }
    expected = [
        (framework, call, store)
        for framework, stores in STORES.items()
        for store in stores
        for call in calls[framework]
    ]
    assert [(r.framework, r.call, r.store.split(" ")[0]) for r in rows] == expected
    whole = {"get_items() whole", "list_sessions", "load"}
    at_once = frameworks.WRITERS * max(1, TINY.frameworks_calls // frameworks.WRITERS)
    for row in rows:
        wanted = TINY.frameworks_whole_calls if row.call in whole else TINY.frameworks_calls
        wanted = at_once if row.framework == frameworks.CONCURRENT else wanted
        assert len(row.latencies_ms) == wanted, (row.store, row.call)
        assert row.p50_ms is not None
        assert row.p99_ms is not None
        assert 0 < row.p50_ms <= row.p99_ms < 10_000, (row.store, row.call)
    goals = frameworks.goals(rows)
    assert len(goals) == len(rows) - sum(r.kind == frameworks.SESSIONLOG for r in rows)
    assert all(g.met is not None for g in goals)
    shown = frameworks.table(rows)
    assert "OpenAI Agents SDK get_items(limit=20)" in shown
    assert "Postgres (PostgresSaver)" in shown
    assert len(re.findall(r"\d+\.\d\dx  (met|NOT met)", shown)) == len(goals)
    report = render(Results([], [], [], [], frameworks=rows), TINY, "quick", _machine())
    assert shown in report
    assert "Google ADK list_sessions p50 vs SQLite (DatabaseSessionService)" in report
    assert "Claude Agent SDK load p50 vs Redis (AOF always, a list per transcript)" in report
    assert f"{frameworks.ONE_SESSION} p50 vs Postgres" in report


def test_frameworks_skipped_peer_is_shown_with_why_and_never_as_met() -> None:
    """A peer that could not run is a skipped row with its reason, and its target is not
    measured; a measured one meets its target by the ratio of the p50s: at most 1x against a
    networked peer, at most 2x against in-process SQLite on a cheap call, 1x on listing."""
    ours = frameworks.CallRow("F", "put", "sessionlog", frameworks.SESSIONLOG, [3.0, 3.0, 9.0])
    sqlite = frameworks.CallRow("F", "put", "SQLite", frameworks.IN_PROCESS, [2.0, 2.0])
    pg = frameworks.CallRow("F", "put", "Postgres", frameworks.NETWORKED, [2.0, 2.0])
    gone = frameworks.CallRow("F", "put", "Redis", frameworks.NETWORKED, skipped="no redis")
    lists = frameworks.CallRow("F", "list_sessions", "sessionlog", frameworks.SESSIONLOG, [3.0])
    lists_sqlite = frameworks.CallRow("F", "list_sessions", "SQLite", frameworks.IN_PROCESS, [2.0])
    rows = [ours, sqlite, pg, gone, lists, lists_sqlite]

    found = {g.what: g for g in frameworks.goals(rows)}

    assert (found["F put p50 vs SQLite"].met, found["F put p50 vs SQLite"].measured) == (
        True,
        "1.50x",
    )
    assert found["F put p50 vs Postgres"].met is False
    assert (found["F put p50 vs Redis"].met, found["F put p50 vs Redis"].measured) == (None, "-")
    assert found["F list_sessions p50 vs SQLite"].met is False
    shown = frameworks.table(rows)
    assert "skipped: no redis" in shown
    assert "1.50x  met" in shown
    assert "1.50x  NOT met" in shown
    report = render(Results([], [], [], [], frameworks=rows), TINY, "quick", _machine())
    assert re.search(r"F put p50 vs Redis\s+<= 1x\s+-\s+n/a", report)
