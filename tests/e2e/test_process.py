"""The `sessionlog serve` process: defaults, flags and env, errors, SIGTERM, and kill -9.

Each test runs the installed console script as a child process with its cwd in tmp_path and no
SESSIONLOG_* variables inherited, and stops it by PID.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import user
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli

pytestmark = pytest.mark.workers

FLAGS = ("--data", "--listen", "--map-size", "--durability", "--log-level")


def number(event: event_pb2.Event, key: str) -> int:
    """An integer stored in event data (a Struct holds it as a float)."""
    value = event.data[key]
    assert isinstance(value, float), f"{key} is {value!r}"
    return int(value)


def stub_for(channel: grpc.Channel) -> pb_grpc.SessionLogServiceStub:
    return pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]


def read_all(address: str, session_id: str) -> list[event_pb2.Event]:
    """Every stored event of a session (Since without follow)."""
    with grpc.insecure_channel(address) as channel:
        responses = stub_for(channel).Since(pb.SinceRequest(session_id=session_id), timeout=10)
        return [event for response in responses for event in response.events]


def append_contents(address: str, session_id: str, *contents: str) -> int:
    """Append user messages in one batch; the next seq afterwards."""
    with grpc.insecure_channel(address) as channel:
        reply = stub_for(channel).Append(
            pb.AppendRequest(session_id=session_id, events=[user(c) for c in contents]),
            timeout=10,
        )
    next_seq: int = reply.next_seq
    return next_seq


def assert_one_line_error(stderr: str, *mentions: str) -> None:
    """stderr holds exactly one line, not a traceback, naming each of ``mentions``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"expected a one-line error, got {len(lines)} lines:\n{stderr}"
    for mention in mentions:
        assert mention in lines[0], f"{mention!r} not in {lines[0]!r}"


def test_defaults_create_data_folder_and_listen_on_50051(tmp_path: Path) -> None:
    """With no flags or env it creates ./sessionlog-data and serves 127.0.0.1:50051, and says so."""
    with ServerProcess([], cwd=tmp_path) as server:
        server.wait_serving("127.0.0.1:50051")
        assert (tmp_path / "sessionlog-data").is_dir()
        assert append_contents("127.0.0.1:50051", "s", "hello") == 1
        log = server.log()
        assert server.stop() == 0
    assert "sessionlog-data" in log
    assert "127.0.0.1:50051" in log


def test_env_vars_choose_data_and_listen(tmp_path: Path) -> None:
    """SESSIONLOG_DATA and SESSIONLOG_LISTEN set the data folder and the address."""
    port = free_port()
    env = clean_env(
        SESSIONLOG_DATA=str(tmp_path / "from-env"), SESSIONLOG_LISTEN=f"127.0.0.1:{port}"
    )
    with ServerProcess([], cwd=tmp_path, env=env) as server:
        server.wait_serving(f"127.0.0.1:{port}")
        assert append_contents(f"127.0.0.1:{port}", "s", "a", "b") == 2
        assert server.stop() == 0
    assert (tmp_path / "from-env").is_dir()
    assert not (tmp_path / "sessionlog-data").exists()


def test_flags_win_over_env_vars(tmp_path: Path) -> None:
    """--data and --listen override SESSIONLOG_DATA and SESSIONLOG_LISTEN."""
    env_port, flag_port = free_port(), free_port()
    env = clean_env(
        SESSIONLOG_DATA=str(tmp_path / "from-env"), SESSIONLOG_LISTEN=f"127.0.0.1:{env_port}"
    )
    flags = ["--data", str(tmp_path / "from-flag"), "--listen", f"127.0.0.1:{flag_port}"]
    with ServerProcess(flags, cwd=tmp_path, env=env) as server:
        server.wait_serving(f"127.0.0.1:{flag_port}")
        assert append_contents(f"127.0.0.1:{flag_port}", "s", "a") == 1
        assert server.stop() == 0
    assert (tmp_path / "from-flag").is_dir()
    assert not (tmp_path / "from-env").exists()


