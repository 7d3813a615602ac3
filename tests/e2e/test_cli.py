"""The `sessionlog` client subcommands against a real server.

append, tail (with and without follow), surface, messages, sessions, get, fork and lease; the
exit codes scripts rely on (0 ok, 1 refused with the reason on one stderr line, 2 usage, 3
unreachable); colour only on a terminal; --help for each. A command's parsing and output run in
this process through the same ``main`` (``run_cli_here``); what the process itself does runs the
installed `sessionlog`: tail's SIGINT exit, colour on a terminal, and SESSIONLOG_SERVER read from
the environment of a process started with it.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sessionlog.testing import RunningServer
from sessionlog_client import Client, event
from tests.e2e._helpers import stdout_lines
from tests.e2e._proc import SESSIONLOG, clean_env, free_port, run_cli, run_cli_here

COMMANDS = (
    "append",
    "hide",
    "tail",
    "surface",
    "state",
    "usage",
    "messages",
    "create",
    "seed",
    "get",
    "sessions",
    "fork",
    "lease",
    "export",
    "import",
)


def cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`sessionlog ARGS --server ADDRESS`, run to completion in this process."""
    return run_cli_here([*args, "--server", server.address])


def ok(server: RunningServer, *args: str) -> str:
    """Run a command that must succeed; its stdout."""
    result = cli(server, *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def seed(server: RunningServer, session_id: str, *contents: str) -> None:
    with Client(server.address) as client:
        client.append(session_id, [event("user_message", {"content": c}) for c in contents])


# -- append ----------------------------------------------------------------------------------------


def test_append_content_data_and_replace(server: RunningServer) -> None:
    """append takes --content, --data JSON and --replace START:STOP; each lands as asked."""
    assert ok(server, "append", "s", "user_message", "--content", "hi") == (
        "appended seq 0; next seq 1\n"
    )
    data = json.dumps({"content": "b", "tool_calls": [{"id": "c1"}], "kept": 7})
    assert "seq 1" in ok(server, "append", "s", "ASSISTANT_MESSAGE", "--data", data)
    replaced = ok(server, "append", "s", "system_message", "--content", "[sum]", "--replace", "0:1",
        "--expected-seq", "2", "--json",
    )  # fmt: skip
    reply = json.loads(replaced)
    assert reply["next_seq"] == 3
    assert reply["events"][0]["surface_op"]["replace"] == {"start_seq": 0, "stop_seq": 1}
    with Client(server.address) as client:
        stored = list(client.since("s"))
        assert [e.data["content"] for e in stored] == ["hi", "b", "[sum]"]
        assert stored[1].data["kept"] == 7
        assert client.chat_messages("s") == [{"role": "system", "content": "[sum]"}]


# -- tail ------------------------------------------------------------------------------------------


def test_tail_without_follow_pretty_and_json(server: RunningServer) -> None:
    """tail --no-follow prints each stored event once (a line each) and ends; --json is JSONL."""
    seed(server, "t", "zero", "one", "two")
    pretty = ok(server, "tail", "t", "--no-follow").splitlines()
    assert len(pretty) == 3
    assert [line.split()[0] for line in pretty] == ["0", "1", "2"]
    assert "user_message" in pretty[0]
    assert '"content": "zero"' in pretty[0]
    lines = ok(server, "tail", "t", "--no-follow", "--json", "--from-seq", "1")
    parsed = [json.loads(line) for line in lines.splitlines()]
    assert [(p["seq"], p["data"]["content"]) for p in parsed] == [(1, "one"), (2, "two")]
    first = json.loads(ok(server, "tail", "t", "--no-follow", "--json").splitlines()[0])
    assert first["seq"] == 0, "seq 0 must be printed, scripts read it"


def test_tail_follows_live_events_until_interrupted(server: RunningServer, tmp_path: Path) -> None:
    """tail (follow by default) prints stored then live events; SIGINT ends it with 130."""
    seed(server, "live", "before")
    process = subprocess.Popen(
        [str(SESSIONLOG), "tail", "live", "--json", "--server", server.address],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines, reader = stdout_lines(process)
    try:
        assert json.loads(lines.get(timeout=15))["data"]["content"] == "before"
        seed(server, "live", "during")
        assert json.loads(lines.get(timeout=15))["data"]["content"] == "during"
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        reader.join(10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


# -- reads -----------------------------------------------------------------------------------------


def test_surface_and_messages_show_the_model_view(server: RunningServer) -> None:
    """surface lists the visible events; messages is a plain transcript when not on a terminal."""
    seed(server, "v", "a", "b", "c")
    ok(server, "append", "v", "system_message", "--content", "[sum]", "--replace", "0:1")
    surface = ok(server, "surface", "v").splitlines()
    assert [line.split()[0] for line in surface] == ["3", "2"]
    assert "replaces 0..1" in surface[0]
    assert json.loads(ok(server, "surface", "v", "--json"))["event_count"] == 4
    transcript = ok(server, "messages", "v")
    assert transcript.splitlines() == ["[3] system [replaces seqs 0-1]: [sum]", "[2] user: c"]
    assert "\033[" not in transcript
    assert ok(server, "messages", "v", "--at-seq", "0").splitlines() == ["[0] user: a"]
    assert len(json.loads(ok(server, "messages", "v", "--json"))["messages"]) == 2


def test_messages_note_what_a_summary_replaces(server: RunningServer) -> None:
    """A message from a replace event names the seqs it replaces (one seq or a range); --at-seq
    before the summary shows the plain messages, with no note."""
    seed(server, "sum", "a", "b", "c")
    with Client(server.address) as client:
        client.append(
            "sum",
            [
                event("system_message", {"content": "[ab]"}, replace=(0, 1)),
                event("user_message", {"content": "C"}, replace=(2, 2)),
            ],
        )
    assert ok(server, "messages", "sum").splitlines() == [
        "[3] system [replaces seqs 0-1]: [ab]",
        "[4] user [replaces seq 2]: C",
    ]
    assert ok(server, "messages", "sum", "--at-seq", "2").splitlines() == [
        "[0] user: a",
        "[1] user: b",
        "[2] user: c",
    ]


def test_messages_print_tool_calls_and_what_results_answer(server: RunningServer) -> None:
    """A tool call prints as name(arguments): a JSON-string argument exactly as written (its key
    order kept), an object compact with sorted keys and whole numbers; each tool result names
    the call it answers and the message that made it."""
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 3}'},
        },
        {"id": "c2", "name": "lookup", "arguments": {"zone": "eu", "ids": [2, 10]}},
    ]
    with Client(server.address) as client:
        client.append(
            "tools",
            [
                event("user_message", {"content": "weather?"}),
                event("assistant_message", {"content": "", "tool_calls": calls}),
                event("tool_result", {"tool_call_id": "c1", "content": "12 C"}),
                event("tool_result", {"tool_call_id": "c2", "content": "ok"}),
                event("tool_result", {"tool_call_id": "c9", "content": "stray"}),
            ],
        )
    assert ok(server, "messages", "tools").splitlines() == [
        "[0] user: weather?",
        "[1] assistant:",
        '      -> get_weather({"city": "Oslo", "days": 3})  [call c1]',
        '      -> lookup({"ids": [2, 10], "zone": "eu"})  [call c2]',
        "[2] tool [answers get_weather from [1], call c1]: 12 C",
        "[3] tool [answers lookup from [1], call c2]: ok",
        "[4] tool [answers call c9]: stray",
    ]


