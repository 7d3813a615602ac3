"""The `sessionlog` CLI as scripts and people meet it, against real servers.

`tail` resuming across a server restart (and `--no-resume` exiting), `--last`, `--prefix` over
the change feed; `append` of many events from JSON lines; JSON fit for scripts (int64 and whole
numbers in data as numbers, roles in the chat format, `--json` on every command); `get` of a
missing session; `--version`, `--server` without a port, NO_COLOR and `--no-color`,
`replication status`, and `--print-config` into a closed pipe.

A command's parsing and output run in this process through the same ``main`` (``run_cli_here``);
what the process itself does runs the installed `sessionlog`: a running tail (its resume across a
restart, its exit, live lines), colour on a terminal, `--version` and the closed pipe.
"""

from __future__ import annotations

import json
import os
import pty
import queue
import select
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sessionlog.cli import status
from sessionlog.service import app
from sessionlog.testing import RunningServer
from sessionlog_client import Client, event
from tests.e2e._proc import (
    SESSIONLOG,
    ServerProcess,
    clean_env,
    free_port,
    run_cli,
    run_cli_here,
)


def cli(
    server: RunningServer, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`sessionlog ARGS --server ADDRESS`, run to completion in this process (stdin from
    ``stdin``)."""
    return run_cli_here([*args, "--server", server.address], stdin=stdin)


def ok(server: RunningServer, *args: str, stdin: str | None = None) -> str:
    """Run a command that must succeed; its stdout."""
    result = cli(server, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return str(result.stdout)


def users(server: RunningServer, session_id: str, *contents: str) -> None:
    with Client(server.address) as client:
        client.append(session_id, [event("user_message", {"content": c}) for c in contents])


class Lines:
    """The stdout lines of a running process, read on a thread into a queue."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.queue: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.queue.put(line)

    def take(self, count: int, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        return [
            self.queue.get(timeout=max(0.01, deadline - time.monotonic())) for _ in range(count)
        ]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.reader.join(10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def tail_process(address: str, cwd: Path, *args: str) -> Lines:
    process = subprocess.Popen(
        [str(SESSIONLOG), "tail", *args, "--server", address],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Lines(process)


# -- tail ------------------------------------------------------------------------------------------


def test_tail_resumes_across_a_server_restart(tmp_path: Path) -> None:
    """A running `tail --json` outlives a server restart: it prints every event once, in order,
    those appended before, during and after the restart."""
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", str(tmp_path / "data"), "--listen", address]
    with ServerProcess(args, tmp_path, name="first") as first:
        first.wait_serving(address)
        with Client(address) as client:
            client.append("r", [event("user_message", {"content": str(i)}) for i in range(3)])
        tail = tail_process(address, tmp_path, "r", "--json")
        try:
            seen = tail.take(3)
            assert first.stop() == 0
            with ServerProcess(args, tmp_path, name="second") as second:
                second.wait_serving(address)
                with Client(address) as client:
                    for i in range(3, 6):
                        client.append("r", [event("user_message", {"content": str(i)})])
                seen += tail.take(3)
                time.sleep(0.3)
                assert tail.queue.empty(), "no event may be printed twice"
                assert tail.process.poll() is None, "tail must still be running"
        finally:
            tail.close()
    parsed = [json.loads(line) for line in seen]
    assert [(p["seq"], p["data"]["content"]) for p in parsed] == [(i, str(i)) for i in range(6)]


def test_tail_no_resume_exits_3_when_the_server_stops(tmp_path: Path) -> None:
    """`tail --no-resume` ends with exit 3 and one UNAVAILABLE line when its server stops."""
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", str(tmp_path / "data"), "--listen", address]
    with ServerProcess(args, tmp_path) as server:
        server.wait_serving(address)
        with Client(address) as client:
            client.append("r", [event("user_message", {"content": "x"})])
        tail = tail_process(address, tmp_path, "r", "--no-resume")
        try:
            assert "user_message" in tail.take(1)[0]
            assert server.stop() == 0
            assert tail.process.wait(20) == 3
            assert tail.process.stderr is not None
            assert tail.process.stderr.read().startswith("sessionlog: UNAVAILABLE: ")
        finally:
            tail.close()


def test_tail_last_n(server: RunningServer) -> None:
    """`tail --last 2` starts with the last two stored events; more than stored prints all."""
    users(server, "l", "a", "b", "c", "d")
    lines = ok(server, "tail", "l", "--last", "2", "--no-follow").splitlines()
    assert [line.split()[0] for line in lines] == ["2", "3"]
    every = ok(server, "tail", "l", "--last", "10", "--no-follow").splitlines()
    assert len(every) == 4


def test_tail_prefix_follows_every_session_under_it(server: RunningServer, tmp_path: Path) -> None:
    """`tail --prefix a.` prints the events of a.* sessions only, each with its session id and
    change-feed position; --from-position resumes after a position; live events follow."""
    users(server, "a.one", "1")
    users(server, "b.other", "x")
    users(server, "a.two", "2", "3")
    stored = ok(server, "tail", "--prefix", "a.", "--no-follow", "--json")
    parsed = [json.loads(line) for line in stored.splitlines()]
    assert [(p["session_id"], p["seq"], p["data"]["content"]) for p in parsed] == [
        ("a.one", 0, "1"),
        ("a.two", 0, "2"),
        ("a.two", 1, "3"),
    ]
    after = parsed[0]["position"] + 1
    rest = ok(server, "tail", "--prefix", "a.", "--no-follow", "--json",
              "--from-position", str(after))  # fmt: skip
    assert [json.loads(line)["session_id"] for line in rest.splitlines()] == ["a.two", "a.two"]
    live = tail_process(server.address, tmp_path, "--prefix", "a.")
    try:
        assert len(live.take(3)) == 3
        users(server, "b.other", "hidden")
        users(server, "a.three", "shown")
        (line,) = live.take(1)
        assert "a.three" in line
        assert "shown" in line
    finally:
        live.close()


# -- append ----------------------------------------------------------------------------------------


def test_append_many_events_from_json_lines_on_stdin(server: RunningServer) -> None:
    """`append S --events -` reads JSON lines from stdin and appends them as one batch."""
    lines = "\n".join(
        json.dumps(e)
        for e in (
            {"type": "user_message", "data": {"content": "a"}},
            {"type": "assistant_message", "data": {"content": "b"}},
            {"type": "system_message", "data": {"content": "[sum]"}, "replace": [0, 1]},
        )
    )
    out = ok(server, "append", "many", "--events", "-", "--json", stdin=lines + "\n")
    reply = json.loads(out)
    assert [e["seq"] for e in reply["events"]] == [0, 1, 2]
    assert reply["next_seq"] == 3
    with Client(server.address) as client:
        assert client.chat_messages("many") == [{"role": "system", "content": "[sum]"}]
    bad = cli(server, "append", "many", "--events", "-", stdin='{"type": "nope"}\n')
    assert bad.returncode == 2
    assert "event 1" in bad.stderr


def test_append_of_a_message_without_content_or_data_says_so(server: RunningServer) -> None:
    """`append S user_message` with neither --content nor --data: exit 2 naming both flags, and
    nothing written; a bookkeeping event needs no data."""
    result = cli(server, "append", "e", "user_message")
    assert result.returncode == 2
    assert "--content" in result.stderr
    assert "--data" in result.stderr
    assert "seq 0" in ok(server, "append", "e", "turn_start")


# -- JSON for scripts ------------------------------------------------------------------------------


def test_whole_numbers_stay_whole_in_text_and_json(server: RunningServer) -> None:
    """Data {"x": 1, "tokens": 1834, "ratio": 0.5} prints as 1 and 1834 (not 1.0, 1834.0) in
    tail's text and --json, and in surface --json."""
    data = json.dumps({"content": "c", "x": 1, "tokens": 1834, "ratio": 0.5})
    ok(server, "append", "n", "user_message", "--data", data)
    text = ok(server, "tail", "n", "--no-follow")
    assert '"x": 1,' in text or '"x": 1}' in text
    assert "1834.0" not in text
    # Only the data part: the time column (13:30:21.040) may itself contain "1.0".
    shown = text[text.index("{") :]
    assert "1.0" not in shown
    line = ok(server, "tail", "n", "--no-follow", "--json")
    assert "1834.0" not in line
    parsed = json.loads(line)
    assert parsed["data"] == {"content": "c", "x": 1, "tokens": 1834, "ratio": 0.5}
    assert parsed["type"] == "user_message"
    surface = json.loads(ok(server, "surface", "n", "--json"))
    assert surface["events"][0]["data"]["tokens"] == 1834
    assert "1834.0" not in ok(server, "surface", "n", "--json")


def test_every_command_prints_json_for_scripts(server: RunningServer, tmp_path: Path) -> None:
    """create, seed, fork, sessions, get, messages and lease take --json; counts are numbers and
    roles are chat-format names."""
    created = json.loads(ok(server, "create", "j", "--json"))
    assert created["session"]["event_count"] == 0
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    seeded = json.loads(ok(server, "seed", "k", str(chat), "--json"))
    assert seeded["session"]["event_count"] == 1
    forked = json.loads(ok(server, "fork", "k", "--to", "k2", "--json"))
    assert forked["session"]["session_id"] == "k2"
    listed = [json.loads(x) for x in ok(server, "sessions", "--json").splitlines()]
    assert [(s["session_id"], s["event_count"]) for s in listed] == [("j", 0), ("k", 1), ("k2", 1)]
    messages = json.loads(ok(server, "messages", "k", "--json"))
    assert messages["messages"][0]["role"] == "user"
    assert messages["messages"][0]["content"] == "hi"
    assert messages["messages"][0]["seq"] == 0
    got = json.loads(ok(server, "get", "k", "--json"))
    assert got["session"]["exists"] is True
    text = ok(server, "get", "k")
    assert "event_count" in text
    assert "1" in text
    health = json.loads(ok(server, "health", "--json"))
    assert health == {"status": "SERVING"}


def test_get_of_a_missing_session_exits_1(server: RunningServer) -> None:
    """`get` of a session never written: exit 1, nothing on stdout, one line naming it."""
    result = cli(server, "get", "ghost")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "sessionlog: NOT_FOUND: no session 'ghost'\n"


def test_health_of_an_unknown_service_says_which_names_there_are(server: RunningServer) -> None:
    """`health --service` with a name the server does not know: exit 1 and a line naming the
    service and the names it answers for (it was "NOT_FOUND: no details")."""
    result = cli(server, "health", "--service", "no.such.Service")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "no.such.Service" in result.stderr
    assert "sessionlog.v1.SessionLogService" in result.stderr
    assert "no details" not in result.stderr
    assert ok(server, "health", "--service", "sessionlog.v1.SessionLogService") == "SERVING\n"
    assert status.HEALTH_NAMES == app.HEALTH_SERVICES  # the CLI's copy of the server's list


def test_replication_status_text_and_json(server: RunningServer) -> None:
    """`replication status` prints the primary's role, state and position, as text and JSON."""
    users(server, "r", "x")
    status = json.loads(ok(server, "replication", "status", "--json"))
    assert status["state"] == "primary"
    assert status["position"] >= 1
    assert isinstance(status["lag_positions"], int)
    text = ok(server, "replication", "status")
    assert any(line.split() == ["state", "primary"] for line in text.splitlines())


# -- the command line ------------------------------------------------------------------------------


def test_version(tmp_path: Path) -> None:
    """`sessionlog --version` prints the installed version and exits 0."""
    result = run_cli(["--version"], tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("sessionlog 0.")


@pytest.mark.parametrize("address", ["127.0.0.1", "example.com", "[::1]", "host:port"])
def test_server_without_a_port_is_a_usage_error(address: str) -> None:
    """--server with no port (or a bad one) is exit 2 naming HOST:PORT, not a silent :443."""
    result = run_cli_here(["get", "s", "--server", address])
    assert result.returncode == 2
    assert "HOST:PORT" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_retry_for_takes_seconds_0_or_more(value: str) -> None:
    """--retry-for with a negative, NaN or non-number value is exit 2 naming it."""
    result = run_cli_here(["get", "s", "--retry-for", value])
    assert result.returncode == 2
    assert "--retry-for" in result.stderr
    assert value in result.stderr


@pytest.mark.serial  # exits within 5 s
def test_wrong_address_fails_fast_naming_it() -> None:
    """Nothing listening at --server: exit 3 within a couple of seconds, naming the address."""
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_cli_here(["messages", "s", "--server", address])
    assert result.returncode == 3
    assert address in result.stderr
    assert time.monotonic() - started < 5


def terminal_output(args: list[str], env: dict[str, str]) -> bytes:
    """What `sessionlog ARGS` writes to a terminal."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [str(SESSIONLOG), *args], env=env, stdout=follower, stderr=subprocess.DEVNULL
        )
        os.close(follower)
        output = b""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:
                    break  # the child closed the terminal
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        assert process.wait(10) == 0
    finally:
        os.close(leader)
    return output


def test_no_color_and_the_no_color_flag(server: RunningServer) -> None:
    """On a terminal, NO_COLOR=1 and --no-color each turn the role colours off."""
    users(server, "tty", "hello")
    args = ["messages", "tty", "--server", server.address]
    assert b"\033[" in terminal_output(args, clean_env())
    assert b"\033[" not in terminal_output(args, clean_env(NO_COLOR="1"))
    plain = terminal_output([*args, "--no-color"], clean_env())
    assert b"\033[" not in plain
    assert b"user: hello" in plain


def test_print_config_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`serve --print-config` into a pipe whose reader is gone (as after `| head`): exit 0,
    nothing on stderr (no BrokenPipeError traceback)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(SESSIONLOG), "serve", "--print-config"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 0
