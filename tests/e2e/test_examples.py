"""The framework guides' runnable examples (examples/), run as a user runs them: each file as its
own process against a real server whose address it reads from SESSIONLOG_SERVER, with a stub
model. Each must print what its ``->`` lines say, and the server must hold the turn it ran."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionlog.testing import RunningServer
from sessionlog_client import Client
from sessionlog_client.convert import struct_to_dict
from sessionlog_client.v1.event_pb2 import EventType
from tests.e2e._proc import clean_env, running_server
from tests.e2e.test_client_typescript import node, node_modules

# One test process runs every module that runs Node out of client/typescript (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("node-client")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PACKAGE = ROOT / "client" / "typescript"
QUESTION = "What is LMDB?"
ANSWER = "LMDB is a memory-mapped B+tree store."
TURN = [
    EventType.EVENT_TYPE_USER_MESSAGE,
    EventType.EVENT_TYPE_ASSISTANT_MESSAGE,  # the tool call
    EventType.EVENT_TYPE_TOOL_RESULT,
    EventType.EVENT_TYPE_ASSISTANT_MESSAGE,  # the answer
]

__all__ = ["node_modules"]  # a fixture of test_client_typescript, used here too


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each example writes its own session."""
    with running_server(tmp_path_factory.mktemp("examples") / "data") as server:
        yield server


def promised(example: Path) -> list[str]:
    """What an example says it prints: its ``# -> `` (Python) or ``// -> `` (JavaScript) lines."""
    return re.findall(r"^(?:#|//) -> (.*)$", example.read_text(), re.M)


def run_example(command: list[str], address: str, cwd: Path) -> list[str]:
    """Run an example with SESSIONLOG_SERVER set to ``address``; the lines it printed."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=clean_env(SESSIONLOG_SERVER=address),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def in_view(client: Client, session_id: str) -> list[tuple[int, dict[str, Any]]]:
    """The type and data of each stored event the derived view shows, in order."""
    events = {e.seq: e for e in client.since(session_id)}
    return [
        (events[seq].type, struct_to_dict(events[seq].data))
        for seq in client.derive_messages(session_id).seqs
    ]


def assert_turn_stored(running: RunningServer, session_id: str) -> list[dict[str, Any]]:
    """The session holds one turn: the question, the tool call, its result, the answer; the
    data of its four events."""
    with Client(running.address) as client:
        shown = in_view(client, session_id)
        assert [kind for kind, _ in shown] == TURN
        messages = client.chat_messages(session_id)
    assert messages[0] == {"role": "user", "content": QUESTION}
    assert messages[1]["tool_calls"][0]["function"]["name"] == "lookup"
    assert ANSWER in messages[2]["content"]  # ADK's is the tool's response as JSON
    assert messages[3] == {"role": "assistant", "content": ANSWER}
    return [data for _, data in shown]


def test_openai_agents_python_example_runs_a_turn(running: RunningServer, tmp_path: Path) -> None:
    """examples/openai_agents.py: Runner.run with a stub Model and SessionlogSession prints the
    answer and the stored item types, and the server holds the four items verbatim; a second
    run starts the session over (it clears first) and prints the same."""
    example = EXAMPLES / "openai_agents.py"
    for _ in range(2):
        printed = run_example([sys.executable, str(example)], running.address, tmp_path)
        assert printed == promised(example)
    stored = assert_turn_stored(running, "openai-agents-example")
    assert [d["item_type"] for d in stored] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_openai_agents_typescript_example_runs_a_turn(
    node_modules: Path, running: RunningServer, tmp_path: Path
) -> None:
    """examples/openai-agents.mjs, importing @openai/agents and sessionlog-client by name as an
    installed package: run() with a stub model provider and SessionlogSession prints the answer
    and the stored item types, and the server holds the turn."""
    installed = tmp_path / "node_modules"
    (installed / "@openai").mkdir(parents=True)
    (installed / "sessionlog-client").symlink_to(PACKAGE, target_is_directory=True)
    for name in ("agents", "agents-core", "agents-openai"):
        (installed / "@openai" / name).symlink_to(node_modules / "@openai" / name)
    example = tmp_path / "openai-agents.mjs"
    shutil.copy(EXAMPLES / "openai-agents.mjs", example)
    printed = run_example([node(), str(example)], running.address, tmp_path)
    assert printed == promised(example)
    stored = assert_turn_stored(running, "openai-agents-ts-example")
    assert [d["item_type"] for d in stored] == [
        "message",
        "function_call",
        "function_call_result",
        "message",
    ]


def test_google_adk_example_runs_a_turn(running: RunningServer, tmp_path: Path) -> None:
    """examples/google_adk.py: a Runner with a stub BaseLlm and SessionlogSessionService prints
    the answer and the output_key state; the server holds the turn and the state; a second run
    (it deletes the session first) prints the same."""
    example = EXAMPLES / "google_adk.py"
    for _ in range(2):
        printed = run_example([sys.executable, str(example)], running.address, tmp_path)
        assert printed == promised(example)
    log_id = "adk.s.helper.ann.adk-example"
    stored = assert_turn_stored(running, log_id)
    assert [d["author"] for d in stored] == ["user", "helper", "helper", "helper"]
    with Client(running.address) as client:
        assert client.get_state(log_id)["answer"] == ANSWER
