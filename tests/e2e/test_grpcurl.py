"""grpcurl against a real server, with no proto files: reflection, health, JSON calls, errors.

These are the command lines the docs show (grpcurl page); each test runs the real grpcurl binary.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from sessionlog.testing import RunningServer
from tests.e2e._proc import GRPCURL

SERVICE = "sessionlog.v1.SessionLogService"

WORKED_EXAMPLE = [
    {"type": "EVENT_TYPE_SYSTEM_MESSAGE", "data": {"content": "sys"}},
    {"type": "EVENT_TYPE_USER_MESSAGE", "data": {"content": "a"}},
    {"type": "EVENT_TYPE_ASSISTANT_MESSAGE", "data": {"content": "b"}},
    {"type": "EVENT_TYPE_USER_MESSAGE", "data": {"content": "c"}},
]
SUMMARY = {
    "type": "EVENT_TYPE_ASSISTANT_MESSAGE",
    "data": {"content": "[summary]"},
    "surface_op": {"replace": {"start_seq": 1, "stop_seq": 2}},
}


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GRPCURL), *args], capture_output=True, text=True, timeout=30, check=False
    )


def json_documents(text: str) -> list[dict[str, Any]]:
    """The JSON objects grpcurl printed one after another (one per response)."""
    decoder = json.JSONDecoder()
    documents: list[dict[str, Any]] = []
    position = 0
    for _ in range(10_000):
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return documents
        document, position = decoder.raw_decode(text, position)
        documents.append(document)
    raise AssertionError("too many JSON documents")


def call(server: RunningServer, method: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """`grpcurl -plaintext -d BODY ADDR METHOD`; the responses as JSON."""
    result = grpcurl("-plaintext", "-d", json.dumps(body), server.address, method)
    assert result.returncode == 0, result.stderr
    return json_documents(result.stdout)


def append_worked_example(server: RunningServer, session_id: str) -> None:
    """SPEC §4: sys, a, b, c, then "[summary]" replace(1, 2), in two Appends."""
    [first] = call(
        server, f"{SERVICE}/Append", {"session_id": session_id, "events": WORKED_EXAMPLE}
    )
    assert first["next_seq"] == "4"  # proto3 JSON writes uint64 as a string
    [second] = call(
        server,
        f"{SERVICE}/Append",
        {"session_id": session_id, "expected_seq": 4, "events": [SUMMARY]},
    )
    assert second["next_seq"] == "5"
    assert second["events"][0]["seq"] == "4"


def test_list_shows_the_services(server: RunningServer) -> None:
    """`grpcurl -plaintext ADDR list` names the sessionlog service and the health service."""
    result = grpcurl("-plaintext", server.address, "list")
    assert result.returncode == 0, result.stderr
    services = result.stdout.split()
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services


def test_describe_event(server: RunningServer) -> None:
    """`grpcurl describe sessionlog.v1.Event` prints the Event message from reflection."""
    result = grpcurl("-plaintext", server.address, "describe", "sessionlog.v1.Event")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "message Event {" in text
    for field in (
        "uint64 seq = 1;",
        ".sessionlog.v1.EventType type = 2;",
        ".google.protobuf.Timestamp time = 3;",
        ".google.protobuf.Struct data = 4;",
        ".sessionlog.v1.SurfaceOp surface_op = 5;",
    ):
        assert field in text


def test_worked_example_derives_summary(server: RunningServer) -> None:
    """The SPEC §4 example appended via grpcurl derives ["sys", "[summary]", "c"]."""
    append_worked_example(server, "demo")
    [reply] = call(server, f"{SERVICE}/DeriveMessages", {"session_id": "demo"})
    assert [m.get("content") for m in reply["messages"]] == ["sys", "[summary]", "c"]
    assert [m["role"] for m in reply["messages"]] == ["ROLE_SYSTEM", "ROLE_ASSISTANT", "ROLE_USER"]
    assert reply["seqs"] == ["0", "4", "3"]
    assert reply["event_count"] == "5"


def test_since_prints_every_event(server: RunningServer) -> None:
    """Since without follow through grpcurl prints all 5 events of the worked example."""
    append_worked_example(server, "demo")
    responses = call(server, f"{SERVICE}/Since", {"session_id": "demo"})
    events = [event for response in responses for event in response.get("events", [])]
    assert [int(e.get("seq", "0")) for e in events] == [0, 1, 2, 3, 4]  # seq 0 is omitted
    assert [e["data"]["content"] for e in events] == ["sys", "a", "b", "c", "[summary]"]
    assert events[4]["surface_op"] == {"replace": {"start_seq": "1", "stop_seq": "2"}}


def test_follow_prints_stored_then_caught_up(server: RunningServer) -> None:
    """Since with follow via grpcurl prints the events, then caught_up, until -max-time ends it."""
    append_worked_example(server, "demo")
    body = json.dumps({"session_id": "demo", "seq": 3, "follow": True})
    result = grpcurl("-plaintext", "-max-time", "1", "-d", body, server.address, f"{SERVICE}/Since")
    assert "DeadlineExceeded" in result.stderr  # follow never ends by itself
    responses = json_documents(result.stdout)
    events = [event for response in responses for event in response.get("events", [])]
    assert [e["seq"] for e in events] == ["3", "4"]
    assert {"caught_up": True, "next_seq": "5"} in responses


def test_health_check_serving(server: RunningServer) -> None:
    """`grpcurl ... grpc.health.v1.Health/Check` answers SERVING, overall and for the service."""
    result = grpcurl("-plaintext", server.address, "grpc.health.v1.Health/Check")
    assert result.returncode == 0, result.stderr
    assert json_documents(result.stdout) == [{"status": "SERVING"}]
    [named] = call(server, "grpc.health.v1.Health/Check", {"service": SERVICE})
    assert named == {"status": "SERVING"}


def test_error_shows_errorinfo_reason(server: RunningServer) -> None:
    """A failed call through grpcurl prints the status code and the ErrorInfo reason."""
    body = json.dumps({"session_id": "-bad", "events": WORKED_EXAMPLE})
    result = grpcurl("-plaintext", "-d", body, server.address, f"{SERVICE}/Append")
    assert result.returncode != 0
    assert "InvalidArgument" in result.stderr
    assert "type.googleapis.com/google.rpc.ErrorInfo" in result.stderr
    assert '"reason":"INVALID_SESSION_ID"' in result.stderr
    assert '"domain":"sessionlog"' in result.stderr
    assert "-bad" not in result.stderr  # the offending id is never echoed


def test_error_as_json_with_format_error(server: RunningServer) -> None:
    """With -format-error grpcurl prints the status as JSON; its detail is the ErrorInfo."""
    body = json.dumps({"session_id": "demo", "expected_seq": 7, "events": WORKED_EXAMPLE})
    result = grpcurl("-plaintext", "-format-error", "-d", body, server.address, f"{SERVICE}/Append")
    assert result.returncode != 0
    [status] = json_documents(result.stderr)  # grpcurl prints errors on stderr
    assert status["code"] == 10  # ABORTED
    [detail] = status["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert detail["reason"] == "SEQ_CONFLICT"
    assert detail["domain"] == "sessionlog"
