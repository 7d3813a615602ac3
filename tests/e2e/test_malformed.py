"""Requests that fail to decode: INVALID_ARGUMENT / MALFORMED_REQUEST, never INTERNAL, no change.

The bytes are built by hand (protobuf's own runtime refuses to build most of them) and sent
through a channel with no serializer, so the server sees exactly these bytes.

The tests share one server: each compares what it reads after its call with what it read just
before (``seeded``, ``assert_still_serving``), and the sessions only one test writes ("fresh",
"shallow", "raw") are written by that test alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.wire import varint
from tests.e2e._helpers import get
from tests.e2e._proc import running_server

SERVICE = "/sessionlog.v1.SessionLogService/"
UNARY_RPCS = ("Append", "Surface", "DeriveMessages")
ALL_RPCS = ("Append", "Since", "Surface", "DeriveMessages")


# -- protobuf wire format by hand ---------------------------------------------------------------


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes or message)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def struct_entry(key: bytes, value: bytes) -> bytes:
    """One ``map<string, Value> fields = 1`` entry of a google.protobuf.Struct."""
    return field_bytes(1, field_bytes(1, key) + field_bytes(2, value))


def deep_struct(levels: int) -> bytes:
    """A Struct nested ``levels`` deep: {"inner": {"inner": ... {"leaf": "x"}}}."""
    struct = struct_entry(b"leaf", field_bytes(3, b"x"))  # Value.string_value = 3
    for _ in range(levels - 1):
        struct = struct_entry(b"inner", field_bytes(5, struct))  # Value.struct_value = 5
    return struct


def user_event(data: bytes) -> bytes:
    """An Event (type USER_MESSAGE = field 2, data = field 4) with the given Struct bytes."""
    return field_varint(2, event_pb2.EVENT_TYPE_USER_MESSAGE) + field_bytes(4, data)


def append_request(session_id: bytes, *events: bytes, lenient: bool = False) -> bytes:
    body = field_bytes(1, session_id) + b"".join(field_bytes(2, e) for e in events)
    return body + (field_varint(6, 1) if lenient else b"")


GOOD_EVENT = user_event(struct_entry(b"content", field_bytes(3, b"ok")))
BAD_UTF8 = b"\xff\xfe"


# -- calling with raw bytes ---------------------------------------------------------------------


def raw_call(server: RunningServer, rpc: str, request: bytes) -> list[bytes]:
    """Send ``request`` as is; return the raw response(s)."""
    channel = server.channel()
    if rpc == "Since":
        stream = channel.unary_stream(
            SERVICE + rpc, request_serializer=None, response_deserializer=None
        )
        responses: Iterator[bytes] = stream(request, timeout=10)
        return list(responses)
    unary = channel.unary_unary(SERVICE + rpc, request_serializer=None, response_deserializer=None)
    return [unary(request, timeout=10)]


def assert_malformed(server: RunningServer, rpc: str, request: bytes) -> None:
    """The call fails with INVALID_ARGUMENT / MALFORMED_REQUEST and a sentence of advice."""
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(server, rpc, request)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    info = error_info(error)
    assert info.domain == "sessionlog"
    assert info.reason == "MALFORMED_REQUEST"
    assert len(error.details().split()) >= 5


def history(server: RunningServer, session_id: str) -> tuple[bytes, ...]:
    """The session's log, surface and messages as raw bytes."""
    stub = server.stub()
    log = b"".join(
        e.SerializeToString()
        for response in stub.Since(pb.SinceRequest(session_id=session_id))
        for e in response.events
    )
    surface = stub.Surface(pb.SurfaceRequest(session_id=session_id)).SerializeToString()
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))
    return log, surface, derived.SerializeToString()


