"""The Node client (client/typescript) from the project's test command.

Installs its npm dependencies when node_modules is missing or older than package-lock.json,
compiles it (src/*.ts -> lib/, tsc --strict), runs its own suite (`node --test`, real
`sessionlog serve` processes), type-checks it against its generated declarations, runs the
docs' TypeScript example, and has a Python worker and a Node worker write one session at the
same time.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from sessionlog.testing import RunningServer
from sessionlog_client import Client, event
from tests.e2e.test_client_python import readme_block

# One test process runs every module that runs Node out of client/typescript (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("node-client")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "client" / "typescript"
SESSIONLOG_BIN = Path(sys.prefix) / "bin" / "sessionlog"


def node() -> str:
    found = shutil.which("node")
    assert found, "node (20 or newer) is not on PATH; the TypeScript client needs it"
    return found


def npm() -> str:
    found = shutil.which("npm")
    assert found, "npm is not on PATH; the TypeScript client needs it"
    return found


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """client/typescript/node_modules, installed with `npm ci` when missing or stale, and the
    client compiled into lib/ (what the package's exports point at)."""
    return installed_and_built()


def installed_and_built() -> Path:
    """``npm ci`` in client/typescript when node_modules is missing or older than the lock, then
    the build (src/*.ts -> lib/); its node_modules. By one test process at a time (pytest-xdist
    runs several, and two `npm ci` or builds in one folder break each other)."""
    installed = PACKAGE / "node_modules" / ".package-lock.json"
    lock = PACKAGE / "package-lock.json"
    key = hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"sessionlog-npm-{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
            result = subprocess.run(
                [npm(), "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=PACKAGE,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, f"npm ci failed:\n{result.stdout}\n{result.stderr}"
        build_typescript(PACKAGE / "node_modules")
    return PACKAGE / "node_modules"


def build_typescript(modules: Path) -> None:
    """Compile client/typescript/src/*.ts into lib/ (tsc -p tsconfig.build.json, strict), unless
    lib/ was built from the sources as they are (by `make ts-lint`, or an earlier module of this
    run): each build parses the SDKs' declarations again, seconds of CPU. `tsc -p .` in
    test_typescript_declarations_typecheck checks the sources every run either way."""
    if built_from_current_sources(modules):
        return
    result = subprocess.run(
        [node(), str(modules / "typescript" / "bin" / "tsc"), "-p", "tsconfig.build.json"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, f"tsc failed:\n{result.stdout}\n{result.stderr}"


def built_from_current_sources(modules: Path) -> bool:
    """Whether every source's lib/*.js and lib/*.d.ts was written after the last change of the
    sources, the compiler settings and the installed packages (tsc writes them all each build)."""
    sources = sorted((PACKAGE / "src").glob("*.ts"))
    inputs = [
        *sources,
        PACKAGE / "tsconfig.json",
        PACKAGE / "tsconfig.build.json",
        modules / ".package-lock.json",
    ]
    outputs = [
        PACKAGE / "lib" / f"{p.stem}{suffix}" for p in sources for suffix in (".js", ".d.ts")
    ]
    if not sources or not all(p.exists() for p in outputs):
        return False
    return min(p.stat().st_mtime_ns for p in outputs) > max(p.stat().st_mtime_ns for p in inputs)


FAILOVER_SUITE = "test/failover.test.mjs"
"""Its own run (and pytest test): a group of servers per test makes it as long as the rest."""
AGENTS_SUITE = "test/openai-agents.test.mjs"
"""Its own run: the OpenAI Agents SDK session, whose interop test starts Python workers."""
CLAUDE_SUITE = "test/claude-agent-sdk.test.mjs"
"""Its own run: the Claude Agent SDK store's contracts, and a Python store reading its writes."""
CLIENT_SUITE = "test/client.test.mjs"
"""Its own run, in the serial phase: besides the client's calls, it asserts that a wrong address
fails within 2 s and a silent one after its connect timeout, within 3 s, which a busy machine
can fail; the other suites wait for events with deadlines of 10-30 s and share the machine."""
NODE_SUITE_SECONDS = 300
"""One `node --test` run's limit (about a minute on a quiet 2-core machine, three on a busy one)."""


@pytest.mark.timeout(NODE_SUITE_SECONDS + 30)
def test_node_client_suite_passes(node_modules: Path) -> None:
    """`node --test` on client/typescript/test passes against real servers, with no failure."""
    tests = sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "test").glob("*.test.mjs"))
    for own_run in (FAILOVER_SUITE, AGENTS_SUITE, CLAUDE_SUITE, CLIENT_SUITE):
        assert own_run in tests
        tests.remove(own_run)
    assert run_node_tests(tests) >= 8


@pytest.mark.serial  # a wrong address fails within 2 s, a silent one within 3 s
@pytest.mark.timeout(NODE_SUITE_SECONDS + 30)
def test_node_client_core_suite_passes(node_modules: Path) -> None:
    """client.test.mjs passes: appends, follows, leases, errors, TLS and tokens against real
    servers, and how the client fails on a wrong, a silent and a gone address."""
    assert run_node_tests([CLIENT_SUITE]) >= 15


@pytest.mark.serial  # failover.test.mjs: unreachable addresses fail within 10 s
@pytest.mark.timeout(NODE_SUITE_SECONDS + 30)
def test_node_client_failover_suite_passes(node_modules: Path) -> None:
    """The Node client's group tests pass: either address order, etcd discovery, and a writer
    and a follow across SIGKILL of the primary and a promotion."""
    assert run_node_tests([FAILOVER_SUITE]) >= 3


@pytest.mark.timeout(NODE_SUITE_SECONDS + 30)
def test_node_openai_agents_session_suite_passes(node_modules: Path) -> None:
    """SessionlogSession (sessionlog-client/openai-agents) against a real server: every item
    type round-trips, the SDK's session scenarios, the Python backend reading what it wrote and
    the reverse, and run() of an Agent with a fake model, plain and streamed."""
    assert run_node_tests([AGENTS_SUITE]) >= 18


@pytest.mark.timeout(NODE_SUITE_SECONDS + 30)
def test_node_claude_agent_sdk_store_suite_passes(node_modules: Path) -> None:
    """SessionlogSessionStore (sessionlog-client/claude-agent-sdk) keeps the SDK's SessionStore
    contracts (the npm SDK ships no harness: restated one by one), stores a retried batch once,
    erases subagent transcripts with their session, and the Python store reads what it wrote."""
    assert run_node_tests([CLAUDE_SUITE]) >= 13


@pytest.mark.timeout(NODE_SUITE_SECONDS + 30)
def test_langgraph_checkpoint_conformance_suite_passes(node_modules: Path, tmp_path: Path) -> None:
    """LangGraph.js's own checkpointer conformance suite (the Vitest suite of
    @langchain/langgraph-checkpoint-validation: put, putWrites, getTuple, list, deleteThread and
    getDeltaChannelHistory) passes against SessionlogSaver (sessionlog-client/langgraph) on a
    real server, nothing skipped."""
    report = tmp_path / "vitest.json"
    result = subprocess.run(
        [
            node(),
            str(node_modules / "vitest" / "vitest.mjs"),
            "run",
            "--reporter=json",
            f"--outputFile={report}",
        ],
        cwd=PACKAGE,
        env={**os.environ, "SESSIONLOG_BIN": str(SESSIONLOG_BIN)},
        capture_output=True,
        text=True,
        timeout=NODE_SUITE_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    counts = json.loads(report.read_text())
    assert counts["numFailedTests"] == 0, counts
    assert counts["numPendingTests"] == 0, counts
    assert counts["numTodoTests"] == 0, counts
    assert counts["numPassedTests"] >= 700, counts


def run_node_tests(tests: list[str]) -> int:
    """Run ``node --test`` on ``tests`` (paths in client/typescript); how many passed, after
    checking that none failed."""
    assert tests, "no *.test.mjs in client/typescript/test"
    result = subprocess.run(
        [node(), "--test", "--test-concurrency=1", *tests],
        cwd=PACKAGE,
        env={**os.environ, "SESSIONLOG_BIN": str(SESSIONLOG_BIN)},
        capture_output=True,
        text=True,
        timeout=NODE_SUITE_SECONDS,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    passed = re.search(r"^# pass (\d+)$", output, flags=re.MULTILINE)
    failed = re.search(r"^# fail (\d+)$", output, flags=re.MULTILINE)
    assert passed, output
    assert failed, output
    assert int(failed.group(1)) == 0, output
    return int(passed.group(1))


def test_typescript_declarations_typecheck(node_modules: Path) -> None:
    """tsc (strict, no emit) accepts the sources and a typed worker written against the
    declarations the build generated (lib/*.d.ts)."""
    result = subprocess.run(
        [node(), str(node_modules / "typescript" / "bin" / "tsc"), "-p", "."],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(210)
def test_openai_agents_session_typechecks_as_an_sdk_session(node_modules: Path) -> None:
    """tsc accepts SessionlogSession where @openai/agents wants a Session (tsconfig.agents.json:
    the SDK's own declarations are not re-checked, which alone takes most of a minute)."""
    result = subprocess.run(
        [node(), str(node_modules / "typescript" / "bin" / "tsc"), "-p", "tsconfig.agents.json"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_typescript_example_runs_as_written(
    node_modules: Path, server: RunningServer, tmp_path: Path
) -> None:
    """The Clients page's TypeScript example, importing the package by name, prints the chat."""
    code = readme_block("js", "sessionlog-client")
    assert len(code.strip().splitlines()) <= 10
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "sessionlog-client").symlink_to(PACKAGE, target_is_directory=True)
    script = tmp_path / "example.mjs"
    script.write_text(code.replace("127.0.0.1:50051", server.address))
    result = subprocess.run(
        [node(), str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "user What is LMDB?",
        "assistant A memory-mapped B+tree store.",
    ]


def test_append_stream_typescript_example_runs_as_written(
    node_modules: Path, server: RunningServer, tmp_path: Path
) -> None:
    """The Clients page's appendStream example pipelines three appends and a conflicting one:
    the three are written in order, the fourth alone is refused with SEQ_CONFLICT."""
    code = readme_block("js", "appendStream")
    assert len(code.strip().splitlines()) <= 10
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "sessionlog-client").symlink_to(PACKAGE, target_is_directory=True)
    script = tmp_path / "example.mjs"
    script.write_text(code.replace("127.0.0.1:50051", server.address))
    result = subprocess.run(
        [node(), str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[ 1, 2, 3 ] SEQ_CONFLICT"]
    with Client(server.address) as client:
        contents = [e.data["content"] for e in client.since("piped-ts")]
    assert contents == ["a", "b", "c"]


def test_readme_openai_agents_typescript_example_runs_as_written(
    node_modules: Path, server: RunningServer, tmp_path: Path
) -> None:
    """The docs' SessionlogSession example (Framework guides), importing the package's
    subpath export by name, pops the assistant item and leaves the user message in view."""
    section = (ROOT / "docs" / "frameworks" / "openai-agents-typescript.md").read_text()
    blocks = [
        b for b in re.findall(r"```js\n(.*?)```", section, flags=re.DOTALL) if "agents-ts-demo" in b
    ]
    assert len(blocks) == 1
    assert len(blocks[0].strip().splitlines()) <= 10
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "sessionlog-client").symlink_to(PACKAGE, target_is_directory=True)
    script = tmp_path / "example.mjs"
    script.write_text(blocks[0].replace("127.0.0.1:50051", server.address))
    result = subprocess.run(
        [node(), str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ['{"role":"assistant","content":"hello"}', "[ 'hi' ]"]


def test_docs_langgraph_typescript_example_runs_as_written(
    node_modules: Path, server: RunningServer, tmp_path: Path
) -> None:
    """The LangGraph page's LangGraph.js example, importing @langchain/langgraph and the
    package's subpath export by name, runs a graph on SessionlogSaver and prints its state."""
    section = (ROOT / "docs" / "frameworks" / "langgraph.md").read_text()
    blocks = [
        b for b in re.findall(r"```js\n(.*?)```", section, flags=re.DOTALL) if "lg-ts-demo" in b
    ]
    assert len(blocks) == 1
    assert len(blocks[0].strip().splitlines()) <= 12
    installed = tmp_path / "node_modules"
    (installed / "@langchain").mkdir(parents=True)
    (installed / "sessionlog-client").symlink_to(PACKAGE, target_is_directory=True)
    for name in ("langgraph", "langgraph-checkpoint", "core"):
        (installed / "@langchain" / name).symlink_to(node_modules / "@langchain" / name)
    script = tmp_path / "example.mjs"
    script.write_text(blocks[0].replace("127.0.0.1:50051", server.address))
    result = subprocess.run(
        [node(), str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[ 'hello' ]"]
    with Client(server.address) as client:
        # "-" is escaped as "-2d" in the session id, so the thread id reads back from it
        assert client.get_session("langgraph.lg-2dts-2ddemo").session.event_count >= 3


class NodeWorker:
    """test/polyglot-worker.mjs, spoken to line by line over stdin/stdout."""

    def __init__(self, address: str, session_id: str, count: int, label: str) -> None:
        self.process = subprocess.Popen(
            [node(), "test/polyglot-worker.mjs", address, session_id, str(count), label],
            cwd=PACKAGE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _pipe(self, pipe: IO[str] | None) -> IO[str]:
        assert pipe is not None
        return pipe

    def say(self, word: str) -> None:
        stdin = self._pipe(self.process.stdin)
        stdin.write(word + "\n")
        stdin.flush()

    def hear(self, timeout: float = 30.0) -> str:
        """The worker's next stdout line (fails on EOF or after ``timeout`` seconds)."""
        box: list[str] = []
        reader = threading.Thread(
            target=lambda: box.append(self._pipe(self.process.stdout).readline()), daemon=True
        )
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
            raise AssertionError(f"the Node worker said nothing: {err}")
        return box[0].strip()

    def stop(self) -> int:
        """Wait for the worker to exit (kill it after 10 s) and close its pipes."""
        try:
            code = self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        return code


@pytest.fixture
def node_worker(node_modules: Path, server: RunningServer) -> Iterator[NodeWorker]:
    """A Node worker that will append 30 messages "node-i" to session "shared"."""
    worker = NodeWorker(server.address, "shared", 30, "node")
    try:
        yield worker
    finally:
        worker.stop()


def test_python_and_node_workers_append_concurrently_and_agree(
    server: RunningServer, node_worker: NodeWorker
) -> None:
    """Both workers write one session at once; both then derive the very same messages."""
    assert node_worker.hear() == "ready"
    with Client(server.address) as client:
        node_worker.say("go")
        for i in range(30):
            client.append("shared", [event("user_message", {"content": f"python-{i}"})])
        assert node_worker.hear() == "done"
        node_worker.say("read")
        from_node: dict[str, Any] = json.loads(node_worker.hear())
        derived = client.derive_messages("shared")
        from_python = client.chat_messages("shared")
    assert node_worker.stop() == 0
    assert from_node["messages"] == from_python
    assert from_node["seqs"] == list(derived.seqs) == list(range(60))
    contents = [m["content"] for m in from_python]
    for label in ("python", "node"):
        mine = [c for c in contents if c.startswith(f"{label}-")]
        assert mine == [f"{label}-{i}" for i in range(30)], f"{label}'s order was not kept"
    labels = [c.split("-")[0] for c in contents]
    switches = sum(1 for a, b in itertools.pairwise(labels) if a != b)
    assert switches > 1, f"the two workers did not write concurrently: {labels}"
