"""Read streams and fresh calls through a real HAProxy when what is behind it changes (issue 29).

Each test builds one group, a primary and a read replica (`sessionlog serve`, each with
--http-listen for HAProxy's checks and a short --heartbeat), and an HAProxy on the configuration
`sessionlog cluster haproxy` writes, with 2 s timeouts (so a reload's old process ends the
streams it carries 2 s after the reload, its ``hard-stop-after``).

- The member carrying follow streams (the Python client's follow() and follow_sessions(), the
  asyncio client's follow(), the TypeScript client's follow() and followSessions(), `sessionlog
  tail`) is SIGKILLed: HAProxy ends each stream with an RST_STREAM (gRPC: UNKNOWN "Stream
  removed", no ErrorInfo); every follower resumes through HAProxy from its next seq (or feed
  position) and gets every event once, in order.
- HAProxy is reloaded (`haproxy -sf OLDPID`) with the same followers open: the same.
- A call that starts while the group has no primary (HAProxy answers 503), a client's or a
  one-shot CLI command's, waits within its retry budget (the CLI's --retry-for) for one; one that
  never gets one fails saying the proxy answered and the group has no primary.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.shard import haproxy, hasync
from sessionlog.shard.shardmap import Group, ShardMap
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import AsyncClient, Client, Retry, event
from sessionlog_client.errors import Unavailable
from tests.cluster.test_haproxy import _haproxy, _stop
from tests.e2e._helpers import user
from tests.e2e._proc import clean_env, free_port
from tests.e2e._replication_cluster import Cluster, Node
from tests.e2e.test_client_python import Follower
from tests.e2e.test_client_typescript import (
    PACKAGE,
    node,
    node_modules,  # noqa: F401  (a fixture, used by name)
)
from tests.e2e.test_dead_link import NodeFollower, seqs_in

# One test process runs every module that runs Node out of client/typescript (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("node-client")

SESSIONLOG = Path(sys.prefix) / "bin" / "sessionlog"
TIMEOUT_SECONDS = 2.0
"""HAProxy's client/server/tunnel timeout and its hard-stop-after."""
CHECK_SECONDS = 0.3
HEARTBEAT = 0.5
"""The servers' --heartbeat and the followers' (a quarter of HAProxy's timeout)."""
WAIT = 30.0
"""The most any step here waits for what it expects."""
READ_BACKEND, PRIMARY_SERVER, REPLICA_SERVER = "g-read", "g-1", "g-2"
"""Names in the configuration written for group "g" (its members in the map's order)."""


