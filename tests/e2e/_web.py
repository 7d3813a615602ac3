"""A seeded session for the web console tests, and plain HTTP helpers for its API.

The session covers what the console must show: every role, an assistant tool call answered by a
tool result, a bookkeeping event, and a summary that replaces seqs 1..2 (so 1 and 2 are shadowed).
A second one holds SPEC §4's overlapping replaces, where position and seq part ways.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc

TIMEOUT = 5.0
SESSION = "demo.weather"
OVERLAP = "demo.overlap"
CALL_ID = "call_oslo_1"
RESULT = "12°C and light rain"


def event(kind: int, **data: Any) -> event_pb2.Event:
    message = event_pb2.Event(type=kind)  # type: ignore[arg-type]
    message.data.update(data)
    return message


def _append(
    stub: pb_grpc.SessionLogServiceStub, session_id: str, events: list[event_pb2.Event], token: str
) -> None:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    request = pb.AppendRequest(session_id=session_id, events=events)
    stub.Append(request, metadata=metadata, timeout=TIMEOUT)


def seed(stub: pb_grpc.SessionLogServiceStub, session_id: str = SESSION, token: str = "") -> None:
    """Nine events, appended over gRPC (with ``token`` when given): 0 system, 1 user,
    2 assistant, 3 user, 4 assistant calling a tool, 5 tool_call (bookkeeping), 6 its tool
    result, 7 assistant, 8 a summary replacing 1..2."""
    call = {
        "id": CALL_ID,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    summary = event(event_pb2.EVENT_TYPE_SYSTEM_MESSAGE, content="[summary] The user said hello.")
    summary.surface_op.replace.start_seq = 1
    summary.surface_op.replace.stop_seq = 2
    _append(
        stub,
        session_id,
        [
            event(event_pb2.EVENT_TYPE_SYSTEM_MESSAGE, content="You are a terse weather bot."),
            event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="Hello there!"),
            event(event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE, content="Hi. Ask me about weather."),
            event(event_pb2.EVENT_TYPE_USER_MESSAGE, content="What is it like in Oslo?"),
            event(event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE, content="", tool_calls=[call]),
            event(event_pb2.EVENT_TYPE_TOOL_CALL, name="get_weather", city="Oslo"),
            event(event_pb2.EVENT_TYPE_TOOL_RESULT, tool_call_id=CALL_ID, content=RESULT),
            event(event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE, content="Oslo: 12°C, light rain."),
            summary,
        ],
        token,
    )


def seed_overlap(stub: pb_grpc.SessionLogServiceStub, session_id: str = OVERLAP) -> None:
    """SPEC §4's last worked example: 0 a, 1 b, 2 c, 3 S replacing 0..2, 4 X replacing 0..0.
    X stands at position 0, inside S's range, but was appended after S, so S does not hide it;
    X hides S (whose position is 0) and a."""
    replaces = [
        event(event_pb2.EVENT_TYPE_SYSTEM_MESSAGE, content="S: the user said a, b, c"),
        event(event_pb2.EVENT_TYPE_SYSTEM_MESSAGE, content="X: everything so far"),
    ]
    for summary, (start, stop) in zip(replaces, [(0, 2), (0, 0)], strict=True):
        summary.surface_op.replace.start_seq = start
        summary.surface_op.replace.stop_seq = stop
    plain = [event(event_pb2.EVENT_TYPE_USER_MESSAGE, content=c) for c in "abc"]
    _append(stub, session_id, [*plain, *replaces], "")


def get(url: str, token: str = "") -> tuple[int, dict[str, str], Any]:
    """GET ``url``: (status, headers, parsed JSON body or text)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            status, head, body = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, head, body = error.code, dict(error.headers), error.read()
    if head.get("Content-Type", "").startswith("application/json"):
        return status, head, json.loads(body)
    return status, head, body.decode()
