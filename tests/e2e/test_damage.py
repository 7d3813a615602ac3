"""A damaged data file under real `sessionlog serve` and `sessionlog admin` processes.

A server writes a few hundred events and stops; then its data.mdb is cut short or overwritten
in the middle. A truncated file must be refused at start with one line (it used to kill the
server with SIGBUS); random bytes over pages holding events must leave a server that answers
every read with OK or DATA_LOSS / DATA_CORRUPTED (never INTERNAL), refuses damaged writes
cleanly, never dies, and `admin verify` must list the damage.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.testing import error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import Client
from sessionlog_client.errors import DataCorrupted
from tests.e2e._helpers import user
from tests.e2e._proc import ServerProcess, free_port, run_cli

SESSIONS = 12
EVENTS = 30
PAGE = 4096
SEED = 12


def _listen() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding SESSIONS x EVENTS events written by a real server, then restored
    from its own compacted backup (the way an operator restores), so every page is in use."""
    root = tmp_path_factory.mktemp("damage")
    written = root / "written"
    listen = _listen()
    with ServerProcess(["--data", str(written), "--listen", listen], root) as server:
        server.wait_serving(listen)
        with grpc.insecure_channel(listen) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for n in range(SESSIONS):
                events = [user(f"marker-{n}-{i} " + "x" * 200) for i in range(EVENTS)]
                stub.Append(pb.AppendRequest(session_id=f"s{n}", events=events), timeout=10)
        assert server.stop() == 0
    backup = root / "backup"
    done = run_cli(["admin", "backup", str(backup), "--data", str(written)], root)
    assert done.returncode == 0, done.stderr
    return backup


