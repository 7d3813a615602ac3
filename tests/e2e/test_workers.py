"""`sessionlog serve --workers N`: one server of several processes (sessionlog.workers).

Real `sessionlog serve` processes on 127.0.0.1: the supervisor and its workers share one folder
and one port. Faults are real: SIGKILL of a worker under load (every acknowledged append must be
in the folder afterwards), SIGKILL of the supervisor, SIGTERM with a follower open.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog.workers.supervisor import UNRESPONSIVE_SECONDS
from tests.e2e._helpers import say
from tests.e2e._proc import free_port, run_cli
from tests.e2e._workers import connections_by_worker, workers

LOAD_SECONDS = 20.0
"""Every load loop below stops after this long, whatever happens."""


def test_one_server_of_several_processes_owns_its_folder_and_port(tmp_path: Path) -> None:
    """--workers 3: the supervisor starts three workers; a second server on the same folder,
    or on the same port (with one worker or several), is refused with one line."""
    with workers(tmp_path, 3) as server:
        start = server.serving_line()
        assert start["workers"] == 3
        assert sorted(start["pids"]) == sorted(server.pids())
        assert len(server.pids()) == 3
        served = sorted(e["worker"] for e in server.lines() if e["message"] == "worker serving")
        assert served == [0, 1, 2]
        same_folder = run_cli(
            ["serve", "--data", str(server.data), "--listen", f"127.0.0.1:{free_port()}"],
            tmp_path,
        )
        assert same_folder.returncode == 1
        assert "in use by another sessionlog server" in same_folder.stderr
        for count in ("1", "2"):
            same_port = run_cli(
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
            assert same_port.returncode == 1, same_port.stderr
            assert "cannot listen on" in same_port.stderr
            assert "Traceback" not in same_port.stderr
        assert len(server.pids()) == 3


def test_a_follower_sees_every_workers_commits_in_order(tmp_path: Path) -> None:
    """Appends over 16 connections (spread by the kernel over both workers) reach a follower
    of the session and a follower of the change feed, each on its own connection: every seq
    once, in order, each with the data acknowledged; feed positions dense."""
    total = 300
    with workers(tmp_path, 2) as server:
        arrived: list[pb.SinceResponse] = []
        feed: list[rpb.Change] = []
        ready = threading.Barrier(3, timeout=10)

        def follow_session() -> None:
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                stream = stub.Since(pb.SinceRequest(session_id="s", follow=True), timeout=60)
                for response in stream:
                    if response.caught_up and not arrived:
                        ready.wait()
                    arrived.append(response)
                    if sum(len(r.events) for r in arrived) >= total:
                        stream.cancel()
                        return

        def follow_feed() -> None:
            with grpc.insecure_channel(server.address) as channel:
                stub = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
                request = rpb.ChangesRequest(start_position=1, follow=True)
                stream = stub.Changes(request, timeout=60)
                caught_up = False
                for response in stream:
                    if response.caught_up and not caught_up:
                        caught_up = True
                        ready.wait()
                    feed.extend(response.changes)
                    if len(feed) >= total:
                        stream.cancel()
                        return

        followers = [threading.Thread(target=f) for f in (follow_session, follow_feed)]
        for thread in followers:
            thread.start()
        ready.wait()
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.insecure_channel(server.address, options=options) for _ in range(16)]
        stubs = [pb_grpc.SessionLogServiceStub(c) for c in channels]  # type: ignore[no-untyped-call]
        for stub in stubs:  # connect them all before counting
            stub.Surface(pb.SurfaceRequest(session_id="warm"), timeout=10)
        spread = connections_by_worker(server.pids(), server.port)
        acked = {}
        for n in range(total):
            reply = stubs[n % 16].Append(
                pb.AppendRequest(session_id="s", events=[say(f"m{n}")]), timeout=10
            )
            acked[reply.events[0].seq] = f"m{n}"
        for thread in followers:
            thread.join(30)
        for channel in channels:
            channel.close()
    assert len(spread) == 2, f"one worker took every connection: {spread}"
    events = [event for response in arrived for event in response.events]
    assert [event.seq for event in events] == list(range(total))
    assert [event.data["content"] for event in events] == [acked[s] for s in range(total)]
    positions = [change.position for change in feed]
    assert positions == list(range(1, total + 1))


def _load(
    address: str,
    session: str,
    stop: threading.Event,
    acked: list[tuple[int, str]],
    codes: list[grpc.StatusCode],
) -> None:
    """Append to ``session`` until ``stop`` (or LOAD_SECONDS), reconnecting after a failure;
    records what was acknowledged and how calls failed."""
    deadline = time.monotonic() + LOAD_SECONDS
    n = 0
    while not stop.is_set() and time.monotonic() < deadline:
        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            stub = pb_grpc.SessionLogServiceStub(ch)  # type: ignore[no-untyped-call]
            while not stop.is_set() and time.monotonic() < deadline:
                content = f"{session}-{n}"
                n += 1
                try:
                    reply = stub.Append(
                        pb.AppendRequest(session_id=session, events=[say(content)]), timeout=10
                    )
                except grpc.RpcError as error:
                    codes.append(error.code())
                    time.sleep(0.05)
                    break  # a new connection: the kernel may give it the other worker
                acked.append((reply.events[0].seq, content))


def test_a_killed_worker_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """SIGKILL one worker while six clients append: the supervisor logs which worker ended and
    how and starts another; calls in flight on it fail UNAVAILABLE; the clients carry on; and
    after the server stops, every acknowledged append is in the folder, at its seq, with its
    data (seqs dense in every session)."""
    sessions = [f"load-{i}" for i in range(6)]
    acked: dict[str, list[tuple[int, str]]] = {s: [] for s in sessions}
    codes: list[grpc.StatusCode] = []
    with workers(tmp_path, 2) as server:
        stop = threading.Event()
        threads = [
            threading.Thread(target=_load, args=(server.address, s, stop, acked[s], codes))
            for s in sessions
        ]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        before = sum(map(len, acked.values()))
        victim = server.pids()[0]
        os.kill(victim, signal.SIGKILL)
        server.wait_log("worker restarted")
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(LOAD_SECONDS + 15)
        after = sum(map(len, acked.values()))
        exited = [e for e in server.lines() if e["message"] == "worker exited; restarting it"]
        assert len(exited) == 1
        assert exited[0]["pid"] == victim
        assert exited[0]["exit"] == "signal SIGKILL"
        assert len(server.pids()) == 2
        assert victim not in server.pids()
        assert server.process.stop() == 0
    assert before > 0
    assert after > before, "the clients carried on after the kill"
    assert set(codes) <= {grpc.StatusCode.UNAVAILABLE}, Counter(codes)
    store = Store(server.data)
    try:
        for session in sessions:
            stored = [
                (event.seq, event.data["content"])
                for event in store.decode_events(store.read_session(session, 0), 0, session)
            ]
            assert [seq for seq, _ in stored] == list(range(len(stored)))
            by_seq = dict(stored)
            for seq, content in acked[session]:
                assert by_seq.get(seq) == content, f"{session} lost acknowledged seq {seq}"
    finally:
        store.close()


def test_sigterm_drains_every_worker_then_frees_the_folder(tmp_path: Path) -> None:
    """SIGTERM: a follower ends with UNAVAILABLE naming where to resume, every worker exits,
    the supervisor exits 0, and a new server starts on the same folder at once."""
    with workers(tmp_path, 2) as server:
        channel = grpc.insecure_channel(server.address)
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Append(pb.AppendRequest(session_id="d", events=[say("one")]), timeout=10)
        stream = stub.Since(pb.SinceRequest(session_id="d", follow=True), timeout=30)
        assert next(stream).events[0].seq == 0
        pids = server.pids()
        server.process.signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stream:
                pass
        channel.close()
        # UNAVAILABLE, the code to reconnect on. (Its details usually name the seq to resume
        # from; once in a CI run they were gRPC's own "Cancelling all calls": not yet explained.)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert server.process.wait(20) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
        messages = [e["message"] for e in server.lines()]
        assert messages.count("sessionlog stopped") == 3  # two workers, then the supervisor
        assert messages[-1] == "sessionlog stopped"
    with workers(tmp_path, 1, name="a") as again:
        reply = pb_grpc.SessionLogServiceStub(  # type: ignore[no-untyped-call]
            grpc.insecure_channel(again.address)
        ).Surface(pb.SurfaceRequest(session_id="d"), timeout=10)
        assert [e.data["content"] for e in reply.events] == ["one"]


def test_a_killed_supervisor_takes_its_workers_with_it(tmp_path: Path) -> None:
    """SIGKILL of the supervisor ends every worker at once (none is left holding the folder
    or the port), and a new server starts on the same folder, removing the metrics folder the
    killed one left in the temp folder."""
    with workers(tmp_path, 2) as server:
        pids = server.pids()
        left = list(Path(tempfile.gettempdir()).glob(f"sessionlog-metrics-{server.process.pid}-*"))
        assert len(left) == 1
        server.process.signal(signal.SIGKILL)
        server.process.wait(10)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    with workers(tmp_path, 2, name="a") as again:
        assert len(again.pids()) == 2
        assert not left[0].exists()


def test_a_worker_that_cannot_start_stops_the_server(tmp_path: Path) -> None:
    """A worker that fails at start (here: the token file is missing) makes `serve` exit 1
    with the worker's reason in one line, and leaves no process behind."""
    missing = tmp_path / "no-such-tokens.toml"
    result = run_cli(
        [
            "serve",
            "--data",
            str(tmp_path / "d"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--workers",
            "2",
            "--auth-tokens",
            str(missing),
        ],
        tmp_path,
    )
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("sessionlog: worker ")
    assert "could not start" in line
    assert str(missing) in line
    assert "Traceback" not in result.stderr
    # The folder is free again: the same command without the bad flag starts.
    with workers(tmp_path, 2, name="d") as server:
        assert len(server.pids()) == 2


def test_a_frozen_worker_is_replaced(tmp_path: Path) -> None:
    """SIGSTOP one worker (its connections would hang, unseen): once its heartbeat has been
    silent for UNRESPONSIVE_SECONDS the supervisor logs it, kills it and starts another, and
    appends go on over fresh connections."""
    with workers(tmp_path, 2) as server:
        frozen = server.pids()[0]
        os.kill(frozen, signal.SIGSTOP)
        server.wait_log("worker is not responding; killing it", timeout=UNRESPONSIVE_SECONDS + 15)
        server.wait_log("worker restarted")
        killed = next(
            e for e in server.lines() if e["message"] == "worker is not responding; killing it"
        )
        assert killed["pid"] == frozen
        assert killed["silent_seconds"] >= UNRESPONSIVE_SECONDS  # logged rounded to 0.1 s
        assert frozen not in server.pids()
        for n in range(8):
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                reply = stub.Append(pb.AppendRequest(session_id="f", events=[say("x")]), timeout=10)
                assert reply.next_seq == n + 1