def test_help_explains_every_flag(tmp_path: Path) -> None:
    """`sessionlog serve --help` lists each flag with its environment variable."""
    result = run_cli(["serve", "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # undo argparse's line wrapping
    for flag in FLAGS:
        assert flag in text
        assert "SESSIONLOG_" + flag.removeprefix("--").replace("-", "_").upper() in text


def test_bad_flag_value_is_a_one_line_error(tmp_path: Path) -> None:
    """--map-size banana exits 2 with one line on stderr naming the flag; no traceback."""
    result = run_cli(["serve", "--map-size", "banana"], cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "--map-size", "banana")


def test_unusable_data_folder_is_a_one_line_error(tmp_path: Path) -> None:
    """A data folder under a regular file exits 1 with one line on stderr; no traceback."""
    (tmp_path / "plain-file").write_text("not a folder")
    data = tmp_path / "plain-file" / "data"
    result = run_cli(["serve", "--data", str(data), "--listen", "127.0.0.1:0"], cwd=tmp_path)
    assert result.returncode == 1
    assert_one_line_error(result.stderr, str(data))


def test_busy_port_fails_loudly(tmp_path: Path) -> None:
    """A second server on a port already served exits 1 with one line on stderr; no sharing."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    with ServerProcess(["--data", "first", "--listen", address], cwd=tmp_path) as first:
        first.wait_serving(address)
        second = run_cli(["serve", "--data", "second", "--listen", address], cwd=tmp_path)
        assert second.returncode == 1
        assert_one_line_error(second.stderr, address)
        assert "in use" in second.stderr
        assert append_contents(address, "s", "still the first") == 1
        assert first.stop() == 0
    assert len(read_all_after_restart(tmp_path / "first", "s")) == 1


def read_all_after_restart(data: Path, session_id: str) -> list[event_pb2.Event]:
    """Start a server on ``data`` (fresh port), read a session, stop it."""
    address = f"127.0.0.1:{free_port()}"
    with ServerProcess(["--data", str(data), "--listen", address], cwd=data.parent) as server:
        server.wait_serving(address)
        events = read_all(address, session_id)
        assert server.stop() == 0
    return events


@pytest.mark.serial  # ends within 5 s of SIGTERM
def test_sigterm_ends_follow_with_unavailable_and_exits_zero(tmp_path: Path) -> None:
    """SIGTERM ends an open follow stream with UNAVAILABLE, exits 0 promptly, keeps the data."""
    address = f"127.0.0.1:{free_port()}"
    with ServerProcess(["--data", "data", "--listen", address], cwd=tmp_path) as server:
        server.wait_serving(address)
        assert append_contents(address, "s", "a", "b", "c") == 3
        with grpc.insecure_channel(address) as channel:
            stream = stub_for(channel).Since(
                pb.SinceRequest(session_id="s", follow=True), timeout=30
            )
            received = []
            for _ in range(10):
                response = next(stream)
                received.extend(response.events)
                if response.caught_up:
                    break
            assert [e.seq for e in received] == [0, 1, 2]
            started = time.monotonic()
            server.signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as caught:
                next(stream)
            assert server.wait(10) == 0
            assert time.monotonic() - started < 5.0
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(caught.value)
        assert info.reason == "UNAVAILABLE"
        assert info.metadata["next_seq"] == "3"
    events = read_all_after_restart(tmp_path / "data", "s")
    assert [e.data["content"] for e in events] == ["a", "b", "c"]


def test_kill_9_keeps_every_acknowledged_event(tmp_path: Path) -> None:
    """After kill -9 mid-writes, a restart holds every acknowledged event, seqs dense from 0."""
    address = f"127.0.0.1:{free_port()}"
    acked: dict[int, tuple[int, int]] = {}
    stop_writing = threading.Event()

    def write() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = stub_for(channel)
            for batch in range(5000):
                if stop_writing.is_set():
                    return
                events = [user(f"{batch}.{j}", batch=batch, j=j) for j in range(batch % 3 + 1)]
                try:
                    reply = stub.Append(
                        pb.AppendRequest(session_id="crash", events=events), timeout=5
                    )
                except grpc.RpcError:
                    return  # the server died mid-call: this append is not acknowledged
                for event in reply.events:
                    acked[event.seq] = (batch, number(event, "j"))

    with ServerProcess(["--data", "data", "--listen", address], cwd=tmp_path) as server:
        server.wait_serving(address)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        deadline = time.monotonic() + 20
        while len(acked) < 200 and writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acked) >= 200, "writes did not get going"
        server.kill()
        stop_writing.set()
        writer.join(10)
        assert not writer.is_alive()

    events = read_all_after_restart(tmp_path / "data", "crash")
    assert [e.seq for e in events] == list(range(len(events)))
    stored = {e.seq: (number(e, "batch"), number(e, "j")) for e in events}
    missing = [seq for seq, origin in acked.items() if stored.get(seq) != origin]
    assert missing == [], f"acknowledged events lost or changed: {missing[:10]}"
