"""The web console's JSON API over HTTP: what it returns for a seeded session, the live follow
stream, the same bearer tokens and session prefixes as gRPC, and clean failures to bind."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionlog import testing
from sessionlog.server import BindError
from sessionlog.storage.store import Store
from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import running_server
from tests.e2e._web import CALL_ID, RESULT, SESSION, TIMEOUT, event, get, seed

READER = "api-reader-token-3b9e07c1"
WRITER_ONLY = "api-writer-token-7f0d2a95"
OTHER_TENANT = "api-tenant-b-token-c4e81d26"
OPERATOR = "api-operator-token-90e2d4b1"


@pytest.fixture
def console(tmp_path: Path) -> Iterator[RunningServer]:
    """A server with the web console and metrics on one free port, the demo session seeded."""
    with running_server(tmp_path / "data", http_listen="127.0.0.1:0") as server:
        seed(server.stub())
        yield server


def base(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.http_port}"


def test_events_mark_shadowed_bookkeeping_and_replace_ranges(console: RunningServer) -> None:
    """/events returns the stored events with their type names and data, each surface event
    marked shadowed or not, and the replace's range."""
    status, _, body = get(f"{base(console)}/api/sessions/{SESSION}/events")
    assert status == 200
    events = body["events"]
    assert [e["seq"] for e in events] == list(range(9))
    assert body["next_seq"] == 9
    assert [e["seq"] for e in events if e["shadowed"]] == [1, 2]
    assert [e["seq"] for e in events if not e["surface"]] == [5]
    assert events[8]["replace"] == [1, 2]
    assert events[6]["type"] == "tool_result"
    assert events[6]["data"] == {"tool_call_id": CALL_ID, "content": RESULT}
    status, _, page = get(f"{base(console)}/api/sessions/{SESSION}/events?from=7&limit=1")
    assert [e["seq"] for e in page["events"]] == [7]


def test_a_session_and_the_list_carry_usage(console: RunningServer) -> None:
    """/api/sessions/{id} and /api/sessions give each session's usage totals per model."""
    spent = event(event_pb2.EVENT_TYPE_STEP_END)
    spent.usage.CopyFrom(event_pb2.Usage(model="m", input_tokens=30, cached_input_tokens=10))
    console.stub().Append(pb.AppendRequest(session_id="spender", events=[spent, spent]))
    status, _, body = get(f"{base(console)}/api/sessions/spender")
    assert status == 200
    assert body["usage"] == [
        {
            "model": "m",
            "input_tokens": 60,
            "output_tokens": 0,
            "cached_input_tokens": 20,
            "reasoning_tokens": 0,
            "event_count": 2,
        }
    ]
    _, _, listing = get(f"{base(console)}/api/sessions?prefix=spender")
    assert [s["usage"][0]["input_tokens"] for s in listing["sessions"]] == [60]


def test_transcript_pairs_tool_calls_with_results(console: RunningServer) -> None:
    """/transcript is the derived messages in surface order with roles; the assistant's tool
    call points at the tool result that answers it, and the result back at the call."""
    status, _, body = get(f"{base(console)}/api/sessions/{SESSION}/transcript")
    assert status == 200
    messages = body["messages"]
    assert [(m["seq"], m["role"]) for m in messages] == [
        (0, "system"),
        (8, "system"),
        (3, "user"),
        (4, "assistant"),
        (6, "tool"),
        (7, "assistant"),
    ]
    assert messages[1]["replace"] == [1, 2]
    (call,) = messages[3]["tool_calls"]
    assert call == {
        "id": CALL_ID,
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "result": 4,
    }
    assert messages[4]["answers"] == [3, 0]
    assert messages[4]["content"] == RESULT