@dataclass
class Front:
    cluster: Cluster
    primary: Node
    replica: Node
    config: Path
    socket: str
    address: str
    """HAProxy's."""
    log: Path
    process: subprocess.Popen[bytes]

    def stub(self, channel: grpc.Channel) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]

    def streams_on(self, server: str) -> int:
        """The streams HAProxy carries now to ``server`` of the read backend (``show stat``)."""
        lines = hasync.command(self.socket, "show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == READ_BACKEND and row.get("svname") == server:
                return int(row["scur"] or 0)
        raise AssertionError(f"no {READ_BACKEND}/{server} in HAProxy's stats: {lines}")

    def server_state(self, server: str, state: str) -> None:
        """``set server g-read/SERVER state ready|drain`` (drain: no new stream goes to it)."""
        hasync.command(self.socket, f"set server {READ_BACKEND}/{server} state {state}")

    def reload(self) -> subprocess.Popen[bytes]:
        """A soft reload: a new HAProxy on the same configuration with ``-sf OLDPID``; the old
        process, returned, stops listening and ends what it carries within its
        hard-stop-after."""
        old = self.process
        self.process = _haproxy(self.config, self.log, "-sf", str(old.pid))
        return old


def _http(node: Node) -> str:
    return next(a for f, a in zip(node.args, node.args[1:], strict=False) if f == "--http-listen")


def _until(check: Callable[[], Any], what: str, seconds: float = WAIT) -> Any:
    """``check()``'s first truthy value within ``seconds`` (polled), else fail naming ``what``."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except grpc.RpcError as error:
            last = error
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {what} (last: {last!r})")


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    with Cluster(tmp_path) as cluster:

        def args() -> list[str]:
            return ["--http-listen", f"127.0.0.1:{free_port()}", "--heartbeat", str(HEARTBEAT)]

        primary = cluster.primary("primary", args=args())
        replica = cluster.replica(primary, "replica", args=args())
        shard_map = ShardMap(
            1,
            (
                Group(
                    "g",
                    (primary.address, replica.address),
                    ((0, 1023),),
                    (_http(primary), _http(replica)),
                ),
            ),
        )
        address = f"127.0.0.1:{free_port()}"
        out = tmp_path / "proxy"
        config, _ = haproxy.write(shard_map, out, address, TIMEOUT_SECONDS, CHECK_SECONDS)
        log = tmp_path / "haproxy.log"
        socket = str((out / haproxy.SOCKET_FILE).absolute())
        process = _haproxy(config, log)
        setup = Front(cluster, primary, replica, config, socket, address, log, process)
        try:
            hasync.wait_socket(socket, 10.0)
            with grpc.insecure_channel(address) as channel:
                probe = pb.AppendRequest(session_id="probe", events=[user("probe")])
                _until(lambda: setup.stub(channel).Append(probe, timeout=5), "a write via HAProxy")
            _until(
                lambda: setup.streams_on(REPLICA_SERVER) == 0 and _up(setup, REPLICA_SERVER),
                "HAProxy's check passes the replica",
            )
            yield setup
        finally:
            for running in {process, setup.process}:
                _stop(running)


def _up(front: Front, server: str) -> bool:
    lines = hasync.command(front.socket, "show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname") == READ_BACKEND and row.get("svname") == server:
            return row.get("status") == "UP"
    return False


class Tail:
    """`sessionlog tail SESSION --json` as a process, its lines read by a thread."""

    def __init__(self, address: str, session_id: str, cwd: Path) -> None:
        self.process = subprocess.Popen(
            [str(SESSIONLOG), "tail", session_id, "--json", "--server", address],
            cwd=cwd,
            env=clean_env(workers=False),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.seqs: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.seqs.append(int(json.loads(line).get("seq", 0)))

    def stop(self) -> str:
        """Its stderr once it is stopped (SIGTERM by PID)."""
        self.process.terminate()
        try:
            _, err = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
        self._reader.join(10)
        return err


class NodeChanges:
    """The TypeScript client's followSessions() in a Node process, read to ``count`` events:
    it prints "event SEQ" for each event of each change, then "done RECONNECTS" (or "error
    MESSAGE") and exits."""

    def __init__(self, address: str, prefix: str, count: int) -> None:
        script = (
            "import { SessionLogClient } from 'sessionlog-client';"
            f"const c = new SessionLogClient('{address}',"
            f" {{ retry: {{ giveUpAfterMs: {round(WAIT * 1000)} }} }});"
            f"const s = c.followSessions({{ prefix: '{prefix}', after: 0,"
            f" heartbeatMs: {round(HEARTBEAT * 1000)} }});"
            "let n = 0;"
            "try { for await (const change of s) {"
            " for (const e of change.events) { console.log(`event ${e.seq}`); n += 1; }"
            f" if (n >= {count}) break; }}"
            " console.log(`done ${s.reconnects}`);"
            "} catch (e) { console.log(`error ${e.message}`); }"
            " finally { s.close(); c.close(); }"
            "process.exit(0);"
        )
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [node(), "--input-type=module", "-e", script],
            cwd=PACKAGE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def seqs(self) -> list[int]:
        return seqs_in(self.lines)

    def finish(self) -> int:
        """Its reconnects, once it has read its count and exited."""
        _until(lambda: self.process.poll() is not None, "the Node followSessions exits")
        self._reader.join(10)
        last = self.lines[-1] if self.lines else ""
        assert last.startswith("done "), self.lines
        return int(last.split()[1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)
        self._reader.join(10)


class AsyncFollower:
    """``AsyncClient.follow()`` read to ``count`` events in a thread with its own event loop."""

    def __init__(self, address: str, session_id: str, count: int) -> None:
        self.seqs: list[int] = []
        self.reconnects = 0
        self.error: BaseException | None = None
        self._args = (address, session_id, count)
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        address, session_id, count = self._args
        try:
            async with (
                AsyncClient(address, retry=Retry(give_up_after=WAIT)) as client,
                client.follow(session_id, heartbeat=HEARTBEAT) as events,
            ):
                async for got in events:
                    self.seqs.append(got.seq)
                    self.reconnects = events.reconnects
                    if len(self.seqs) >= count:
                        return
        except Exception as error:
            self.error = error

    def wait(self) -> list[int]:
        """Its seqs once it has read its count (or failed)."""
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), f"the asyncio follower has {self.seqs}"
        assert self.error is None, f"the asyncio follower failed: {self.error!r}"
        return self.seqs


@dataclass
class Followers:
    """One follower of each kind on one session, all opened through HAProxy."""

    python: Follower
    changes: list[Any]
    node: NodeFollower
    tail: Tail
    aio: AsyncFollower
    node_changes: NodeChanges
    client: Client
    heard: list[str]
    """Every line the Node follower printed so far."""

    def hear(self, prefix: str) -> None:
        """Read the Node follower's lines up to the first starting with ``prefix``."""
        self.heard += self.node.hear(prefix, WAIT)


@contextmanager
def _follow_everywhere(
    front: Front, session_id: str, count: int, tmp_path: Path
) -> Iterator[Followers]:
    client = Client(front.address, retry=Retry(give_up_after=WAIT))
    python = Follower(client.follow(session_id, heartbeat=HEARTBEAT))
    sessions = client.follow_sessions(prefix=session_id, after=0, heartbeat=HEARTBEAT)
    changes: list[Any] = []
    errors: queue.Queue[BaseException] = queue.Queue()

    def drain() -> None:
        try:
            changes.extend(sessions)
        except BaseException as error:
            errors.put(error)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    worker = NodeFollower(front.address, session_id, count, int(HEARTBEAT * 1000))
    tail = Tail(front.address, session_id, tmp_path)
    aio = AsyncFollower(front.address, session_id, count)
    node_changes = NodeChanges(front.address, session_id, count)
    followers = Followers(python, changes, worker, tail, aio, node_changes, client, [])
    try:
        yield followers
    finally:
        sessions.close()
        reader.join(10)
        python.stream.close()
        tail.stop()
        worker.stop()
        node_changes.stop()
        client.close()
    assert errors.empty(), f"follow_sessions failed: {errors.get()!r}"


def _write(client: Client, session_id: str, first: int, last: int) -> None:
    for n in range(first, last):
        client.append(session_id, [event("user_message", {"content": f"e{n}"})])


def _check_each_once(followers: Followers, count: int) -> None:
    """Every follower got seqs 0..count-1, each once, in order."""
    want = list(range(count))
    followers.python.wait_for(count)
    assert followers.python.seqs() == want
    assert [e.data["content"] for e in followers.python.events] == [f"e{n}" for n in want]
    _until(lambda: sum(len(c.events) for c in followers.changes) >= count, "follow_sessions")
    assert [e.seq for c in followers.changes for e in c.events] == want
    followers.hear(f"event {count - 1}")
    assert seqs_in(followers.heard) == want, followers.heard
    _until(lambda: len(followers.tail.seqs) >= count, "sessionlog tail")
    assert followers.tail.seqs == want
    assert followers.aio.wait() == want
    assert followers.aio.reconnects >= 1
    assert followers.node_changes.finish() >= 1
    assert followers.node_changes.seqs() == want


@pytest.mark.usefixtures("node_modules")
def test_followers_resume_when_the_member_carrying_them_is_killed(
    front: Front, tmp_path: Path
) -> None:
    """Six followers whose streams HAProxy sends to the replica; the replica SIGKILLed: each
    resumes through HAProxy on the primary, no gap, no duplicate, and the Python ones count a
    reconnect."""
    session_id, count = "killed", 12
    front.server_state(PRIMARY_SERVER, "drain")  # every new read stream goes to the replica
    with _follow_everywhere(front, session_id, count, tmp_path) as followers:
        _write(followers.client, session_id, 0, 4)
        followers.python.wait_for(4)
        followers.hear("event 3")
        _until(lambda: len(followers.tail.seqs) >= 4, "the tail's first events")
        _until(lambda: len(followers.aio.seqs) >= 4, "the asyncio follower's first events")
        _until(lambda: len(followers.node_changes.seqs()) >= 4, "Node followSessions' first")
        assert front.streams_on(REPLICA_SERVER) == 6  # four follows, two follow_sessions
        assert front.streams_on(PRIMARY_SERVER) == 0
        front.server_state(PRIMARY_SERVER, "ready")
        front.replica.kill()
        _write(followers.client, session_id, 4, count)
        _check_each_once(followers, count)
        assert followers.python.stream.reconnects >= 1
        # follow, follow_sessions and tail go on from the primary (the Node and asyncio
        # followers have stopped after their count)
        assert front.streams_on(PRIMARY_SERVER) >= 3


@pytest.mark.usefixtures("node_modules")
def test_followers_resume_across_an_haproxy_reload(front: Front, tmp_path: Path) -> None:
    """Followers open through HAProxy; HAProxy reloaded (-sf): the old process ends their
    streams at its hard-stop-after and exits; each resumes through the new process, no gap,
    no duplicate."""
    session_id, count = "reloaded", 12
    with _follow_everywhere(front, session_id, count, tmp_path) as followers:
        _write(followers.client, session_id, 0, 4)
        followers.python.wait_for(4)
        followers.hear("event 3")
        _until(lambda: len(followers.tail.seqs) >= 4, "the tail's first events")
        _until(lambda: len(followers.aio.seqs) >= 4, "the asyncio follower's first events")
        _until(lambda: len(followers.node_changes.seqs()) >= 4, "Node followSessions' first")
        old = front.reload()
        try:
            _write(followers.client, session_id, 4, 8)
            old.wait(TIMEOUT_SECONDS + WAIT)  # it ends the streams it carries, then exits
        finally:
            _stop(old)
        _write(followers.client, session_id, 8, count)
        _check_each_once(followers, count)
        assert followers.python.stream.reconnects >= 1


def _answers_503(front: Front) -> bool:
    """HAProxy answers a write with HTTP 503 (no primary behind it), as a raw gRPC call sees."""
    with grpc.insecure_channel(front.address) as channel:
        try:
            front.stub(channel).Append(
                pb.AppendRequest(session_id="probe", events=[user("x")]),
                metadata=(("x-session-id", "probe"),),
                timeout=5,
            )
        except grpc.RpcError as error:
            return "503" in (error.details() or "")
    return False


def _node_append(address: str, session_id: str, give_up_ms: int) -> subprocess.Popen[str]:
    """A Node process that appends one event with a fresh TypeScript client and prints "ok" or
    the error's message."""
    script = (
        "import { SessionLogClient } from 'sessionlog-client';"
        f"const c = new SessionLogClient('{address}',"
        f" {{ retry: {{ giveUpAfterMs: {give_up_ms} }} }});"
        f"try {{ await c.append('{session_id}',"
        " [{ type: 'user_message', data: { content: 'hi' } }]);"
        " console.log('ok'); } catch (e) { console.log(e.message); } finally { c.close(); }"
    )
    return subprocess.Popen(
        [node(), "--input-type=module", "-e", script],
        cwd=PACKAGE,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cli_append(
    address: str, session_id: str, retry_for: float, cwd: Path
) -> subprocess.Popen[str]:
    """`sessionlog append SESSION user_message --content hi --json --retry-for SECONDS`."""
    return subprocess.Popen(
        [
            *(str(SESSIONLOG), "append", session_id, "user_message", "--content", "hi"),
            *("--json", "--server", address, "--retry-for", str(retry_for)),
        ],
        cwd=cwd,
        env=clean_env(workers=False),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_cli_append_waits_for_a_primary_behind_the_proxy(front: Front, tmp_path: Path) -> None:
    """The primary killed, HAProxy answers 503: `sessionlog append` started then waits (where it
    failed at once) and appends once when the primary is back."""
    front.primary.kill()
    _until(lambda: _answers_503(front), "HAProxy's 503")
    cli = _cli_append(front.address, "fresh-cli", WAIT, tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):  # still waiting for a primary, 2 s on
        pytest.fail(f"the CLI ended with no primary: {cli.communicate(timeout=2.0)!r}")
    front.primary.start()
    out, err = cli.communicate(timeout=WAIT)
    assert cli.returncode == 0, err
    assert json.loads(out)["next_seq"] == 1, out
    with Client(front.primary.address) as client:  # written once, though tried many times
        assert client.get_session("fresh-cli").session.event_count == 1


@pytest.mark.usefixtures("node_modules")
def test_a_fresh_call_waits_for_a_primary_behind_the_proxy(front: Front) -> None:
    """The primary killed, HAProxy answers 503: a fresh client's append (Python, TypeScript)
    waits (where it failed at once, "cannot reach a sessionlog server") and succeeds once the
    primary is back."""
    front.primary.kill()
    _until(lambda: _answers_503(front), "HAProxy's 503")
    ts = _node_append(front.address, "fresh-ts", round(WAIT * 1000))
    outcome: queue.Queue[Any] = queue.Queue()

    def append() -> None:
        with Client(front.address, retry=Retry(give_up_after=WAIT)) as client:
            try:
                outcome.put(client.append("fresh", [event("user_message", {"content": "hi"})]))
            except Exception as error:
                outcome.put(error)

    caller = threading.Thread(target=append, daemon=True)
    caller.start()
    with pytest.raises(queue.Empty):  # still waiting for a primary, 2 s on
        pytest.fail(f"the call ended with no primary: {outcome.get(timeout=2.0)!r}")
    assert ts.poll() is None, ts.communicate()
    front.primary.start()
    reply = outcome.get(timeout=WAIT)
    assert isinstance(reply, pb.AppendResponse), reply
    assert reply.next_seq == 1
    caller.join(10)
    out, err = ts.communicate(timeout=WAIT)
    assert out.strip() == "ok", (out, err)


@pytest.mark.usefixtures("node_modules")
def test_a_call_that_never_gets_a_primary_says_the_proxy_answered(
    front: Front, tmp_path: Path
) -> None:
    """With no primary for longer than its budget, a call fails naming the proxy's 503 and the
    missing primary (Python client, the CLI, the TypeScript client), not "cannot reach"."""
    front.primary.kill()
    _until(lambda: _answers_503(front), "HAProxy's 503")
    started = time.monotonic()
    client = Client(front.address, retry=Retry(give_up_after=1.5))
    with client, pytest.raises(Unavailable) as refused:
        client.append("fresh", [event("user_message", {"content": "hi"})])
    assert time.monotonic() - started >= 1.0  # it waited its budget out
    _says_no_primary(refused.value.message)
    started = time.monotonic()
    cli = _cli_append(front.address, "fresh", 1.5, tmp_path).communicate(timeout=WAIT)
    assert time.monotonic() - started >= 1.0  # the CLI waited its --retry-for out too
    _says_no_primary(cli[1])
    out, err = _node_append(front.address, "fresh", 1500).communicate(timeout=WAIT)
    _says_no_primary(out + err)


def _says_no_primary(said: str) -> None:
    assert "proxy answered HTTP 503" in said, said
    assert "no primary" in said, said
    assert "cannot reach" not in said, said
