"""Small helpers shared by the end-to-end tests: building events, calling RPCs, checking errors."""

from __future__ import annotations

import queue
import subprocess
import threading
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from sessionlog.testing import error_info
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc

Stub = pb_grpc.SessionLogServiceStub
ET = event_pb2.EventType

SYSTEM = ET.EVENT_TYPE_SYSTEM_MESSAGE
USER = ET.EVENT_TYPE_USER_MESSAGE
ASSISTANT = ET.EVENT_TYPE_ASSISTANT_MESSAGE
TOOL_CALL = ET.EVENT_TYPE_TOOL_CALL
TOOL_RESULT = ET.EVENT_TYPE_TOOL_RESULT
TURN_START = ET.EVENT_TYPE_TURN_START
TURN_END = ET.EVENT_TYPE_TURN_END
STEP_START = ET.EVENT_TYPE_STEP_START
STEP_END = ET.EVENT_TYPE_STEP_END


# -- building events ----------------------------------------------------------------------------


def ev(type_: int = USER, **data: Any) -> event_pb2.Event:
    """An event of ``type_`` (any number, even unknown ones) whose data holds ``data``."""
    made = event_pb2.Event(type=type_)  # type: ignore[arg-type]  # unknown numbers on purpose
    made.data.update(data)
    return made


def say(content: str, type_: int = USER, **data: Any) -> event_pb2.Event:
    """A message event of ``type_`` (a user message by default) saying ``content``."""
    return ev(type_, content=content, **data)


def user(content: str = "hi", **extra: Any) -> event_pb2.Event:
    """A user message saying ``content`` ("hi" unless given), with ``extra`` data fields."""
    return say(content, **extra)


def replace(start: int, stop: int, content: str, type_: int = USER) -> event_pb2.Event:
    """A message saying ``content`` that replaces the surface positions [start, stop]."""
    made = say(content, type_)
    made.surface_op.replace.start_seq = start
    made.surface_op.replace.stop_seq = stop
    return made


def nested(levels: int) -> dict[str, Any]:
    """Data whose depth is ``levels`` (data itself is level 1)."""
    data: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        data = {"inner": data}
    return data


# -- calling the service ------------------------------------------------------------------------


def append(stub: Stub, session_id: str, *events: event_pb2.Event, **fields: Any) -> Any:
    """Append ``events`` to a session (extra AppendRequest ``fields`` allowed); the reply."""
    return stub.Append(pb.AppendRequest(session_id=session_id, events=events, **fields))


def log(stub: Stub, session_id: str) -> list[event_pb2.Event]:
    """Every stored event of a session, read with Since from seq 0."""
    request = pb.SinceRequest(session_id=session_id)
    return [e for r in stub.Since(request, timeout=30) for e in r.events]


def log_bytes(stub: Stub, session_id: str) -> list[bytes]:
    """Every stored event of a session, each as its serialized bytes."""
    return [e.SerializeToString() for e in log(stub, session_id)]


def get(stub: Stub, session_id: str) -> pb.Session:
    """The session as GetSession describes it."""
    session: pb.Session = stub.GetSession(pb.GetSessionRequest(session_id=session_id)).session
    return session


def stats(channel: grpc.Channel) -> apb.GetStatsResponse:
    """The store's counts as AdminService.GetStats reports them (sessions, events, the change
    feed's position): what a test reads to show that a refused call wrote nothing."""
    admin = apb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
    reply: apb.GetStatsResponse = admin.GetStats(apb.GetStatsRequest(), timeout=30)
    return reply


# -- expected errors ----------------------------------------------------------------------------


def failure(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    """The RpcError ``call(*args, **kwargs)`` raises; fails the test if it succeeds."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value


def check(error: grpc.RpcError, code: grpc.StatusCode, reason: str, **meta: object) -> None:
    """Assert the status code, the sessionlog ErrorInfo reason and the given metadata values."""
    assert error.code() == code, error
    info = error_info(error)
    assert (info.domain, info.reason) == ("sessionlog", reason), info
    for key, value in meta.items():
        assert info.metadata.get(key) == str(value), (key, dict(info.metadata))


# -- AppendStream -------------------------------------------------------------------------------


class StreamRefusal(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped
    """One AppendStream request's error in the shape of the RpcError a unary Append raises (its
    code, its message, the rich status with the ErrorInfo), so the same checks read both."""

    def __init__(self, error: pb.AppendStreamError) -> None:
        super().__init__(error.message)
        self.error = error
        info = error_details_pb2.ErrorInfo(
            reason=error.reason, domain="sessionlog", metadata=error.metadata
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        self._status = status_pb2.Status(code=error.code, message=error.message, details=[detail])

    def code(self) -> grpc.StatusCode:
        return next(c for c in grpc.StatusCode if c.value[0] == self.error.code)

    def details(self) -> str:
        return self.error.message

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return (("grpc-status-details-bin", self._status.SerializeToString()),)


def stream_appends(
    stub: Stub, requests: list[pb.AppendRequest], **call: Any
) -> list[pb.AppendStreamResponse]:
    """Send ``requests`` on one AppendStream (correlation ids 1, 2, ...) and read every reply."""
    sent = (
        pb.AppendStreamRequest(correlation_id=number, append=request)
        for number, request in enumerate(requests, 1)
    )
    return list(stub.AppendStream(sent, timeout=call.pop("timeout", 30), **call))


def result(reply: pb.AppendStreamResponse) -> pb.AppendResponse:
    """An AppendStream reply's AppendResponse, or its error raised as a StreamRefusal."""
    if reply.HasField("error"):
        raise StreamRefusal(reply.error)
    assert reply.HasField("append"), reply
    return reply.append


class StreamingStub:
    """A SessionLogService stub whose Append goes over AppendStream (one request per stream),
    raising a request's error as unary Append would: a suite written for Append runs over the
    stream unchanged. Every other method is the stub's own."""

    def __init__(self, stub: Stub) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def Append(self, request: pb.AppendRequest, **call: Any) -> pb.AppendResponse:
        (reply,) = stream_appends(self._stub, [request], **call)
        assert reply.correlation_id == 1
        return result(reply)


def stdout_lines(process: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """The lines ``process`` prints on stdout, read by a thread as they come."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader
