"""`sessionlog admin`: stats of a live data folder, and an online backup taken while writers run
that a new server restores with every session a dense, byte-identical prefix of the source."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from sessionlog import wire
from sessionlog.storage.store import Store
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, free_port, run_cli

MAP_SIZE = 256 << 20
WRITERS = 4
APPENDS_PER_WRITER = 2000
WRITE_SECONDS = 15.0
TIMEOUT = 5.0
SINCE = "/sessionlog.v1.SessionLogService/Since"


@contextmanager
def serving(cwd: Path, data: str, name: str) -> Iterator[str]:
    """A `sessionlog serve` process on ``data``; yields its address once SERVING."""
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", data, "--listen", address, "--map-size", str(MAP_SIZE)]
    with ServerProcess(args, cwd, name=name) as process:
        process.wait_serving(address)
        yield address


def event(seq_hint: int) -> event_pb2.Event:
    kind = event_pb2.EVENT_TYPE_USER_MESSAGE if seq_hint % 2 else event_pb2.EVENT_TYPE_TOOL_CALL
    message = event_pb2.Event(type=kind)
    message.data.update({"content": f"event {seq_hint} " + "x" * (seq_hint % 300)})
    return message


def raw_events(channel: grpc.Channel, session_id: str) -> list[bytes]:
    """A session's events exactly as the server sends them (stored bytes, never re-encoded)."""
    since = channel.unary_stream(SINCE, request_serializer=pb.SinceRequest.SerializeToString)
    out: list[bytes] = []
    for raw in since(pb.SinceRequest(session_id=session_id), timeout=TIMEOUT):
        out.extend(wire.split_field(raw, 1)[1])
    return out


def session_ids(stub: pb_grpc.SessionLogServiceStub) -> list[str]:
    reply = stub.ListSessions(pb.ListSessionsRequest(page_size=1000), timeout=TIMEOUT)
    assert not reply.next_page_token
    return [s.session_id for s in reply.sessions]


def test_stats_of_a_live_server(tmp_path: Path) -> None:
    """`admin stats` reads sessions, events, position and map usage from the folder a running
    server writes to, and with --server adds that server's replication state."""
    with serving(tmp_path, "data", "stats") as address, grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for i in range(3):
            stub.Append(
                pb.AppendRequest(session_id=f"stats-{i}", events=[event(1), event(2)]),
                timeout=TIMEOUT,
            )
        result = run_cli(
            ["admin", "stats", "--data", "data", "--server", address, "--json"], tmp_path
        )
        text = run_cli(["admin", "stats", "--data", "data"], tmp_path)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["sessions"] == 3
    assert stats["events"] == 6
    assert stats["position"] == 3
    assert stats["map_size"] == MAP_SIZE
    assert 0 < stats["used_bytes"] <= stats["file_bytes"]
    assert stats["replication"] == {"role": "primary", "position": 3, "epoch": 1}
    assert len(stats["history_id"]) == 16
    assert text.returncode == 0, text.stderr
    lines = dict(line.split(None, 1) for line in text.stdout.splitlines())
    assert lines["sessions"] == "3"
    assert lines["map_size"].startswith(f"{MAP_SIZE} ")


def test_backup_during_writes_restores_consistent_prefixes(tmp_path: Path) -> None:
    """A backup taken while four writers append holds, for every session, a dense prefix of the
    source's log with the same bytes, including every append acknowledged before it began."""
    acknowledged: dict[str, int] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    def write(n: int) -> None:
        session_id = f"writer-{n}"
        try:
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                deadline = time.monotonic() + WRITE_SECONDS
                for i in range(APPENDS_PER_WRITER):
                    if stop.is_set() or time.monotonic() > deadline:
                        return
                    reply = stub.Append(
                        pb.AppendRequest(session_id=session_id, events=[event(i), event(i + 1)]),
                        timeout=TIMEOUT,
                    )
                    acknowledged[session_id] = reply.next_seq
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    with serving(tmp_path, "data", "source") as address:
        threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + WRITE_SECONDS
        while sum(acknowledged.values()) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = dict(acknowledged)
        backup = run_cli(["admin", "backup", "backup", "--data", "data"], tmp_path)
        during = dict(acknowledged)
        stop.set()
        for thread in threads:
            thread.join(WRITE_SECONDS + TIMEOUT)
        assert not failures, failures
        assert backup.returncode == 0, backup.stderr
        assert "backed up" in backup.stdout
        assert sorted((tmp_path / "backup").iterdir()) == [tmp_path / "backup" / "data.mdb"]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            source_events = {s: raw_events(channel, s) for s in session_ids(stub)}
    assert sum(during.values()) > sum(before.values()), "no write ran during the backup"

    with (
        serving(tmp_path, "backup", "restored") as restored,
        grpc.insecure_channel(restored) as channel,
    ):
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        backed_up = {s: raw_events(channel, s) for s in session_ids(stub)}
        for session_id, events in backed_up.items():
            view = stub.GetSession(pb.GetSessionRequest(session_id=session_id), timeout=TIMEOUT)
            assert view.session.event_count == len(events)
    assert set(before) <= set(backed_up) <= set(source_events)
    for session_id, events in backed_up.items():
        seqs = [event_pb2.Event.FromString(raw).seq for raw in events]
        assert seqs == list(range(len(events))), f"{session_id}: seqs not dense"
        assert events == source_events[session_id][: len(events)], f"{session_id}: bytes differ"
        assert len(events) >= before.get(session_id, 0), f"{session_id}: acknowledged lost"


def test_backup_refuses_an_unusable_destination_or_source(tmp_path: Path) -> None:
    """A backup into a folder that is not empty, or from a folder without a store, fails with
    one line and exit 1, writing nothing."""
    Store(tmp_path / "data").close()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    busy = run_cli(["admin", "backup", "taken", "--data", "data"], tmp_path)
    missing = run_cli(["admin", "backup", "fresh", "--data", "nothing-here"], tmp_path)
    for result in (busy, missing):
        assert result.returncode == 1
        assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in taken.iterdir()) == ["keep.txt"]
    assert "not an empty folder" in busy.stderr
    assert "no sessionlog store" in missing.stderr
    assert not (tmp_path / "fresh").exists()


def test_a_snapshot_file_given_as_data_is_refused_in_one_line(tmp_path: Path) -> None:
    """`admin snapshot save` writes a file; stats, verify and erasures given that file as
    --data say it is a file, not a data folder, in one line with exit 1 (no traceback)."""
    Store(tmp_path / "data").close()
    snapshot = tmp_path / "snapshot.mdb"
    snapshot.write_bytes((tmp_path / "data" / "data.mdb").read_bytes())
    for command in (["stats"], ["verify"], ["erasures"]):
        result = run_cli(["admin", *command, "--data", str(snapshot)], tmp_path)
        assert result.returncode == 1, command
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "is a file, not a data folder" in result.stderr
        assert "admin restore FILE" in result.stderr
