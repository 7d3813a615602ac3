"""A first look: the server answers the four RPCs."""

from __future__ import annotations

import grpc
import pytest

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb


def test_append_then_derive(server: RunningServer) -> None:
    """An appended user message comes back as a derived message."""
    stub = server.stub()
    event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": "hi"})
    reply = stub.Append(pb.AppendRequest(session_id="s", events=[event]))
    assert reply.next_seq == 1
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="s"))
    assert [m.content for m in derived.messages] == ["hi"]
    assert list(derived.seqs) == [0]


def test_bad_session_id(server: RunningServer) -> None:
    """An invalid session id is INVALID_ARGUMENT with reason INVALID_SESSION_ID."""
    with pytest.raises(grpc.RpcError) as caught:
        server.stub().Surface(pb.SurfaceRequest(session_id="-bad"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_SESSION_ID"
