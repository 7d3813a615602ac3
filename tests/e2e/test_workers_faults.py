"""`sessionlog serve --workers N` under faults, and the semantics that must hold across workers.

Real servers on 127.0.0.1 (see test_workers). Calls are pinned to a chosen worker: a channel
is opened until /proc shows the kernel gave its connection to that worker's process. Faults
are real signals and a real LMDB writer in another process; every loop is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog.service.metrics import PUBLISH_SECONDS
from sessionlog.storage.folder import FolderLock
from sessionlog.storage.store import Store
from sessionlog.testing import error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import say
from tests.e2e._proc import free_port, run_cli
from tests.e2e._workers import channel_on, stubs_by_worker, workers

SECONDS = 20.0
"""Every wait and loop below gives up after this long."""


# -- ports --------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", ["1", "2"])
@pytest.mark.parametrize(
    ("flag", "host"),
    [
        ("--http-listen", "127.0.0.1"),
        ("--metrics-listen", "127.0.0.1"),
        ("--http-listen", "0.0.0.0"),  # a wildcard covering the gRPC address
    ],
)
def test_two_addresses_of_one_server_on_one_port_are_refused(
    tmp_path: Path, count: str, flag: str, host: str
) -> None:
    """The web console or metrics on the gRPC port is refused with one line, by one worker or
    several alike. (Several used to start "serving" with every gRPC call failing: the reserved
    port's probes let the second address in, and the workers' SO_REUSEPORT sockets then split
    the port between gRPC and HTTP.)"""
    port = free_port()
    result = run_cli(
        [
            "serve",
            "--data",
            str(tmp_path / "d"),
            "--listen",
            f"127.0.0.1:{port}",
            flag,
            f"{host}:{port}",
            "--workers",
            count,
        ],
        tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on {host}:{port} ({flag})" in result.stderr
    assert "Traceback" not in result.stderr


def test_each_address_given_port_0_gets_its_own_port(tmp_path: Path) -> None:
    """Port 0 for gRPC, the console (127.0.0.1) and metrics (localhost: IPv4 and IPv6): the
    kernel picks three different ports, and the console and metrics answer on theirs."""
    with workers(
        tmp_path, 2, "--http-listen", "127.0.0.1:0", "--metrics-listen", "localhost:0"
    ) as server:
        line = server.serving_line()
        http, metrics = line["http"], line["metrics"]
        ports = {server.port, int(http.rsplit(":", 1)[1]), int(metrics.rsplit(":", 1)[1])}
        assert len(ports) == 3, line
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
            assert b"sessionlog_info" in reply.read()
        with urllib.request.urlopen(f"http://{http}/", timeout=10) as reply:
            assert reply.status == 200


def test_no_other_server_takes_the_port_while_every_worker_restarts(tmp_path: Path) -> None:
    """With the supervisor held (SIGSTOP) and both its workers killed, nothing listens on the
    port: another server on it, with one worker or two, is still refused (it used to start,
    and the first server's restarted workers then shared the port with it, silently); once
    the supervisor resumes, its new workers serve."""
    with workers(tmp_path, 2) as server:
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            for pid in server.pids():
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + SECONDS
            while _listening(server.port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _listening(server.port)
            for count in ("1", "2"):
                other = run_cli(
                    [
                        "serve",
                        "--data",
                        str(tmp_path / f"other-{count}"),
                        "--listen",
                        server.address,
                        "--workers",
                        count,
                    ],
                    tmp_path,
                )
                assert other.returncode == 1, other.stderr
                assert f"cannot listen on {server.address}" in other.stderr
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        server.wait_log("worker restarted", count=2, timeout=60)
        server.process.wait_serving(server.address)


def _listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                return True
    return False


# -- what the supervisor reports ----------------------------------------------------------------


def test_a_worker_killed_while_starting_is_reported_as_killed(tmp_path: Path) -> None:
    """Six times, SIGKILL a worker and then its replacement as soon as it is made: each
    failed restart is logged as ended by SIGKILL (asyncio used to say "code 255" now and then,
    and warn of an unknown child: the supervisor's signalling had reaped it first), and the
    supervisor ends with two serving workers."""
    rounds = 6
    with workers(tmp_path, 2) as server:
        for done in range(rounds):
            serving = server.pids()
            os.kill(serving[0], signal.SIGKILL)
            starting: list[int] = []
            deadline = time.monotonic() + SECONDS
            while not starting and time.monotonic() < deadline:  # no sleep: catch it early
                starting = [pid for pid in server.pids() if pid not in serving]
            assert starting, "no replacement started"
            os.kill(starting[0], signal.SIGKILL)
            server.wait_log("worker restarted", count=done + 1, timeout=60)
        retried = [
            e for e in server.lines() if e["message"] == "worker could not restart; trying again"
        ]
        assert len(retried) == rounds, server.process.log()
        hows = [e["error"].rsplit(": it ended with ", 1)[1] for e in retried]
        assert hows == ["signal SIGKILL before serving"] * rounds
        assert "Unknown child process" not in server.process.log()
        assert len(server.pids()) == 2
        assert server.process.stop() == 0


# -- semantics across workers -------------------------------------------------------------------


def test_a_request_id_retried_on_another_worker_replays(tmp_path: Path) -> None:
    """An append with a request_id acknowledged by worker 0, retried on worker 1: the same
    seq comes back and the log holds it once; with other events it is refused."""
    with workers(tmp_path, 2) as server:
        zero, one = stubs_by_worker(server)
        request = pb.AppendRequest(session_id="r", events=[say("once")], request_id="req-1")
        first = zero.Append(request, timeout=10)
        again = one.Append(request, timeout=10)
        assert [e.seq for e in again.events] == [e.seq for e in first.events] == [0]
        other = pb.AppendRequest(session_id="r", events=[say("other")], request_id="req-1")
        with pytest.raises(grpc.RpcError) as refused:
            one.Append(other, timeout=10)
        assert error_info(refused.value).reason == "REQUEST_ID_REUSED"
        surface = zero.Surface(pb.SurfaceRequest(session_id="r"), timeout=10)
        assert [e.data["content"] for e in surface.events] == ["once"]


def test_a_lease_taken_on_one_worker_binds_the_others(tmp_path: Path) -> None:
    """A lease acquired through worker 0 refuses another holder's append and acquire through
    worker 1, and its holder's append through worker 1 goes in."""
    with workers(tmp_path, 2) as server:
        zero, one = stubs_by_worker(server)
        lease = zero.AcquireLease(
            pb.AcquireLeaseRequest(session_id="l", holder="alice", ttl=Duration(seconds=60)),
            timeout=10,
        ).lease
        with pytest.raises(grpc.RpcError) as stranger:
            one.Append(
                pb.AppendRequest(session_id="l", events=[say("x")], lease_holder="bob"), timeout=10
            )
        assert error_info(stranger.value).reason == "LEASE_HELD"
        with pytest.raises(grpc.RpcError) as taken:
            one.AcquireLease(pb.AcquireLeaseRequest(session_id="l", holder="bob"), timeout=10)
        assert error_info(taken.value).reason == "LEASE_HELD"
        reply = one.Append(
            pb.AppendRequest(
                session_id="l",
                events=[say("mine")],
                lease_holder="alice",
                lease_token=lease.token,
            ),
            timeout=10,
        )
        assert reply.events[0].seq == 0


def test_a_follower_on_one_worker_is_woken_by_every_commit_of_another(tmp_path: Path) -> None:
    """Heartbeats 60 s apart (so no re-read hides a lost wakeup): each of 100 appends through
    worker 1 reaches a follower on worker 0 before the next is sent, in order, once each."""
    with workers(tmp_path, 2, "--heartbeat", "60") as server:
        zero, one = stubs_by_worker(server)
        arrived: list[int] = []
        seen = threading.Condition()
        caught_up = threading.Event()

        def follow() -> None:
            stream = zero.Since(pb.SinceRequest(session_id="f", follow=True), timeout=120)
            for response in stream:
                if response.caught_up:
                    caught_up.set()
                with seen:
                    arrived.extend(e.seq for e in response.events)
                    seen.notify_all()
                if len(arrived) >= 100:
                    stream.cancel()
                    return

        follower = threading.Thread(target=follow)
        follower.start()
        assert caught_up.wait(SECONDS)
        late: list[int] = []
        for n in range(100):
            one.Append(pb.AppendRequest(session_id="f", events=[say(f"m{n}")]), timeout=10)
            with seen:
                if not seen.wait_for(lambda: len(arrived) > n, timeout=5.0):  # noqa: B023
                    late.append(n)
                    break
        follower.join(SECONDS)
        assert not late, f"append {late} never reached the follower on the other worker"
        assert arrived == list(range(100))


def test_a_commit_whose_worker_died_before_ringing_still_wakes_the_others(
    tmp_path: Path,
) -> None:
    """A worker killed between its commit and ringing the other workers' bells: the
    supervisor rings them when it sees the worker exit, so a follower on another worker gets
    the event at once, not at its next heartbeat (60 s here). The dying worker is played by
    a store opened in this process on the server's folder, which commits and rings no one,
    followed by a SIGKILL of worker 1."""
    with workers(tmp_path, 2, "--heartbeat", "60") as server:
        zero = stubs_by_worker(server)[0]
        arrived: list[str] = []
        caught_up = threading.Event()
        stream = zero.Since(pb.SinceRequest(session_id="o", follow=True), timeout=60)

        def follow() -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled at the end
                for response in stream:
                    if response.caught_up:
                        caught_up.set()
                    arrived.extend(e.data["content"] for e in response.events)

        follower = threading.Thread(target=follow)
        follower.start()
        try:
            assert caught_up.wait(SECONDS)
            silent = Store(server.data, lock=FolderLock(server.data, -1), prepared=True)
            try:
                silent.append("o", [say("orphan")])
            finally:
                silent.close()
            time.sleep(0.5)
            assert arrived == [], "woken without a bell"
            os.kill(server.pids()[1], signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not arrived and time.monotonic() < deadline:
                time.sleep(0.02)
            assert arrived == ["orphan"], "the follower slept through the dead worker's commit"
        finally:
            stream.cancel()
            follower.join(SECONDS)


def test_appends_racing_on_one_session_from_both_workers_stay_dense(tmp_path: Path) -> None:
    """Eight clients, four on each worker, append pairs to one session with expected_seq,
    retrying from the next seq SEQ_CONFLICT reports: every pair acknowledged is in the log at
    its seqs, no seq twice, the log dense; CreateSession of one id from both workers at once
    succeeds exactly once."""
    with workers(tmp_path, 2) as server:
        pids = server.pids()
        stubs = [
            pb_grpc.SessionLogServiceStub(channel_on(server, pids[n % 2]))  # type: ignore[no-untyped-call]
            for n in range(8)
        ]
        acked: list[tuple[int, str]] = []
        reasons: set[str] = set()
        deadline = time.monotonic() + SECONDS

        def race(n: int) -> None:
            expect = done = 0
            while done < 40 and time.monotonic() < deadline:
                name = f"c{n}-{done}"
                request = pb.AppendRequest(
                    session_id="race", events=[say(name), say(name)], expected_seq=expect
                )
                try:
                    reply = stubs[n].Append(request, timeout=10)
                except grpc.RpcError as error:
                    info = error_info(error)
                    reasons.add(info.reason)
                    expect = int(info.metadata.get("next_seq", expect))
                    continue
                acked.append((reply.events[0].seq, name))
                expect, done = reply.events[-1].seq + 1, done + 1

        racers = [threading.Thread(target=race, args=(n,)) for n in range(8)]
        for thread in racers:
            thread.start()
        for thread in racers:
            thread.join(SECONDS + 10)
        assert len(acked) == 8 * 40
        assert reasons <= {"SEQ_CONFLICT"}
        events = stubs[0].Surface(pb.SurfaceRequest(session_id="race"), timeout=10).events
        assert [e.seq for e in events] == list(range(2 * len(acked)))
        by_seq = {e.seq: e.data["content"] for e in events}
        for seq, name in acked:
            assert by_seq[seq] == by_seq[seq + 1] == name
        outcomes: list[str] = []

        def create(n: int) -> None:
            request = pb.CreateSessionRequest(session_id="new", events=[say(f"by {n}")])
            try:
                stubs[n].CreateSession(request, timeout=10)
                outcomes.append("created")
            except grpc.RpcError as error:
                outcomes.append(error_info(error).reason)

        creators = [threading.Thread(target=create, args=(n,)) for n in range(4)]
        for thread in creators:
            thread.start()
        for thread in creators:
            thread.join(SECONDS)
        assert sorted(outcomes) == ["SESSION_ALREADY_EXISTS"] * 3 + ["created"]


def test_a_killed_holder_of_the_write_lock_stops_no_worker(tmp_path: Path) -> None:
    """A process SIGKILLed inside an LMDB write transaction on the folder (as a worker killed
    mid-commit would be): the appends waiting behind it in both workers then go in (LMDB's
    lock is a robust mutex), and what it wrote is not there."""
    with workers(tmp_path, 2) as server:
        stubs = stubs_by_worker(server)
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import lmdb, sys, time\n"
                f"env = lmdb.open({str(server.data)!r}, max_dbs=32, map_size=1 << 30)\n"
                "txn = env.begin(write=True)\n"
                "txn.put(b'killed-holder', b'x', db=env.open_db(b'sessions', txn=txn))\n"
                "print('holding', flush=True)\n"
                "time.sleep(60)\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "holding"
            results: dict[int, int] = {}

            def append(slot: int) -> None:
                reply = stubs[slot].Append(
                    pb.AppendRequest(session_id="k", events=[say(f"w{slot}")]), timeout=SECONDS
                )
                results[slot] = reply.events[0].seq

            waiting = [threading.Thread(target=append, args=(slot,)) for slot in (0, 1)]
            for thread in waiting:
                thread.start()
            time.sleep(1.0)
            assert results == {}, "an append went in while another process held the lock"
        finally:
            holder.kill()
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()
        for thread in waiting:
            thread.join(SECONDS)
        assert sorted(results.values()) == [0, 1]
        listed = stubs[0].ListSessions(pb.ListSessionsRequest(), timeout=10)
        assert [s.session_id for s in listed.sessions] == ["k"]


# -- problems found, and fixed ------------------------------------------------------------------


def test_metrics_count_every_workers_appends(tmp_path: Path) -> None:
    """10 appends through worker 0 and 3 through worker 1: once the workers have published
    (every PUBLISH_SECONDS), every scrape, whichever worker answers it, says 13."""
    metrics = f"127.0.0.1:{free_port()}"
    with workers(tmp_path, 2, "--metrics-listen", metrics) as server:
        zero, one = stubs_by_worker(server)
        for n in range(13):
            (zero if n < 10 else one).Append(
                pb.AppendRequest(session_id="m", events=[say("x")]), timeout=10
            )
        time.sleep(2 * PUBLISH_SECONDS + 0.1)
        seen = set()
        for _ in range(8):
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
                body = reply.read().decode()
            found = re.search(r"^sessionlog_appended_events_total (\S+)$", body, re.M)
            assert found is not None
            seen.add(float(found.group(1)))
        assert seen == {13.0}


def test_writes_stuck_behind_the_write_lock_are_reported(tmp_path: Path) -> None:
    """Another process holds the write lock (as a frozen worker would): within 15 s the
    server's log says that writes are waiting for it."""
    with workers(tmp_path, 2) as server:
        stubs = stubs_by_worker(server)
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import lmdb, time\n"
                f"env = lmdb.open({str(server.data)!r}, max_dbs=32, map_size=1 << 30)\n"
                "txn = env.begin(write=True)\n"
                "print('holding', flush=True)\n"
                "time.sleep(60)\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "holding"
            with pytest.raises(grpc.RpcError) as stuck:
                stubs[0].Append(pb.AppendRequest(session_id="s", events=[say("x")]), timeout=2)
            assert stuck.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            deadline = time.monotonic() + 15
            warned = False
            while time.monotonic() < deadline and not warned:
                warned = any(
                    e["level"] in ("warning", "error") and "lock" in json.dumps(e).lower()
                    for e in server.lines()
                )
                time.sleep(0.2)
        finally:
            holder.kill()
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()
        assert warned, server.process.log()


def test_max_streams_is_the_servers_whichever_worker_holds_them(tmp_path: Path) -> None:
    """--max-streams 4 and two workers: three follow streams on one connection all open."""
    with workers(tmp_path, 2, "--max-streams", "4") as server:
        zero = stubs_by_worker(server)[0]
        streams = [
            zero.Since(pb.SinceRequest(session_id=f"s{n}", follow=True), timeout=30)
            for n in range(3)
        ]
        try:
            for stream in streams:
                assert next(stream).caught_up
        finally:
            for stream in streams:
                stream.cancel()
