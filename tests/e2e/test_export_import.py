"""`sessionlog export` and `sessionlog import` round trips, and the clients' import_session.

A session exported from one server and imported into another (or under another id) reads back
the same: every event with its seq, time, type, data, surface op and state delta, and the
record's create and last-append times and fork parent. Large sessions go in several chunks.
Bad lines are refused naming the line, and a bad file imports nothing: the CLI checks it whole
before its first write. Two servers for the module (a third, with a small event limit, for the
refusals the CLI cannot foresee).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessionlog import fold
from sessionlog.cli import main
from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, Client, errors, event
from sessionlog_client.v1 import event_pb2
from sessionlog_client.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import SESSIONLOG, clean_env, run_cli, running_server
from tests.e2e._relay import Relay


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    root = tmp_path_factory.mktemp("transfer")
    with running_server(root / "a") as a, running_server(root / "b") as b:
        yield a, b


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose events may be at most 64 KiB, where the CLI checks against 1 MiB."""
    root = tmp_path_factory.mktemp("transfer-small")
    with running_server(root / "s", limits=fold.Limits(max_event_bytes=SMALL_EVENT)) as server:
        yield server


SMALL_EVENT = 64 << 10


def cli(server: RunningServer, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--server", server.address], cwd, timeout=120)


def events_of(client: Client, session_id: str) -> list[event_pb2.Event]:
    return list(client.since(session_id))


def record_of(client: Client, session_id: str) -> pb.Session:
    """The session as GetSession reports it, without its lease and its uid (an imported session
    is a new incarnation: it has a uid of its own)."""
    session = client.get_session(session_id).session
    session.ClearField("lease")
    session.ClearField("uid")
    return session


def build(client: Client, session_id: str) -> None:
    """A session of every kind of event: messages, tool calls, turns, a replace, a hide, state."""
    client.create_session(session_id, [event("system_message", {"content": "be brief"})])
    client.append(
        session_id,
        [
            event("turn_start", {}),
            event("user_message", {"content": "hi", "metadata": {"n": 1, "x": 0.25}}),
            event("tool_call", {"name": "look", "args": [1, "two", None, True]}),
            event("tool_result", {"tool_call_id": "c1", "content": "found"}),
            event("assistant_message", {"content": "done", "reasoning_content": "r"}),
            event("turn_end", {}, state_delta={"step": 2, "nested": {"k": [1, 2]}}),
        ],
    )
    client.append(session_id, [event("user_message", {"content": "[sum]"}, replace=(1, 3))])
    client.hide(session_id, 4, 5)


def test_export_then_import_elsewhere_is_identical(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    """Export from A, import into B under the same id, and under another id on A."""
    a, b = servers
    with Client(a.address) as ca, Client(b.address) as cb:
        build(ca, "tr-parent")
        ca.fork_session("tr-parent", at_seq=6, session_id="tr-child")
        ca.append("tr-child", [event("assistant_message", {"content": "after the fork"})])
        for session_id in ("tr-parent", "tr-child"):
            out = tmp_path / f"{session_id}.jsonl"
            done = cli(a, tmp_path, "export", session_id, "-o", str(out))
            assert done.returncode == 0, done.stderr
            lines = out.read_text().splitlines()
            assert json.loads(lines[0])["sessionlog_export"] == 1
            assert len(lines) == 1 + record_of(ca, session_id).event_count
            done = cli(b, tmp_path, "import", str(out))
            assert done.returncode == 0, done.stderr
            assert f"imported {session_id}" in done.stdout
            assert events_of(cb, session_id) == events_of(ca, session_id)
            assert record_of(cb, session_id) == record_of(ca, session_id)
            assert cb.chat_messages(session_id) == ca.chat_messages(session_id)
            assert cb.get_state(session_id) == ca.get_state(session_id)
        child = record_of(cb, "tr-child")
        assert (child.parent_session_id, child.parent_event_count) == ("tr-parent", 7)

        done = cli(a, tmp_path, "import", str(tmp_path / "tr-child.jsonl"), "--session-id", "tr-2")
        assert done.returncode == 0, done.stderr
        assert events_of(ca, "tr-2") == events_of(ca, "tr-child")
        renamed, original = record_of(ca, "tr-2"), record_of(ca, "tr-child")
        renamed.session_id = original.session_id
        assert renamed == original


def test_a_long_session_goes_in_chunks_through_stdout_and_stdin(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    """1,200 events (three chunks) piped from export to import; an empty session too."""
    a, b = servers
    with Client(a.address) as ca, Client(b.address) as cb:
        for start in range(0, 1200, 400):
            batch = [event("user_message", {"content": f"m{n}"}) for n in range(start, start + 400)]
            ca.append("tr-long", batch)
        ca.create_session("tr-empty")
        for session_id in ("tr-long", "tr-empty"):
            exported = cli(a, tmp_path, "export", session_id)
            assert exported.returncode == 0, exported.stderr
            imported = subprocess.run(
                [str(SESSIONLOG), "import", "-", "--server", b.address],
                input=exported.stdout,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert imported.returncode == 0, imported.stderr
            assert events_of(cb, session_id) == events_of(ca, session_id)
            assert record_of(cb, session_id) == record_of(ca, session_id)
        assert record_of(cb, "tr-long").event_count == 1200
        assert record_of(cb, "tr-empty").exists


def test_the_openai_format_is_the_chat_messages(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    a, _ = servers
    with Client(a.address) as ca:
        build(ca, "tr-chat")
        done = cli(a, tmp_path, "export", "tr-chat", "--format", "openai")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == ca.chat_messages("tr-chat")


def test_bad_lines_are_refused_naming_the_line(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    """Not JSON, not an event, a seq out of line, an event the server would refuse, no record
    line, a session that exists: each refused with its line (or reason), nothing imported."""
    a, b = servers
    header = json.dumps({"sessionlog_export": 1, "session": {"session_id": "tr-bad"}})
    good = json.dumps({"seq": 0, "type": "EVENT_TYPE_USER_MESSAGE", "data": {"content": "a"}})
    cases = [
        ([header, good, "{not json"], 2, "line 3: not JSON"),
        ([header, good, '{"seq": 1, "type": "EVENT_TYPE_NOPE"}'], 2, "line 3: not an event"),
        ([header, good.replace('"seq": 0', '"seq": 4')], 2, "line 2: seq 4"),
        (
            [header, good, '{"seq": 1, "type": "EVENT_TYPE_TOOL_CALL", "surface_op": '
             '{"replace": {"start_seq": 0, "stop_seq": 0}}}'],
            2,
            "line 3: SURFACE_OP_ON_NON_SURFACE_EVENT",
        ),
        ([good], 2, "line 1: not a session record line"),
        ([], 2, "the file is empty"),
    ]  # fmt: skip
    with Client(b.address) as cb:
        for lines, status, message in cases:
            path = tmp_path / "bad.jsonl"
            path.write_text("".join(line + "\n" for line in lines))
            done = cli(b, tmp_path, "import", str(path))
            assert done.returncode == status, (lines, done.stdout, done.stderr)
            assert message in done.stderr, (lines, done.stderr)
            assert not cb.get_session("tr-bad").session.exists
        cb.append("tr-taken", [event("user_message", {"content": "mine"})])
        path.write_text(header.replace("tr-bad", "tr-taken") + "\n" + good + "\n")
        done = cli(b, tmp_path, "import", str(path))
        assert done.returncode == 1
        assert "SESSION_ALREADY_EXISTS" in done.stderr
        assert cb.get_session("tr-taken").session.event_count == 1
    done = cli(a, tmp_path, "export", "tr-never")
    assert done.returncode == 1
    assert "does not exist" in done.stderr


def test_import_resume_continues_an_import_that_stopped(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    """An import cut short (the file ends at event 700 of 1,200: two chunks in) is continued by
    --resume from the target's next seq, to the same session as the source; a plain import of
    it names --resume; resuming a finished import changes nothing; resuming onto a session that
    is not that import, or into a new id, is refused or imports the whole file."""
    a, b = servers
    with Client(a.address) as ca, Client(b.address) as cb:
        for start in range(0, 1200, 400):
            batch = [event("user_message", {"content": f"r{n}"}) for n in range(start, start + 400)]
            ca.append("tr-resume", batch)
        whole = tmp_path / "resume.jsonl"
        assert cli(a, tmp_path, "export", "tr-resume", "-o", str(whole)).returncode == 0
        lines = whole.read_text().splitlines(keepends=True)
        cut = tmp_path / "cut.jsonl"
        cut.write_text("".join(lines[: 1 + 700]))
        done = cli(b, tmp_path, "import", str(cut))
        assert done.returncode == 2
        assert "cut short" in done.stderr
        assert not record_of(cb, "tr-resume").exists  # checked whole before any write
        source = record_of(ca, "tr-resume")
        stopped = events_of(ca, "tr-resume")[:700]  # an import stopped after 700 events
        cb.import_session("tr-resume", stopped, create_time=source.create_time, record=source)

        done = cli(b, tmp_path, "import", str(whole))
        assert done.returncode == 1
        assert "IMPORT_SEQ_MISMATCH" in done.stderr
        assert "--resume" in done.stderr
        done = cli(b, tmp_path, "import", str(whole), "--resume")
        assert done.returncode == 0, done.stderr
        assert "imported tr-resume with 1200 events" in done.stdout
        assert events_of(cb, "tr-resume") == events_of(ca, "tr-resume")
        assert record_of(cb, "tr-resume") == record_of(ca, "tr-resume")

        done = cli(b, tmp_path, "import", str(whole), "--resume")
        assert done.returncode == 0, done.stderr
        assert record_of(cb, "tr-resume").event_count == 1200

        other = [event("user_message", {"content": f"other{n}"}) for n in range(3)]
        cb.import_session("tr-other", other)
        done = cli(b, tmp_path, "import", str(whole), "--resume", "--session-id", "tr-other")
        assert done.returncode == 1
        assert "line 4: seq 2 differs" in done.stderr
        assert record_of(cb, "tr-other").event_count == 3

        done = cli(b, tmp_path, "import", str(whole), "--resume", "--session-id", "tr-fresh")
        assert done.returncode == 0, done.stderr
        assert events_of(cb, "tr-fresh") == events_of(ca, "tr-resume")


def test_resume_onto_a_live_fork_of_the_source_is_refused_without_a_delete_hint(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    """--resume onto a session that was not made by an import but holds the file's first events
    (a fork of the source) is refused SESSION_ALREADY_EXISTS, and the error does not call its
    events imported nor offer `sessionlog delete` for them (it did: an operator following it
    would have erased a live session); nothing changes."""
    a, _ = servers
    with Client(a.address) as client:
        client.append("tr-live", [event("user_message", {"content": f"l{n}"}) for n in range(9)])
        whole = tmp_path / "live.jsonl"
        assert cli(a, tmp_path, "export", "tr-live", "-o", str(whole)).returncode == 0
        client.fork_session("tr-live", at_seq=4, session_id="tr-live-fork")
        done = cli(a, tmp_path, "import", str(whole), "--resume", "--session-id", "tr-live-fork")
        assert done.returncode == 1
        assert "SESSION_ALREADY_EXISTS" in done.stderr
        assert "delete" not in done.stderr, done.stderr
        assert "are imported" not in done.stderr, done.stderr
        assert record_of(client, "tr-live-fork").event_count == 5


def test_the_python_clients_import_in_chunks(servers: tuple[RunningServer, ...]) -> None:
    """Sync and async import_session: numbered from first_seq, times kept, continued."""
    a, _ = servers
    when = "2024-05-01T12:00:00.123456Z"
    with Client(a.address) as client:
        first = [{"type": "user_message", "data": {"content": "one"}, "time": when}]
        with pytest.raises(errors.InvalidImport):  # a fork holds every event it copied
            client.import_session(
                "tr-py", first, parent_session_id="elsewhere", parent_event_count=3
            )
        reply = client.import_session(
            "tr-py",
            first,
            create_time=when,
            parent_session_id="elsewhere",
            parent_event_count=1,
        )
        assert (reply.imported_count, reply.session.event_count) == (1, 1)
        with pytest.raises(errors.ImportSeqMismatch) as caught:
            client.import_session("tr-py", [event("user_message", {"content": "x"})])
        assert caught.value.metadata["next_seq"] == "1"

    async def go_on() -> pb.ImportSessionResponse:
        async with AsyncClient(a.address) as aio:
            return await aio.import_session(
                "tr-py", [event("user_message", {"content": "two"}, time=when)], first_seq=1
            )

    reply = asyncio.run(asyncio.wait_for(go_on(), 30))
    assert reply.session.event_count == 2
    with Client(a.address) as client:
        stored = list(client.since("tr-py"))
        assert [e.seq for e in stored] == [0, 1]
        assert {e.time.ToJsonString() for e in stored} == {when}
        session = client.get_session("tr-py").session
        assert session.create_time.ToJsonString() == when
        assert session.parent_session_id == "elsewhere"
        assert session.parent_event_count == 1


WHEN = "2024-05-01T12:00:00Z"


def export_lines(session_id: str, count: int) -> list[str]:
    """The lines of an export of ``count`` user messages, as `sessionlog export` writes them."""
    record = {"session_id": session_id, "event_count": str(count), "create_time": WHEN}
    lines = [json.dumps({"sessionlog_export": 1, "session": record})]
    for seq in range(count):
        line = {"seq": str(seq), "type": "EVENT_TYPE_USER_MESSAGE", "time": WHEN}
        lines.append(json.dumps({**line, "data": {"content": f"m{seq}"}}))
    return lines


def event_line(seq: int, **fields: object) -> str:
    """An event line at ``seq``: a user message unless ``fields`` say otherwise."""
    line = {"seq": str(seq), "type": "EVENT_TYPE_USER_MESSAGE", "time": WHEN, "data": {}}
    return json.dumps({**line, **fields})


def import_here(address: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`sessionlog import ARGS --server ADDRESS` run in this process: exit code and stderr."""
    capsys.readouterr()
    try:
        code = main(["import", *args, "--server", address])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    return code, " ".join(capsys.readouterr().err.split())


TOO_BIG = {"content": "x" * (1 << 20)}
"""Data that makes an event larger than the server's default limit (1 MiB)."""


def replaced(seq: int, line: str) -> Callable[[list[str]], list[str]]:
    """A file's lines with the event at ``seq`` (line seq + 2; line 1 is the record) replaced."""
    return lambda lines: [*lines[: seq + 1], line, *lines[seq + 2 :]]


TURN_END_APPEND = event_line(550, type="EVENT_TYPE_TURN_END", surface_op={"append": {}})
FUTURE = event_line(550, surface_op={"replace": {"start_seq": "551", "stop_seq": "560"}})

NO_OBJECT = json.dumps({"sessionlog_export": 1, "session": 5})
DEEP = event_line(550).replace('"data": {}', '"data": ' + "[" * 100_000 + "]" * 100_000)

# (what is wrong, the file's lines made bad from a good file of 600 events, what stderr says);
# a chunk is 500 events.
BAD_FILES = [
    ("a bad line at 501", replaced(501, "{not json"), "line 503: not JSON"),
    ("a bad record line", lambda lines: ["{not json", *lines[1:]], "line 1: not JSON"),
    ("a bad first event", replaced(0, "[]"), "line 2: an event line"),
    ("a seq gap", lambda lines: [*lines[:551], *lines[552:]], "line 552: seq 551, but the"),
    ("an event too big", replaced(550, event_line(550, data=TOO_BIG)), "line 552: EVENT_TOO_LARGE"),
    ("a bad surface op", replaced(550, TURN_END_APPEND), "line 552: SURFACE_OP_ON_NON_SURFACE"),
    ("a replace of the future", replaced(550, FUTURE), "line 552: INVALID_SURFACE_OP"),
    ("a file cut short", lambda lines: lines[:551], "the file holds 550"),
    ("a record that is no object", lambda lines: [NO_OBJECT, *lines[1:]], "line 1: the session"),
    ("a line nested too deep", replaced(550, DEEP), "line 552: not JSON (nested too deeply"),
    ("more events than the record says", lambda lines: [*lines, event_line(600)], "line 602: the"),
]


@pytest.mark.parametrize(("name", "edit", "message"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_bad_file_imports_nothing(
    servers: tuple[RunningServer, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    edit: Callable[[list[str]], list[str]],
    message: str,
) -> None:
    """A file of 600 events with one fault anywhere (after the first chunk too) is refused whole
    before anything is written, exit 2 naming the line; the corrected file then imports."""
    _, b = servers
    session_id = "tr-whole-" + name.replace(" ", "-")
    good = export_lines(session_id, 600)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in edit(good)))
    code, err = import_here(b.address, capsys, str(path))
    assert code == 2, err
    assert message in err
    assert "nothing was imported" in err
    with Client(b.address) as cb:
        assert not cb.get_session(session_id).session.exists
        path.write_text("".join(line + "\n" for line in good))
        code, err = import_here(b.address, capsys, str(path))
        assert code == 0, err
        assert cb.get_session(session_id).session.event_count == 600
        assert [e.data["content"] for e in cb.since(session_id)] == [f"m{n}" for n in range(600)]


def test_a_file_that_is_not_utf8_is_refused_naming_its_line(
    servers: tuple[RunningServer, ...], tmp_path: Path
) -> None:
    """A byte that is not UTF-8 in an event after the first chunk, from a file or from stdin:
    exit 2 naming the line (not a traceback), nothing imported."""
    _, b = servers
    good = export_lines("tr-not-utf8", 600)
    lines = [line.encode() for line in good]
    lines[552] = lines[552].replace(b"m551", b"m\xff551")
    path = tmp_path / "not-utf8.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    from_file = cli(b, tmp_path, "import", str(path))
    from_stdin = subprocess.run(
        [str(SESSIONLOG), "import", "-", "--server", b.address],
        input=path.read_bytes(),
        capture_output=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    for code, err in (
        (from_file.returncode, from_file.stderr),
        (from_stdin.returncode, from_stdin.stderr.decode()),
    ):
        assert code == 2, err
        assert "line 553: not UTF-8" in err
        assert "Traceback" not in err
    with Client(b.address) as cb:
        assert not cb.get_session("tr-not-utf8").session.exists


def test_a_refusal_midway_says_what_was_imported_and_resume_finishes(
    small: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server with a smaller event limit than the CLI checks against refuses the second chunk:
    the error names the line, the 500 events imported and --resume; --max-event-size makes the
    CLI refuse that file before any write; the corrected file, resumed, completes the session."""
    lines = export_lines("tr-small", 600)
    big = {"content": "y" * (SMALL_EVENT + 1000)}
    path = tmp_path / "small.jsonl"
    path.write_text(
        "".join(x + "\n" for x in [*lines[:551], event_line(550, data=big), *lines[552:]])
    )
    code, err = import_here(small.address, capsys, str(path))
    assert code == 1, err
    assert "EVENT_TOO_LARGE: line 552" in err
    assert "500 of the file's 600 events" in err
    assert "--resume" in err
    code, err = import_here(small.address, capsys, str(path), "--max-event-size", "64KiB")
    assert code == 2, err
    assert "line 552: EVENT_TOO_LARGE" in err
    with Client(small.address) as client:
        assert client.get_session("tr-small").session.event_count == 500
        path.write_text("".join(x + "\n" for x in lines))
        code, err = import_here(small.address, capsys, str(path), "--resume")
        assert code == 0, err
        assert client.get_session("tr-small").session.event_count == 600
        assert [e.data["content"] for e in client.since("tr-small")] == [
            f"m{n}" for n in range(600)
        ]


def test_a_connection_lost_midway_says_what_may_be_imported_and_resume_finishes(
    servers: tuple[RunningServer, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The link to the server goes dead once the first chunk is stored: the import fails (exit
    3) saying at least that many events are in and naming --resume, which then completes it."""
    _, b = servers
    lines = export_lines("tr-lost", 6000)
    path = tmp_path / "lost.jsonl"
    path.write_text("".join(x + "\n" for x in lines))
    with Relay(b.port).start() as relay, Client(b.address) as client:

        def go_dead_after_the_first_chunk() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if client.get_session("tr-lost").session.event_count >= 500:
                    break
                time.sleep(0.005)
            relay.blackhole(True)

        watcher = threading.Thread(target=go_dead_after_the_first_chunk)
        watcher.start()
        try:
            code, err = import_here(relay.address, capsys, str(path), "--timeout", "2")
        finally:
            watcher.join(70)
        assert code == 3, err
        stored = client.get_session("tr-lost").session.event_count
        assert 500 <= stored < 6000
        assert "DEADLINE_EXCEEDED" in err
        assert "at least" in err
        assert "of the file's 6000 events" in err
        assert "--resume" in err
        code, err = import_here(b.address, capsys, str(path), "--resume")
        assert code == 0, err
        assert [e.data["content"] for e in client.since("tr-lost")] == [
            f"m{n}" for n in range(6000)
        ]