@pytest.fixture
def data(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of the pristine folder for one test to damage."""
    copy = tmp_path / "data"
    shutil.copytree(pristine, copy)
    return copy


def _truncate(folder: Path, size: Callable[[int], int]) -> Path:
    path = folder / "data.mdb"
    with path.open("r+b") as file:
        file.truncate(size(path.stat().st_size))
    return path


def _one_line_refusal(stderr: str, path: Path) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert str(path) in lines[0]
    assert "truncated" in lines[0]
    assert "backup" in lines[0]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("size", [lambda _: 8 << 10, lambda full: full // 2], ids=["8KiB", "half"])
def test_serve_refuses_a_truncated_file(data: Path, size: Callable[[int], int]) -> None:
    """`serve` on a truncated data.mdb exits 1 with one line naming the file (no SIGBUS)."""
    path = _truncate(data, size)
    server = ServerProcess(["--data", str(data), "--listen", _listen()], data.parent)
    server.start()
    assert server.wait(timeout=20) == 1
    _one_line_refusal(server.log(), path)


def test_admin_on_a_truncated_file_fails_with_one_line(data: Path) -> None:
    """`admin stats` and `admin verify` on a truncated file exit 1 with one line, no SIGBUS."""
    path = _truncate(data, lambda full: full // 2)
    for command in ("stats", "verify"):
        done = run_cli(["admin", command, "--data", str(data)], data.parent)
        assert done.returncode == 1, (command, done.returncode, done.stderr)
        _one_line_refusal(done.stderr, path)


def test_verify_passes_a_healthy_store(data: Path) -> None:
    """`admin verify` on an undamaged store exits 0 and counts every event."""
    done = run_cli(["admin", "verify", "--data", str(data), "--json"], data.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["damaged"] is False
    assert report["problems"] == []
    assert report["records"]["events"] == SESSIONS * EVENTS


def _overwrite_event_pages(folder: Path) -> None:
    """Random bytes (fixed seed) over two whole pages holding events of a middle session."""
    path = folder / "data.mdb"
    content = bytearray(path.read_bytes())
    page = content.find(f"marker-{SESSIONS // 2}-".encode()) // PAGE
    assert 2 < page < len(content) // PAGE - 2, "the events should sit in the middle"
    rng = random.Random(SEED)
    content[page * PAGE : (page + 2) * PAGE] = rng.randbytes(2 * PAGE)
    path.write_bytes(bytes(content))


Call = Callable[[], Any]


def _calls(stub: pb_grpc.SessionLogServiceStub) -> dict[str, Call]:
    """Every read of every session, the listing, and writes to each session and a new one."""
    calls: dict[str, Call] = {"ListSessions": partial(stub.ListSessions, pb.ListSessionsRequest())}
    for n in range(SESSIONS):
        sid = f"s{n}"
        calls[f"GetSession {sid}"] = partial(stub.GetSession, pb.GetSessionRequest(session_id=sid))
        calls[f"Since {sid}"] = partial(_drain, stub, sid)
        calls[f"Surface {sid}"] = partial(stub.Surface, pb.SurfaceRequest(session_id=sid))
        derive = pb.DeriveMessagesRequest(session_id=sid)
        calls[f"DeriveMessages {sid}"] = partial(stub.DeriveMessages, derive)
        append = pb.AppendRequest(session_id=sid, events=[user("after the damage")])
        calls[f"Append {sid}"] = partial(stub.Append, append)
    fresh = pb.AppendRequest(session_id="fresh", events=[user("new")])
    calls["Append new"] = partial(stub.Append, fresh)
    return calls


def _drain(stub: pb_grpc.SessionLogServiceStub, session_id: str) -> int:
    return sum(len(r.events) for r in stub.Since(pb.SinceRequest(session_id=session_id)))


def _outcome(call: Call) -> str:
    """OK, or the status code's name (with its reason for DATA_LOSS)."""
    try:
        call()
    except grpc.RpcError as error:
        code = error.code()
        if code == grpc.StatusCode.DATA_LOSS:
            return f"DATA_LOSS {error_info(error).reason}"
        return str(code.name)
    return "OK"


def test_random_bytes_in_the_middle_give_data_loss_never_a_crash(data: Path) -> None:
    """Over pages of events overwritten with random bytes, the server starts, answers every
    read and write with OK or DATA_LOSS (DATA_CORRUPTED), stays up, its web console answers
    JSON, and `admin verify` exits 1 listing the damage."""
    _overwrite_event_pages(data)
    listen, http = _listen(), _listen()
    args = ["--data", str(data), "--listen", listen, "--http-listen", http]
    with ServerProcess(args, data.parent) as server:
        server.wait_serving(listen)
        with grpc.insecure_channel(listen) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            outcomes = {name: _outcome(call) for name, call in _calls(stub).items()}
        assert set(outcomes.values()) == {"OK", "DATA_LOSS DATA_CORRUPTED"}, outcomes
        assert outcomes["Append new"] == "OK"
        damaged = [name.split()[1] for name, got in outcomes.items() if got != "OK"]
        url = f"http://{http}/api/sessions/{damaged[-1]}/events"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 500
        assert json.loads(refused.value.read())["reason"] == "DATA_CORRUPTED"
        assert server.process is not None
        assert server.process.poll() is None, server.log()
        log = server.log()
        assert "Traceback" not in log
        refusals = [json.loads(line) for line in log.splitlines() if "DATA_CORRUPTED" in line]
        assert {(r["level"], r.get("method")) for r in refusals} >= {("error", "Surface")}
        assert server.stop() == 0
    done = run_cli(["admin", "verify", "--data", str(data)], data.parent)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= 2
    assert "problems in" in lines[-1]
    assert any(f"'s{SESSIONS // 2}'" in line for line in lines[:-1]), lines


# -- verify's verdict against the server's ------------------------------------------------------

P_BRANCH = 0x01


def _events_branch_node(content: bytes) -> tuple[int, int]:
    """(page, offset) of a middle node of a branch page of the events table: a branch page
    whose keys (past the first, which is empty) are all sid + seq (16 bytes)."""
    for page in range(2, len(content) // PAGE):
        base = page * PAGE
        pgno, _, flags, lower, _ = struct.unpack_from("<QHHHH", content, base)
        count = (lower - 16) // 2
        if pgno != page or flags != P_BRANCH or count < 3:
            continue
        nodes = [struct.unpack_from("<H", content, base + 16 + 2 * i)[0] for i in range(count)]
        if all(struct.unpack_from("<H", content, base + at + 6)[0] == 16 for at in nodes[1:]):
            return page, base + nodes[count // 2]
    raise AssertionError("no branch page of the events table")


def _session_reads(listen: str) -> dict[str, str]:
    with grpc.insecure_channel(listen) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        return {f"s{n}": _outcome(partial(_drain, stub, f"s{n}")) for n in range(SESSIONS)}


def test_verify_names_only_the_sessions_a_damaged_branch_page_hides(data: Path) -> None:
    """A branch page of the events table whose middle child points past the file: verify
    names exactly the sessions whose reads the server refuses (DATA_CORRUPTED), and no session
    past the damage as empty (it used to list every session after the damage with 0 events);
    the feed is walked to its end, only the change naming the hidden events reported."""
    path = data / "data.mdb"
    content = bytearray(path.read_bytes())
    _, node = _events_branch_node(bytes(content))
    far = len(content) // PAGE + 1000  # a page number past the file's last page
    struct.pack_into("<HHH", content, node, far & 0xFFFF, (far >> 16) & 0xFFFF, far >> 32)
    path.write_bytes(bytes(content))
    done = run_cli(["admin", "verify", "--data", str(data), "--json"], data.parent)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    named = {
        session
        for problem in report["problems"]
        for session in (f"s{n}" for n in range(SESSIONS))
        if f"'{session}'" in problem["where"]
    }
    assert not any("events exist" in problem["what"] for problem in report["problems"]), report
    feed = [p for p in report["problems"] if p["table"] == "changes"]
    assert feed, report  # the change naming the hidden events, and only it: the feed goes on
    assert all("cannot read the events it names" in p["what"] for p in feed), feed
    assert report["records"]["changes"] == SESSIONS, report["records"]
    listen = _listen()
    with ServerProcess(["--data", str(data), "--listen", listen], data.parent) as server:
        server.wait_serving(listen)
        reads = _session_reads(listen)
        assert server.stop() == 0
    refused = {session for session, got in reads.items() if got != "OK"}
    assert set(reads.values()) == {"OK", "DATA_LOSS DATA_CORRUPTED"}, reads
    assert named == refused, (named, refused, report["problems"])
    assert len(refused) < SESSIONS // 2, refused


def _written_store(root: Path) -> Path:
    """A folder written by a real server and never compacted: its free list holds pages."""
    written = root / "with-free-pages"
    listen = _listen()
    with ServerProcess(["--data", str(written), "--listen", listen], root) as server:
        server.wait_serving(listen)
        with grpc.insecure_channel(listen) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for n in range(40):
                stub.Append(pb.AppendRequest(session_id=f"f{n % 6}", events=[user("x")]))
        assert server.stop() == 0
    return written


def _serve_starts(data: Path) -> bool:
    listen = _listen()
    server = ServerProcess(["--data", str(data), "--listen", listen], data.parent)
    server.start()
    try:
        server.wait_serving(listen)
    except AssertionError:  # it exited before serving: refused
        assert server.wait(timeout=20) != 0
        return False
    assert server.stop() == 0
    return True


def test_verify_is_never_clean_about_a_free_list_the_server_refuses(tmp_path: Path) -> None:
    """The free list's root page overwritten: LMDB reads it only to write, so every read
    passes, but `serve` cannot start; verify must say damaged too (it said "no damage
    found"). Before the damage both agree the other way: verify clean, serve starts."""
    data = _written_store(tmp_path)
    verify = ["admin", "verify", "--data", str(data)]
    assert run_cli(verify, tmp_path).returncode == 0
    assert _serve_starts(data)
    path = data / "data.mdb"
    content = bytearray(path.read_bytes())
    metas = [struct.unpack_from("<QQ", content, at + 136) for at in (0, PAGE)]
    newest = max(range(2), key=lambda i: metas[i][1])
    root = struct.unpack_from("<Q", content, newest * PAGE + 80)[0]
    assert 2 <= root < len(content) // PAGE, "the store should have a free list"
    content[root * PAGE : (root + 1) * PAGE] = random.Random(SEED).randbytes(PAGE)
    path.write_bytes(bytes(content))
    assert not _serve_starts(data)
    done = run_cli(verify, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"free list page {root}" in done.stdout, done.stdout


def test_a_damaged_event_streamed_as_stored_is_data_corrupted_in_the_python_client(
    data: Path,
) -> None:
    """Since sends events as they are stored, unparsed: bytes of one event made invalid UTF-8
    reach the Python client as a reply it cannot decode, which it raises as DataCorrupted
    (naming `admin verify`), not a bare TransportError; the other sessions read whole."""
    path = data / "data.mdb"
    content = bytearray(path.read_bytes())
    marker = b"marker-3-7 "
    found = [at for at in range(len(content)) if content.startswith(marker, at)]
    assert found, "the marker is not in the data file"
    for at in found:
        content[at : at + len(marker)] = b"\xff" * len(marker)
    path.write_bytes(bytes(content))
    listen = _listen()
    with ServerProcess(["--data", str(data), "--listen", listen], data.parent) as server:
        server.wait_serving(listen)
        with Client(listen) as client:
            with pytest.raises(DataCorrupted) as refused:
                list(client.since("s3"))
            assert "admin verify" in str(refused.value)
            assert len(list(client.since("s4"))) == EVENTS
        assert server.process is not None
        assert server.process.poll() is None, server.log()
        assert server.stop() == 0