def assert_still_serving(server: RunningServer, session_id: str = "after") -> None:
    """A normal Append right after still works and lands at the next seq."""
    stub = server.stub()
    count = sum(len(r.events) for r in stub.Since(pb.SinceRequest(session_id=session_id)))
    event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": "still here"})
    reply = stub.Append(pb.AppendRequest(session_id=session_id, events=[event]))
    assert [e.seq for e in reply.events] == [count]
    assert reply.next_seq == count + 1
    assert reply.events[0].data["content"] == "still here"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module (see the module's docstring)."""
    data: Path = tmp_path_factory.mktemp("malformed") / "data"
    with running_server(data) as running:
        yield running


@pytest.fixture
def seeded(server: RunningServer) -> tuple[bytes, ...]:
    """Session "s" with one more event, and its history before this test's malformed calls."""
    raw_call(server, "Append", append_request(b"s", GOOD_EVENT))
    return history(server, "s")


# -- garbage ------------------------------------------------------------------------------------

GARBAGE = [
    pytest.param(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", id="endless-varint"),
    pytest.param(b"\x0a\x40abc", id="length-past-end"),
    pytest.param(b"\x0c", id="stray-end-group"),
    pytest.param(b"\x07\x00", id="wire-type-7"),
    pytest.param(b"\x00\x01", id="field-0"),
    pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="http"),
]


@pytest.mark.parametrize("rpc", ALL_RPCS)
@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_bytes(
    server: RunningServer, seeded: tuple[bytes, ...], rpc: str, garbage: bytes
) -> None:
    """Bytes that are no protobuf message at all are MALFORMED_REQUEST on every RPC."""
    assert_malformed(server, rpc, garbage)
    assert history(server, "s") == seeded
    assert_still_serving(server)


def test_truncated_append_request(server: RunningServer, seeded: tuple[bytes, ...]) -> None:
    """A valid AppendRequest cut short is MALFORMED_REQUEST and writes nothing."""
    whole = append_request(b"s", GOOD_EVENT, GOOD_EVENT)
    for cut in (1, 5, len(whole) // 2, len(whole) - 1):
        assert_malformed(server, "Append", whole[:cut])
    assert history(server, "s") == seeded
    assert_still_serving(server)


# -- nesting past the protobuf runtime's limit --------------------------------------------------


@pytest.mark.parametrize("levels", [40, 200])
@pytest.mark.parametrize("lenient", [False, True])
def test_deep_struct(
    server: RunningServer, seeded: tuple[bytes, ...], levels: int, lenient: bool
) -> None:
    """Data nested too deep to decode fails the whole request, lenient or not, never INTERNAL."""
    request = append_request(b"s", GOOD_EVENT, user_event(deep_struct(levels)), lenient=lenient)
    assert_malformed(server, "Append", request)
    assert history(server, "s") == seeded
    assert_still_serving(server)


def test_deep_struct_on_a_new_session_creates_nothing(server: RunningServer) -> None:
    """A first append that cannot be decoded creates no session."""
    assert_malformed(server, "Append", append_request(b"fresh", user_event(deep_struct(40))))
    assert not get(server.stub(), "fresh").exists
    reply = server.stub().Append(
        pb.AppendRequest(
            session_id="fresh", events=[event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)]
        )
    )
    assert [e.seq for e in reply.events] == [0]


def test_hand_built_bytes_decode_when_shallow(server: RunningServer) -> None:
    """The hand encoder is right: the same request 20 levels deep is accepted as data."""
    raw_call(server, "Append", append_request(b"shallow", user_event(deep_struct(20))))
    stored = server.stub().Since(pb.SinceRequest(session_id="shallow"))
    data = next(iter(stored)).events[0].data
    for _ in range(19):
        data = data["inner"]
    assert data["leaf"] == "x"


@pytest.mark.parametrize("levels", [25, 30])
def test_decodable_but_too_deep_is_unserializable(server: RunningServer, levels: int) -> None:
    """Past 24 levels but still decodable: UNSERIALIZABLE_EVENT_DATA (rule 4), not MALFORMED."""
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(server, "Append", append_request(b"s", user_event(deep_struct(levels))))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "UNSERIALIZABLE_EVENT_DATA"


# -- invalid UTF-8 ------------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", ALL_RPCS)
def test_invalid_utf8_session_id(server: RunningServer, rpc: str) -> None:
    """A session_id that is not UTF-8 is MALFORMED_REQUEST on every RPC."""
    request = field_bytes(1, BAD_UTF8)
    if rpc == "Append":
        request = append_request(BAD_UTF8, GOOD_EVENT)
    assert_malformed(server, rpc, request)
    assert_still_serving(server)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(
            append_request(b"s", user_event(struct_entry(b"content", field_bytes(3, BAD_UTF8)))),
            id="string-value",
        ),
        pytest.param(
            append_request(b"s", user_event(struct_entry(BAD_UTF8, field_bytes(3, b"x")))),
            id="struct-key",
        ),
        pytest.param(append_request(b"s", GOOD_EVENT) + field_bytes(4, BAD_UTF8), id="request-id"),
        pytest.param(
            append_request(b"s", GOOD_EVENT) + field_bytes(5, BAD_UTF8), id="lease-holder"
        ),
    ],
)
def test_invalid_utf8_elsewhere_in_append(
    server: RunningServer, seeded: tuple[bytes, ...], request_bytes: bytes
) -> None:
    """Invalid UTF-8 in any string of an append fails it whole and writes nothing."""
    assert_malformed(server, "Append", request_bytes)
    assert history(server, "s") == seeded
    assert_still_serving(server)


# -- the raw path itself ------------------------------------------------------------------------


def test_raw_bytes_path_accepts_a_valid_request(server: RunningServer) -> None:
    """Hand-built valid bytes are appended like any client's (so the failures above are real)."""
    (raw,) = raw_call(server, "Append", append_request(b"raw", GOOD_EVENT, GOOD_EVENT))
    reply = pb.AppendResponse.FromString(raw)
    assert [e.seq for e in reply.events] == [0, 1]
    assert reply.next_seq == 2


@pytest.mark.parametrize("rpc", UNARY_RPCS)
def test_empty_request_is_an_invalid_session_id(server: RunningServer, rpc: str) -> None:
    """Zero bytes decode fine (every field default): the empty session id is what is wrong."""
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(server, rpc, b"")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_SESSION_ID"