SNEAKY = "pay \u202eyap\u202c\x00 now\x1b[2J\r\x7f\u2066x\u2069\nsecond line\tend"
"""A message whose characters would reorder, clear or overwrite what a terminal shows."""
SHOWN = (
    "pay \\u202eyap\\u202c\\u0000 now\\u001b[2J\\u000d\\u007f\\u2066x\\u2069",
    "second line\tend",
)
"""The same, as the human output prints it: escapes, the newline and tab kept."""


def test_messages_and_tail_escape_control_and_bidi_characters(server: RunningServer) -> None:
    """messages and tail print NUL, ESC, CR, DEL and the bidi controls of stored text as \\uXXXX
    (a tool call's arguments too), keeping newlines and tabs; --json keeps the text exact."""
    call = {"id": "c\u202e1", "name": "f", "arguments": '{"q": "\u202eevil"}'}
    with Client(server.address) as client:
        client.append(
            "sneaky",
            [
                event("user_message", {"content": SNEAKY}),
                event("assistant_message", {"content": "", "tool_calls": [call]}),
            ],
        )
    assert ok(server, "messages", "sneaky").splitlines() == [
        f"[0] user: {SHOWN[0]}",
        SHOWN[1],
        "[1] assistant:",
        '      -> f({"q": "\\u202eevil"})  [call c\\u202e1]',
    ]
    as_json = json.loads(ok(server, "messages", "sneaky", "--json"))
    assert as_json["messages"][0]["content"] == SNEAKY
    pretty = ok(server, "tail", "sneaky", "--no-follow")
    assert "\u202e" not in pretty
    assert "\x1b" not in pretty
    assert "\\u202eyap\\u202c" in pretty.splitlines()[0]
    line = ok(server, "tail", "sneaky", "--no-follow", "--json").splitlines()[0]
    assert json.loads(line)["data"]["content"] == SNEAKY