def test_state_is_getstate_as_json_and_events_carry_their_deltas(console: RunningServer) -> None:
    """/state is the folded state with the event count (a session never written: {} and 0);
    /events gives each event's state_delta, null when it has none."""
    first = event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="hi")
    first.state_delta.update({"user": "ann", "n": 1})
    last = event(event_pb2.EVENT_TYPE_TURN_START)
    last.state_delta.update({"n": None, "step": 2})
    plain = event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="no delta")
    request = pb.AppendRequest(session_id="demo.state", events=[first, plain, last])
    console.stub().Append(request, timeout=TIMEOUT)
    status, _, body = get(f"{base(console)}/api/sessions/demo.state/state")
    assert status == 200
    assert body == {
        "session_id": "demo.state",
        "event_count": 3,
        "state": {"user": "ann", "step": 2},
    }
    _, _, events = get(f"{base(console)}/api/sessions/demo.state/events")
    assert [e["state_delta"] for e in events["events"]] == [
        {"user": "ann", "n": 1},
        None,
        {"n": None, "step": 2},
    ]
    _, _, empty = get(f"{base(console)}/api/sessions/demo.never/state")
    assert (empty["state"], empty["event_count"]) == ({}, 0)


def test_sessions_status_and_metrics_on_the_console_port(tmp_path: Path) -> None:
    """The session list has counts and times, /api/status the store's numbers, and with
    --metrics-listen equal to --http-listen the same port also serves /metrics."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    with running_server(tmp_path / "data", http_listen=address, metrics_listen=address) as server:
        stub = server.stub()
        seed(stub)
        seed(stub, "demo.second")
        status, _, listing = get(f"http://{address}/api/sessions?prefix=demo.&limit=1")
        assert status == 200
        assert [s["session_id"] for s in listing["sessions"]] == ["demo.second"]
        assert listing["more"] is True
        assert listing["sessions"][0]["event_count"] == 9
        assert listing["sessions"][0]["last_append_time_ms"] > 0
        _, _, numbers = get(f"http://{address}/api/status")
        assert numbers["sessions"] == 2
        assert numbers["events"] == 18
        assert numbers["role"] == "primary"
        assert 0 < numbers["used_bytes"] < numbers["map_size"]
        status, head, metrics = get(f"http://{address}/metrics")
        assert status == 200
        assert head["Content-Type"].startswith("text/plain")
        assert "sessionlog_stored_events 18.0" in metrics
        assert server.metrics_port == server.http_port == port


def test_follow_streams_stored_then_live_events(console: RunningServer) -> None:
    """/follow sends the events from ``from``, one caught_up, then an append as it commits."""
    connection = http.client.HTTPConnection("127.0.0.1", console.http_port, timeout=TIMEOUT)
    try:
        connection.request("GET", f"/api/sessions/{SESSION}/follow?from=7")
        response = connection.getresponse()
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first = _frame(response)
        assert first[0] == "events"
        assert [e["seq"] for e in first[1]["events"]] == [7, 8]
        assert _frame(response) == ("caught_up", {"next_seq": 9})
        console.stub().Append(
            pb.AppendRequest(
                session_id=SESSION,
                events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="live one")],
            ),
            timeout=TIMEOUT,
        )
        kind, body = _frame(response)
        assert kind == "events"
        assert [(e["seq"], e["data"]["content"]) for e in body["events"]] == [(9, "live one")]
        # Over several workers the status may be answered by another worker than the stream's,
        # which sees the stream once its worker has published its count.
        deadline = time.monotonic() + 30.0
        while get(f"{base(console)}/api/status")[2]["open_streams"] != 1:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert get(f"{base(console)}/api/status")[2]["open_streams"] == 1
    finally:
        connection.close()


def test_follow_ends_at_shutdown_with_the_seq_to_resume_from(tmp_path: Path) -> None:
    """/follow runs Since's loop: a server stopping ends it with UNAVAILABLE and the seq."""
    with running_server(tmp_path / "data", http_listen="127.0.0.1:0") as server:
        seed(server.stub())
        stopper = threading.Thread(target=server.stop)
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=TIMEOUT)
        try:
            connection.request("GET", f"/api/sessions/{SESSION}/follow?from=7")
            response = connection.getresponse()
            assert _frame(response)[0] == "events"
            assert _frame(response) == ("caught_up", {"next_seq": 9})
            stopper.start()
            kind, body = _frame(response)
            assert kind == "error"
            assert body["reason"] == "UNAVAILABLE"
            assert "resume session 'demo.weather' from 9" in body["message"]
        finally:
            connection.close()
            if stopper.ident is not None:
                stopper.join(TIMEOUT)