def test_messages_colour_roles_on_a_terminal(server: RunningServer, tmp_path: Path) -> None:
    """With a terminal for stdout, messages colours each role (ANSI escapes)."""
    seed(server, "tty", "hello")
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [str(SESSIONLOG), "messages", "tty", "--server", server.address],
            cwd=tmp_path,
            env=clean_env(),
            stdout=follower,
            stderr=subprocess.DEVNULL,
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
    assert b"\033[32muser\033[0m" in output
    assert b"hello" in output


def test_sessions_get_and_fork(server: RunningServer) -> None:
    """sessions lists ids with counts (prefix, limit, JSON); get describes; fork copies."""
    seed(server, "p-one", "x", "y")
    seed(server, "p-two", "z")
    seed(server, "q", "w")
    assert ok(server, "sessions", "--prefix", "p-").splitlines() == [
        "p-one\t2 events",
        "p-two\t1 events",
    ]
    assert ok(server, "sessions", "--limit", "1").splitlines() == ["p-one\t2 events"]
    listed = [json.loads(x) for x in ok(server, "sessions", "--json").splitlines()]
    assert [s["session_id"] for s in listed] == ["p-one", "p-two", "q"]
    described = json.loads(ok(server, "get", "p-one", "--json"))
    assert described["session"]["event_count"] == 2
    forked = ok(server, "fork", "p-one", "--at-seq", "0", "--to", "p-rewound").strip()
    assert forked == "p-rewound"
    child = json.loads(ok(server, "get", "p-rewound", "--json"))["session"]
    assert child["parent_session_id"] == "p-one"
    assert child["event_count"] == 1
    generated = ok(server, "fork", "p-two").strip()
    assert generated
    assert generated != "p-two"
    # With --request-id, running the fork again prints the first child, and makes no other.
    once = ok(server, "fork", "p-two", "--request-id", "cli-f").strip()
    assert ok(server, "fork", "p-two", "--request-id", "cli-f").strip() == once
    assert once != generated
    assert len(ok(server, "sessions", "--prefix", "fork-").splitlines()) == 2


def test_lease_acquire_renew_release(server: RunningServer) -> None:
    """lease acquire/renew/release print the lease; another holder is refused with LEASE_HELD."""
    acquired = json.loads(ok(server, "lease", "acquire", "l", "w1", "--ttl", "30", "--json"))
    token = acquired["lease"]["token"]
    assert acquired["lease"]["holder"] == "w1"
    refused = cli(server, "lease", "acquire", "l", "w2")
    assert refused.returncode == 1
    assert refused.stderr.startswith("sessionlog: LEASE_HELD: ")
    blocked = cli(server, "append", "l", "user_message", "--content", "x")
    assert blocked.returncode == 1
    assert "LEASE_HELD" in blocked.stderr
    ok(server, "append", "l", "user_message", "--content", "x", "--lease-holder", "w1")
    renewed = ok(server, "lease", "renew", "l", "w1", "--ttl", "60")
    assert renewed.startswith(f"w1 holds the lease of l: token {token}, expires ")
    released = json.loads(ok(server, "lease", "release", "l", "w1", "--json"))
    assert released["released"]["token"] == token