def test_follow_is_paced_like_since(tmp_path: Path) -> None:
    """Once caught up, /follow holds a commit until its turn (--follow-send-rate): two appends
    made within one pace interval reach the page as one batch."""
    with running_server(tmp_path / "data", http_listen="127.0.0.1:0", follow_send_rate=1) as server:
        seed(server.stub())
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=TIMEOUT)
        try:
            connection.request("GET", f"/api/sessions/{SESSION}/follow?from=9")
            response = connection.getresponse()
            assert _frame(response) == ("caught_up", {"next_seq": 9})
            stub = server.stub()
            for content in ("first", "second", "third"):
                stub.Append(
                    pb.AppendRequest(
                        session_id=SESSION,
                        events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, content=content)],
                    ),
                    timeout=TIMEOUT,
                )
            batches = [_frame(response), _frame(response)]
            assert [kind for kind, _ in batches] == ["events", "events"]
            seqs = [[e["seq"] for e in body["events"]] for _, body in batches]
            assert seqs == [[9], [10, 11]]
        finally:
            connection.close()


def _frame(response: http.client.HTTPResponse) -> tuple[str, Any]:
    """The next server-sent event: (its event name, its JSON data); heartbeats skipped."""
    kind, data = "", ""
    for _ in range(1000):
        line = response.readline().decode()
        assert line, "the stream ended"
        if line.startswith("event: "):
            kind = line[len("event: ") :].strip()
        elif line.startswith("data: "):
            data += line[len("data: ") :].strip()
        elif line == "\n" and data:
            return kind, json.loads(data)
    raise AssertionError("no complete frame in 1000 lines")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[RunningServer]:
    """Auth on: a reader limited to ``demo.``, a writer without read, another tenant, and an
    operator who reads every session."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[token]]\nname = "reader"\ntoken = "{READER}"\npermissions = ["read"]\n'
        'session_prefix = "demo."\n\n'
        f'[[token]]\nname = "writer"\ntoken = "{WRITER_ONLY}"\npermissions = ["write"]\n\n'
        f'[[token]]\nname = "tenant-b"\ntoken = "{OTHER_TENANT}"\npermissions = ["read"]\n'
        'session_prefix = "b."\n\n'
        f'[[token]]\nname = "operator"\ntoken = "{OPERATOR}"\npermissions = ["read"]\n'
    )
    with running_server(
        tmp_path / "data", http_listen="127.0.0.1:0", auth_tokens=str(tokens)
    ) as server:
        stub = server.stub()
        seed(stub, token=WRITER_ONLY)
        seed(stub, "b.private", token=WRITER_ONLY)
        yield server


def test_api_needs_a_valid_token_when_auth_is_on(guarded: RunningServer) -> None:
    """Every /api call without a token, or with an unknown one, is 401 UNAUTHENTICATED with a
    Bearer challenge; the page itself loads without one (it asks for the token), and so do
    the health checks /healthz and /primary."""
    for path in ("/api/status", "/api/sessions", f"/api/sessions/{SESSION}/events"):
        for token in ("", "not-a-configured-token"):
            status, head, body = get(base(guarded) + path, token)
            assert status == 401, path
            assert body["reason"] == "UNAUTHENTICATED"
            assert head["WWW-Authenticate"] == "Bearer"
    status, _, page = get(base(guarded) + "/")
    assert status == 200
    assert "token" in page
    for path in ("/healthz", "/primary"):  # a proxy's health checks: no token, no data
        status, _, body = get(base(guarded) + path)
        assert (status, body["role"], body["serving"], body["takes_writes"]) == (
            200,
            "primary",
            True,
            True,
        ), path
    status, _, body = get(f"{base(guarded)}/api/sessions/{SESSION}/transcript", READER)
    assert status == 200
    assert len(body["messages"]) == 6


def test_api_applies_permissions_and_session_prefixes(guarded: RunningServer) -> None:
    """A token without read is 403; a token used outside its prefix is 403 on that session,
    and its listing holds only its own sessions, as over gRPC."""
    status, _, body = get(f"{base(guarded)}/api/sessions/{SESSION}/events", WRITER_ONLY)
    assert status == 403
    assert body["reason"] == "PERMISSION_DENIED"
    for path in ("events", "transcript", "follow", "state"):
        status, _, body = get(f"{base(guarded)}/api/sessions/b.private/{path}", READER)
        assert status == 403, path
        assert body["reason"] == "PERMISSION_DENIED"
    _, _, mine = get(f"{base(guarded)}/api/sessions", READER)
    assert [s["session_id"] for s in mine["sessions"]] == [SESSION]
    _, _, theirs = get(f"{base(guarded)}/api/sessions", OTHER_TENANT)
    assert [s["session_id"] for s in theirs["sessions"]] == ["b.private"]


def test_a_tenant_token_sees_no_server_wide_status(guarded: RunningServer) -> None:
    """/api/status counts every tenant's sessions and events: a prefix-scoped token gets only
    the version, the role and its own prefix; an unscoped reader gets the numbers."""
    status, _, mine = get(f"{base(guarded)}/api/status", READER)
    assert status == 200
    assert mine == {"version": mine["version"], "role": "primary", "session_prefix": "demo."}
    status, _, everything = get(f"{base(guarded)}/api/status", OPERATOR)
    assert status == 200
    assert everything["sessions"] == 2
    assert everything["events"] == 18
    assert "session_prefix" not in everything


@pytest.mark.parametrize(
    "value",
    [b"Bearer \xff\xfe", b"Bearer \xed\xa0\x80", b"Bearer " + OPERATOR.encode() + b"\xff"],
    ids=["not-utf8", "lone-surrogate", "secret-plus-a-stray-byte"],
)
def test_an_undecodable_bearer_token_is_a_401(guarded: RunningServer, value: bytes) -> None:
    """An Authorization header whose bytes are not UTF-8 is 401 UNAUTHENTICATED, not a 500,
    and the console keeps answering."""
    connection = http.client.HTTPConnection("127.0.0.1", guarded.http_port, timeout=5)
    try:
        connection.putrequest("GET", "/api/sessions")
        connection.putheader("Authorization", value)
        connection.endheaders()
        response = connection.getresponse()
        body = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 401
    assert body["reason"] == "UNAUTHENTICATED"
    status, _, listing = get(f"{base(guarded)}/api/sessions", OPERATOR)
    assert status == 200
    assert len(listing["sessions"]) == 2


def test_bad_requests_are_json_errors(console: RunningServer) -> None:
    """A malformed session id or page bound is a 400 with the SPEC reason, not a stack trace."""
    status, _, body = get(f"{base(console)}/api/sessions/{'x' * 300}/events")
    assert status == 400
    assert body["reason"] == "INVALID_SESSION_ID"
    status, _, body = get(f"{base(console)}/api/sessions/{SESSION}/events?limit=zero")
    assert status == 400
    assert body["reason"] == "MALFORMED_REQUEST"


@pytest.mark.in_process
def test_busy_http_address_fails_start_and_releases_the_store(tmp_path: Path) -> None:
    """A console address already in use stops the start with a BindError naming the flag, and
    leaves the data folder closed so it can be opened again at once."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        with (
            pytest.raises(BindError, match="--http-listen"),
            testing.running_server(tmp_path / "data", http_listen=address),
        ):
            pass
    Store(tmp_path / "data").close()


def test_whole_numbers_in_event_data_are_integers(console: RunningServer) -> None:
    """An event's data {"tokens": 1834, "ratio": 0.5} comes back with 1834 an integer (not
    1834.0) in /events; fractions stay fractions."""
    data = {"content": "n", "tokens": 1834, "ratio": 0.5, "nested": [{"x": 1}]}
    user = event_pb2.EVENT_TYPE_USER_MESSAGE
    console.stub().Append(pb.AppendRequest(session_id="numbers", events=[event(user, **data)]))
    _, _, body = get(f"{base(console)}/api/sessions/numbers/events")
    stored = body["events"][0]["data"]
    assert stored == data
    assert isinstance(stored["tokens"], int)
    assert isinstance(stored["nested"][0]["x"], int)