# -- exit codes ------------------------------------------------------------------------------------


def test_refusal_exits_1_with_the_reason_on_one_line(server: RunningServer) -> None:
    """A refused append: exit 1, stdout empty, one stderr line naming SEQ_CONFLICT."""
    seed(server, "c", "one")
    result = cli(server, "append", "c", "user_message", "--content", "x", "--expected-seq", "0")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("sessionlog: SEQ_CONFLICT: ")
    bad_id = cli(server, "get", "no spaces")
    assert bad_id.returncode == 1
    assert bad_id.stderr.startswith("sessionlog: INVALID_SESSION_ID: ")


@pytest.mark.parametrize(
    "args",
    [
        ["append", "s"],
        ["append", "s", "chat_message", "--content", "x"],
        ["append", "s", "user_message", "--data", "[1, 2"],
        ["append", "s", "user_message", "--data", "[1, 2]"],
        ["append", "s", "user_message", "--replace", "one:two"],
        ["tail"],
        ["lease", "steal", "s", "w"],
        ["sessions", "--limit", "many"],
    ],
    ids=lambda args: "-".join(args)[:40],
)
def test_bad_usage_exits_2_with_one_line(args: list[str]) -> None:
    """Missing or malformed arguments: exit 2 and one stderr line, before any network call."""
    result = run_cli_here([*args, "--server", f"127.0.0.1:{free_port()}"])
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr


def test_unreachable_server_exits_3() -> None:
    """Nothing listening at --server: exit 3 and one stderr line saying UNAVAILABLE."""
    result = run_cli_here(["get", "s", "--server", f"127.0.0.1:{free_port()}", "--timeout", "5"])
    assert result.returncode == 3
    assert result.stderr.startswith("sessionlog: UNAVAILABLE: ")
    assert result.stderr.count("\n") == 1


def test_server_address_from_the_environment(server: RunningServer, tmp_path: Path) -> None:
    """SESSIONLOG_SERVER stands in for --server."""
    seed(server, "env", "hi")
    result = run_cli(["messages", "env"], tmp_path, env=clean_env(SESSIONLOG_SERVER=server.address))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[0] user: hi\n"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    """`sessionlog COMMAND --help` exits 0 and documents --server and the command's usage."""
    helped = run_cli_here([command, "--help"])
    assert helped.returncode == 0
    out = helped.stdout
    assert out.startswith(f"usage: sessionlog {command}")
    assert "--server" in out
    assert "--timeout" in out


def test_create_and_seed_sessions(server: RunningServer, tmp_path: Path) -> None:
    """create takes a JSON list of events, seed a JSON list of chat messages; both refuse an
    existing session with exit 1 and its reason."""
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"type": "system_message", "data": {"content": "be brief"}}]))
    assert "created fresh with 1 events" in ok(server, "create", "fresh", "--events", str(events))
    chat = tmp_path / "chat.json"
    chat.write_text(
        json.dumps(
            [
                {"role": "user", "content": "hi"},
                {"role": "robot", "content": "?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
            ]
        )
    )
    assert "dropped 1" in ok(server, "seed", "chat", str(chat))
    with Client(server.address) as client:
        derived = client.derive_messages("chat")
    assert [m.content for m in derived.messages] == ["hi", ""]
    assert derived.messages[1].tool_calls[0]["id"] == "c1"
    again = cli(server, "create", "fresh")
    assert again.returncode == 1
    assert "SESSION_ALREADY_EXISTS" in again.stderr
    bad = cli(server, "seed", "other", str(tmp_path / "missing.json"))
    assert bad.returncode == 2
