"""Every SPEC §9 reason the four core RPCs can return, end to end; a failure changes nothing.

Each test checks the gRPC code, the one ErrorInfo detail (domain ``sessionlog``, the reason, the
metadata a client needs to act), that the message is a sentence a person can read, and that the
session's log, surface and messages are exactly what they were before the failed call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog import fold
from sessionlog.config import ServerConfig
from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import (
    ASSISTANT,
    STEP_START,
    TOOL_CALL,
    USER,
    Stub,
    append,
    get,
    nested,
    stats,
)
from tests.e2e._proc import running_server

Sid = Callable[[str], str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module's tests, each on its own sessions (``sid``); a test with
    limits of its own starts its own."""
    with running_server(tmp_path_factory.mktemp("errors") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def untouched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server that no test writes to: its session count stays 0."""
    with running_server(tmp_path_factory.mktemp("untouched") / "data") as running:
        yield running


# -- helpers ------------------------------------------------------------------------------------


def event(type_: int = USER, **data: Any) -> event_pb2.Event:
    """An event of ``type_`` whose data holds ``data`` (a user message "hi" by default)."""
    made = event_pb2.Event(type=type_)  # type: ignore[arg-type]  # unknown numbers on purpose
    made.data.update(data if data or type_ != USER else {"content": "hi"})
    return made


def replace(start: int, stop: int, content: str = "summary") -> event_pb2.Event:
    """A user message that replaces positions [start, stop]."""
    made = event(USER, content=content)
    made.surface_op.replace.start_seq = start
    made.surface_op.replace.stop_seq = stop
    return made


def nested_lists(levels: int) -> list[Any]:
    """A list nested ``levels`` deep (as a value of data, it makes data ``levels + 1`` deep)."""
    value: list[Any] = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


def history(stub: Stub, session_id: str) -> tuple[list[bytes], bytes, bytes]:
    """Everything a client can read of a session, as bytes: the log, the surface, the messages."""
    log = [
        e.SerializeToString()
        for response in stub.Since(pb.SinceRequest(session_id=session_id, seq=0))
        for e in response.events
    ]
    surface = stub.Surface(pb.SurfaceRequest(session_id=session_id)).SerializeToString()
    messages = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))
    return log, surface, messages.SerializeToString()


def _drain(call: Callable[[], Any]) -> Any:
    """Call; drain a stream so that its error surfaces."""
    result = call()
    return result if hasattr(result, "ListFields") else list(result)


def failure(call: Callable[[], Any]) -> grpc.RpcError:
    """The RpcError ``call`` raises."""
    with pytest.raises(grpc.RpcError) as caught:
        _drain(call)
    return caught.value


def outcome(call: Callable[[], Any]) -> tuple[Any, grpc.RpcError | None]:
    """(result, None) when ``call`` succeeds, (None, error) when it fails."""
    try:
        return _drain(call), None
    except grpc.RpcError as error:
        return None, error


def check_error(
    error: grpc.RpcError,
    code: grpc.StatusCode,
    reason: str,
    **metadata: object,
) -> dict[str, str]:
    """Assert code, domain, reason, the given metadata and a readable message; return metadata."""
    assert error.code() == code, error
    info = error_info(error)
    assert info.domain == "sessionlog"
    assert info.reason == reason
    for key, value in metadata.items():
        assert info.metadata.get(key) == str(value), (key, dict(info.metadata))
    message = error.details()
    assert message, "the status has no message"
    assert len(message.split()) >= 5, f"not a sentence: {message!r}"
    assert "Traceback" not in message
    assert "Error(" not in message
    return dict(info.metadata)


def assert_untouched(stub: Stub, session_id: str, before: tuple[list[bytes], bytes, bytes]) -> None:
    """The session reads exactly as it did before the failed call."""
    assert history(stub, session_id) == before


def assert_never_created(server: RunningServer, stub: Stub, session_id: str) -> None:
    """A failed first append left no session: nothing to read, and the next append gets seq 0."""
    assert not get(stub, session_id).exists
    assert history(stub, session_id)[0] == []
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))
    assert list(derived.messages) == []
    assert derived.event_count == 0
    reply = append(stub, session_id, event())
    assert [e.seq for e in reply.events] == [0]
    assert reply.next_seq == 1


@pytest.fixture
def seeded(stub: Stub, sid: Sid) -> tuple[str, tuple[list[bytes], bytes, bytes]]:
    """A session "s" with three events (user, step_start, assistant) and its history."""
    append(
        stub, sid("s"), event(USER, content="one"), event(STEP_START), event(ASSISTANT, content="2")
    )
    return sid("s"), history(stub, sid("s"))


Seeded = tuple[str, tuple[list[bytes], bytes, bytes]]


# -- UNKNOWN_EVENT_TYPE -------------------------------------------------------------------------


@pytest.mark.parametrize("type_number", [0, 99])
def test_unknown_event_type(stub: Stub, seeded: Seeded, type_number: int) -> None:
    """An unspecified (0) or unknown (99) type fails with UNKNOWN_EVENT_TYPE naming the index."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, event(), event(type_number, content="x")))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_EVENT_TYPE", index=1)
    assert_untouched(stub, sid, before)


@pytest.mark.parametrize("type_number", [0, 99])
def test_unknown_event_type_on_first_append_creates_nothing(
    server: RunningServer, stub: Stub, sid: Sid, type_number: int
) -> None:
    """A first append refused for its type creates no session."""
    error = failure(lambda: append(stub, sid("fresh"), event(type_number)))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_EVENT_TYPE", index=0)
    assert_never_created(server, stub, sid("fresh"))


# -- SURFACE_OP_ON_NON_SURFACE_EVENT ------------------------------------------------------------


def test_explicit_append_op_on_step_start(stub: Stub, seeded: Seeded) -> None:
    """Even an explicit append op on a bookkeeping event is refused."""
    sid, before = seeded
    bad = event(STEP_START)
    bad.surface_op.append.SetInParent()
    error = failure(lambda: append(stub, sid, event(), bad))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "SURFACE_OP_ON_NON_SURFACE_EVENT", index=1)
    assert_untouched(stub, sid, before)


def test_replace_op_on_tool_call(server: RunningServer, stub: Stub, sid: Sid) -> None:
    """A replace op on a TOOL_CALL is refused, and a refused first append creates nothing."""
    bad = event(TOOL_CALL, name="grep")
    bad.surface_op.replace.start_seq = 0
    error = failure(lambda: append(stub, sid("fresh"), bad))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "SURFACE_OP_ON_NON_SURFACE_EVENT", index=0)
    assert_never_created(server, stub, sid("fresh"))


def test_surface_op_with_no_kind_counts_as_unset(stub: Stub, sid: Sid) -> None:
    """A surface_op with neither kind set on a bookkeeping event is accepted (it means append)."""
    ok = event(STEP_START)
    ok.surface_op.SetInParent()
    reply = append(stub, sid("s"), ok)
    assert reply.next_seq == 1


# -- INVALID_SURFACE_OP -------------------------------------------------------------------------


def test_replace_start_after_stop(stub: Stub, seeded: Seeded) -> None:
    """A replace whose start_seq exceeds its stop_seq is INVALID_SURFACE_OP."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, replace(2, 1)))
    check_error(
        error,
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_SURFACE_OP",
        index=0,
        start_seq=2,
        stop_seq=1,
    )
    assert_untouched(stub, sid, before)


def test_replace_pointing_at_the_future(stub: Stub, seeded: Seeded) -> None:
    """A replace whose start_seq is past the seq it would get is INVALID_SURFACE_OP."""
    sid, before = seeded  # 3 events: the next one gets seq 3, the one after it seq 4
    error = failure(lambda: append(stub, sid, event(), replace(5, 9)))
    metadata = check_error(
        error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SURFACE_OP", index=1, start_seq=5
    )
    assert metadata.get("seq") == "4"
    assert_untouched(stub, sid, before)


def test_replace_may_start_at_its_own_seq(stub: Stub, seeded: Seeded) -> None:
    """The limit of rule 3 is inclusive: a replace may start at its own seq and run past the end."""
    sid, _ = seeded
    reply = append(stub, sid, event(), replace(4, 100))
    assert [e.seq for e in reply.events] == [3, 4]


# -- UNSERIALIZABLE_EVENT_DATA ------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"x": math.nan}, id="nan"),
        pytest.param({"x": math.inf}, id="inf"),
        pytest.param({"x": [1, -math.inf]}, id="inf-in-list"),
        pytest.param(nested(25), id="depth-25"),
        pytest.param({"l": nested_lists(24)}, id="lists-25"),
    ],
)
def test_unserializable_data(stub: Stub, seeded: Seeded, data: dict[str, Any]) -> None:
    """NaN, infinities and nesting past 24 levels are UNSERIALIZABLE_EVENT_DATA."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, event(), event(USER, **data)))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "UNSERIALIZABLE_EVENT_DATA", index=1)
    assert_untouched(stub, sid, before)


def test_nesting_of_24_levels_is_accepted(stub: Stub, sid: Sid) -> None:
    """The depth limit is inclusive: data nested exactly 24 levels is stored and read back."""
    reply = append(stub, sid("s"), event(USER, **nested(24)))
    stored = next(iter(stub.Since(pb.SinceRequest(session_id=sid("s"))))).events[0]
    assert stored == reply.events[0]
    assert stored.data == event(USER, **nested(24)).data


def test_unserializable_first_append_creates_nothing(
    server: RunningServer, stub: Stub, sid: Sid
) -> None:
    """A first append refused for its data creates no session."""
    error = failure(lambda: append(stub, sid("fresh"), event(USER, x=math.nan)))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "UNSERIALIZABLE_EVENT_DATA", index=0)
    assert_never_created(server, stub, sid("fresh"))


# -- INVALID_MESSAGE_FIELD ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("content", 5),
        ("content", {"text": "hi"}),
        ("reasoning_content", True),
        ("tool_call_id", 7),
        ("name", ["a"]),
        ("tool_calls", "call"),
        ("tool_calls", [{"id": "1"}, "two"]),
        ("tool_calls", {"id": "1"}),
        ("metadata", "meta"),
        ("metadata", [1]),
    ],
)
def test_invalid_message_field(stub: Stub, seeded: Seeded, field: str, value: Any) -> None:
    """A projected field of the wrong type is INVALID_MESSAGE_FIELD naming the field."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, event(), event(ASSISTANT, **{field: value})))
    check_error(
        error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MESSAGE_FIELD", index=1, field=field
    )
    assert field in error.details()
    assert_untouched(stub, sid, before)


def test_bookkeeping_events_have_no_field_shapes(stub: Stub, sid: Sid) -> None:
    """Rule 5 applies to surface types only: a TOOL_CALL may hold content of any type."""
    reply = append(stub, sid("s"), event(TOOL_CALL, content=5, metadata="x"))
    assert reply.next_seq == 1


def test_null_string_fields_are_accepted(stub: Stub, sid: Sid) -> None:
    """A projected string field may be null."""
    reply = append(stub, sid("s"), event(ASSISTANT, content=None, name=None))
    assert reply.next_seq == 1


# -- REQUEST_ID_REUSED --------------------------------------------------------------------------


def test_request_id_reused_with_other_events(stub: Stub, sid: Sid) -> None:
    """The same request_id with different events is REQUEST_ID_REUSED and writes nothing."""
    append(stub, sid("s"), event(USER, content="first"), request_id="req-1")
    before = history(stub, sid("s"))
    error = failure(
        lambda: append(stub, sid("s"), event(USER, content="other"), request_id="req-1")
    )
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
    assert_untouched(stub, sid("s"), before)


def test_request_id_reused_beats_seq_conflict(stub: Stub, sid: Sid) -> None:
    """A reused request_id is checked before expected_seq (SPEC §3 order)."""
    append(stub, sid("s"), event(USER, content="first"), request_id="req-1")
    before = history(stub, sid("s"))
    error = failure(
        lambda: append(stub, sid("s"), event(USER, content="x"), request_id="req-1", expected_seq=7)
    )
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
    assert_untouched(stub, sid("s"), before)


def test_long_request_id_is_not_internal(stub: Stub, sid: Sid) -> None:
    """A request_id longer than an LMDB key is INVALID_ARGUMENT or accepted; never INTERNAL."""
    long_id = "r" * 600
    first, error = outcome(lambda: append(stub, sid("s"), event(), request_id=long_id))
    if error is not None:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error_info(error).domain == "sessionlog"
        assert history(stub, sid("s"))[0] == []
    else:
        again = append(stub, sid("s"), event(), request_id=long_id)
        assert again == first
        assert len(history(stub, sid("s"))[0]) == 1


# -- EVENT_TOO_LARGE ----------------------------------------------------------------------------


def test_event_too_large(stub: Stub, seeded: Seeded) -> None:
    """An event past the default 1 MiB limit is EVENT_TOO_LARGE with its size and the limit."""
    sid, before = seeded
    big = event(USER, content="x" * (1024 * 1024 + 100 * 1024))
    error = failure(lambda: append(stub, sid, event(), big))
    metadata = check_error(
        error, grpc.StatusCode.INVALID_ARGUMENT, "EVENT_TOO_LARGE", index=1, limit=1 << 20
    )
    assert int(metadata["size"]) > 1 << 20
    assert_untouched(stub, sid, before)


def test_event_just_under_the_limit_is_accepted(stub: Stub, sid: Sid) -> None:
    """An event a little under 1 MiB is stored and read back whole."""
    content = "y" * (1024 * 1024 - 200)
    reply = append(stub, sid("s"), event(USER, content=content))
    assert reply.events[0].data["content"] == content


def test_configured_event_limit(tmp_path: Path) -> None:
    """A server configured with a smaller limit refuses events past that limit."""
    limits = fold.Limits(max_event_bytes=2000)
    with running_server(tmp_path / "d", limits=limits) as custom:
        stub = custom.stub()
        append(stub, "s", event(USER, content="a" * 1500))
        before = history(stub, "s")
        error = failure(lambda: append(stub, "s", event(USER, content="a" * 2500)))
        check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "EVENT_TOO_LARGE", index=0, limit=2000)
        assert_untouched(stub, "s", before)


# -- SEQ_ASSIGNED_BY_SERVER ---------------------------------------------------------------------


def test_client_supplied_seq(stub: Stub, seeded: Seeded) -> None:
    """A non-zero seq on an appended event is SEQ_ASSIGNED_BY_SERVER, even the right one."""
    sid, before = seeded
    claimed = event()
    claimed.seq = 3  # the seq it would get: still refused
    error = failure(lambda: append(stub, sid, claimed))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "SEQ_ASSIGNED_BY_SERVER", index=0, seq=3)
    assert_untouched(stub, sid, before)


# -- INVALID_SESSION_ID -------------------------------------------------------------------------

BAD_SESSION_IDS = [
    pytest.param("", id="empty"),
    pytest.param("q" * 236, id="236-bytes"),
    pytest.param("é" * 118, id="236-bytes-multibyte"),
    pytest.param("secret agent", id="space"),
    pytest.param("secret/agent", id="slash"),
    pytest.param("-secretagent", id="leading-dash"),
    pytest.param(".secretagent", id="leading-dot"),
    pytest.param("secret\nagent", id="newline"),
    pytest.param("secret\x00agent", id="nul"),
]


def _call(stub: Stub, rpc: str, session_id: str) -> Any:
    if rpc == "Append":
        return append(stub, session_id, event())
    if rpc == "Since":
        return stub.Since(pb.SinceRequest(session_id=session_id))
    if rpc == "Surface":
        return stub.Surface(pb.SurfaceRequest(session_id=session_id))
    return stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))


@pytest.mark.parametrize("rpc", ["Append", "Since", "Surface", "DeriveMessages"])
@pytest.mark.parametrize("session_id", BAD_SESSION_IDS)
def test_invalid_session_id(untouched: RunningServer, rpc: str, session_id: str) -> None:
    """A bad session id is INVALID_SESSION_ID on every RPC, and the error never echoes it."""
    server, stub = untouched, untouched.stub()
    error = failure(lambda: _call(stub, rpc, session_id))
    metadata = check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SESSION_ID")
    if session_id:
        assert session_id not in error.details()
        assert "secret" not in error.details()
        assert all(session_id not in value for value in metadata.values())
        assert stats(server.channel()).session_count == 0


@pytest.mark.parametrize(
    "session_id",
    ["a", "q" * 235, "é" * 117 + "a", "_x", "9lives", "Ünïcode-ok.v1_2", "e\u0301clair"],
)
def test_valid_session_ids(stub: Stub, session_id: str) -> None:
    """Ids at the limits of SPEC §7 are accepted and read back."""
    append(stub, session_id, event())
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))
    assert [m.content for m in derived.messages] == ["hi"]


def test_invalid_session_id_beats_event_errors(stub: Stub) -> None:
    """The session id is checked before anything else in the request."""
    bad = event(99)
    bad.seq = 4
    error = failure(lambda: append(stub, "bad id", bad, expected_seq=9, request_id="r"))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SESSION_ID")


# -- BOUNDARY_OUT_OF_RANGE ----------------------------------------------------------------------


@pytest.mark.parametrize("rpc", ["Surface", "DeriveMessages"])
@pytest.mark.parametrize("at_seq", [3, 4, 1000])
def test_at_seq_past_the_end(stub: Stub, seeded: Seeded, rpc: str, at_seq: int) -> None:
    """A view at a seq the log does not hold yet is BOUNDARY_OUT_OF_RANGE with the next seq."""
    sid, before = seeded
    request_type = pb.SurfaceRequest if rpc == "Surface" else pb.DeriveMessagesRequest
    error = failure(lambda: getattr(stub, rpc)(request_type(session_id=sid, at_seq=at_seq)))
    check_error(
        error,
        grpc.StatusCode.INVALID_ARGUMENT,
        "BOUNDARY_OUT_OF_RANGE",
        at_seq=at_seq,
        next_seq=3,
    )
    assert_untouched(stub, sid, before)


@pytest.mark.parametrize("rpc", ["Surface", "DeriveMessages"])
def test_at_seq_on_a_never_written_session(stub: Stub, sid: Sid, rpc: str) -> None:
    """An empty log has no seq 0: at_seq 0 is out of range, not an empty answer."""
    request_type = pb.SurfaceRequest if rpc == "Surface" else pb.DeriveMessagesRequest
    error = failure(lambda: getattr(stub, rpc)(request_type(session_id=sid("ghost"), at_seq=0)))
    check_error(
        error, grpc.StatusCode.INVALID_ARGUMENT, "BOUNDARY_OUT_OF_RANGE", at_seq=0, next_seq=0
    )


# -- SEQ_CONFLICT -------------------------------------------------------------------------------


@pytest.mark.parametrize("expected", [0, 2, 4, 100])
def test_seq_conflict(stub: Stub, seeded: Seeded, expected: int) -> None:
    """A wrong expected_seq is ABORTED / SEQ_CONFLICT reporting the current next_seq."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, event(), expected_seq=expected))
    check_error(error, grpc.StatusCode.ABORTED, "SEQ_CONFLICT", next_seq=3, expected_seq=expected)
    assert_untouched(stub, sid, before)


def test_seq_conflict_on_an_empty_append(stub: Stub, seeded: Seeded) -> None:
    """An append with no events still checks expected_seq (a pure compare)."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, expected_seq=1))
    check_error(error, grpc.StatusCode.ABORTED, "SEQ_CONFLICT", next_seq=3)
    assert_untouched(stub, sid, before)


def test_seq_conflict_on_a_never_written_session(
    server: RunningServer, stub: Stub, sid: Sid
) -> None:
    """expected_seq 1 on a session that does not exist conflicts with next_seq 0."""
    error = failure(lambda: append(stub, sid("fresh"), event(), expected_seq=1))
    check_error(error, grpc.StatusCode.ABORTED, "SEQ_CONFLICT", next_seq=0)
    assert_never_created(server, stub, sid("fresh"))


@pytest.mark.parametrize("lenient", [False, True])
def test_seq_conflict_beats_event_errors(stub: Stub, seeded: Seeded, lenient: bool) -> None:
    """expected_seq is checked before the events, lenient or not."""
    sid, before = seeded
    bad = event(0)
    bad.seq = 8
    error = failure(lambda: append(stub, sid, bad, expected_seq=1, lenient=lenient))
    check_error(error, grpc.StatusCode.ABORTED, "SEQ_CONFLICT", next_seq=3)
    assert_untouched(stub, sid, before)


# -- first failure wins -------------------------------------------------------------------------


def test_first_failing_event_is_reported(stub: Stub, seeded: Seeded) -> None:
    """In a batch the error is the first failing event's, even when a later one breaks rule 1."""
    sid, before = seeded
    late_rule = event()
    late_rule.seq = 1  # rule 6, at index 1
    early_rule = event(0)  # rule 1, at index 2
    error = failure(lambda: append(stub, sid, event(), late_rule, early_rule, event()))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "SEQ_ASSIGNED_BY_SERVER", index=1)
    assert_untouched(stub, sid, before)


def _with_seq(made: event_pb2.Event, seq: int = 2) -> event_pb2.Event:
    made.seq = seq
    return made


def _with_op(made: event_pb2.Event) -> event_pb2.Event:
    made.surface_op.append.SetInParent()
    return made


def _future_replace_with(**data: Any) -> event_pb2.Event:
    made = replace(50, 60)
    made.data.update(data)
    return made


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda: _with_seq(_with_op(event(0))), "UNKNOWN_EVENT_TYPE", id="1<2,6"),
        pytest.param(
            lambda: _with_seq(_with_op(event(STEP_START, x=math.nan))),
            "SURFACE_OP_ON_NON_SURFACE_EVENT",
            id="2<4,6",
        ),
        pytest.param(lambda: _future_replace_with(x=math.nan), "INVALID_SURFACE_OP", id="3<4"),
        pytest.param(
            lambda: _with_seq(_future_replace_with(content=5)), "INVALID_SURFACE_OP", id="3<5,6"
        ),
        pytest.param(
            lambda: _with_seq(event(USER, content=5, x=math.nan)),
            "UNSERIALIZABLE_EVENT_DATA",
            id="4<5,6",
        ),
        pytest.param(
            lambda: _with_seq(event(USER, content=5, pad="p" * (1 << 20))),
            "EVENT_TOO_LARGE",
            id="4size<5,6",
        ),
        pytest.param(lambda: _with_seq(event(USER, content=5)), "INVALID_MESSAGE_FIELD", id="5<6"),
    ],
)
def test_rule_order_within_one_event(
    stub: Stub, seeded: Seeded, make: Callable[[], event_pb2.Event], reason: str
) -> None:
    """An event breaking several rules fails with the earliest rule of SPEC §3."""
    sid, before = seeded
    error = failure(lambda: append(stub, sid, event(), make()))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, reason, index=1)
    assert_untouched(stub, sid, before)


def test_future_replace_is_judged_against_its_own_seq_in_a_batch(stub: Stub, sid: Sid) -> None:
    """Rule 3 uses the seq the event would get inside the batch, not the session's next seq."""
    reply = append(stub, sid("s"), event(), event(), replace(2, 2))
    assert [e.seq for e in reply.events] == [0, 1, 2]
    error = failure(lambda: append(stub, sid("t"), event(), event(), replace(3, 3)))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SURFACE_OP", index=2, seq=2)


# -- STORAGE_FULL -------------------------------------------------------------------------------


def test_storage_full_then_reads_still_work(tmp_path: Path) -> None:
    """A full map is RESOURCE_EXHAUSTED / STORAGE_FULL; nothing half written; reads still work."""
    with running_server(tmp_path / "d", map_size=1 << 20) as small:
        stub = small.stub()
        chunk = "z" * (64 << 10)
        acknowledged = 0
        error: grpc.RpcError | None = None
        for _ in range(64):  # 64 x 64 KiB is 4 times the map: it must fill well before
            try:
                append(stub, "s", event(USER, content=chunk))
            except grpc.RpcError as caught:
                error = caught
                break
            acknowledged += 1
        assert error is not None, "the map never filled"
        assert acknowledged >= 1
        check_error(error, grpc.StatusCode.RESOURCE_EXHAUSTED, "STORAGE_FULL")
        log, _, messages = history(stub, "s")
        assert len(log) == acknowledged
        assert [e.seq for e in map(event_pb2.Event.FromString, log)] == list(range(acknowledged))
        derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="s"))
        assert len(derived.messages) == acknowledged
        assert messages == derived.SerializeToString()
        before = history(stub, "s")
        again = failure(lambda: append(stub, "s", event(USER, content=chunk)))
        check_error(again, grpc.StatusCode.RESOURCE_EXHAUSTED, "STORAGE_FULL")
        assert_untouched(stub, "s", before)


# -- time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(253_402_300_800, 0), (-62_135_596_801, 0), (0, -1), (0, 1_000_000_000)],
)
def test_time_outside_timestamp_range(stub: Stub, seeded: Seeded, seconds: int, nanos: int) -> None:
    """A time outside years 0001-9999 (or bad nanos) is refused as INVALID_ARGUMENT, not stored."""
    sid, before = seeded
    bad = event()
    bad.time.seconds, bad.time.nanos = seconds, nanos
    error = failure(lambda: append(stub, sid, event(), bad))
    check_error(error, grpc.StatusCode.INVALID_ARGUMENT, "UNSERIALIZABLE_EVENT_DATA", index=1)
    assert_untouched(stub, sid, before)


# -- gRPC message size --------------------------------------------------------------------------

SMALL_MESSAGES = 200 << 10
SMALL_EVENTS = fold.Limits(max_event_bytes=100 << 10)


def test_message_limit_below_the_event_limit_is_refused(tmp_path: Path) -> None:
    """A server whose messages could not carry its largest event refuses to start."""
    with pytest.raises(ValueError, match="too small"):
        ServerConfig(max_message_bytes=SMALL_MESSAGES)


def test_request_over_the_message_limit_writes_nothing(tmp_path: Path) -> None:
    """A request larger than max_message_bytes is RESOURCE_EXHAUSTED and writes nothing."""
    with running_server(
        tmp_path / "d", max_message_bytes=SMALL_MESSAGES, limits=SMALL_EVENTS
    ) as small:
        stub = small.stub()
        append(stub, "s", event())
        before = history(stub, "s")
        big = [event(USER, content="b" * (10 << 10)) for _ in range(30)]
        error = failure(lambda: append(stub, "s", *big))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_untouched(stub, "s", before)
        assert append(stub, "s", event()).next_seq == 2


def test_append_whose_reply_outgrows_the_message_limit_is_all_or_nothing(tmp_path: Path) -> None:
    """An append that fits the limit but whose reply (with seq and time) does not: no silent write.

    The reply echoes every event with its seq and server-stamped time, so it is larger than the
    request. Either the client gets the reply, or the append fails and nothing is written; an
    error for an append that was in fact committed invites a duplicating retry.
    """
    with running_server(
        tmp_path / "d", max_message_bytes=SMALL_MESSAGES, limits=SMALL_EVENTS
    ) as small:
        stub = small.stub()
        events = [event(USER, content="m" * 80) for _ in range(2000)]
        request = pb.AppendRequest(session_id="s", events=events)
        assert request.ByteSize() < SMALL_MESSAGES
        reply, error = outcome(lambda: stub.Append(request))
        if error is not None:
            assert error.code() != grpc.StatusCode.INTERNAL
            assert error_info(error).domain == "sessionlog"
            assert not get(stub, "s").exists, "the append failed but its events were written"
        else:
            assert reply.next_seq == len(events)


def test_since_batches_fit_the_message_limit(tmp_path: Path) -> None:
    """Since keeps each response under max_message_bytes, whatever its own batch budget."""
    with running_server(
        tmp_path / "d", max_message_bytes=SMALL_MESSAGES, limits=SMALL_EVENTS
    ) as small:
        stub = small.stub()
        for _ in range(8):  # 8 appends of 40 KiB: 320 KiB in all, each request well in bounds
            append(stub, "s", *(event(USER, content="c" * (4 << 10)) for _ in range(10)))
        responses = list(stub.Since(pb.SinceRequest(session_id="s", seq=0)))
        assert len(responses) > 1
        assert all(r.ByteSize() <= SMALL_MESSAGES for r in responses)
        seqs = [e.seq for r in responses for e in r.events]
        assert seqs == list(range(80))


@pytest.mark.parametrize("rpc", ["Surface", "DeriveMessages"])
def test_view_over_the_message_limit_is_a_sessionlog_error(tmp_path: Path, rpc: str) -> None:
    """A view too large for one message is RESOURCE_EXHAUSTED / RESPONSE_TOO_LARGE, not a transport
    error; Since still reads the whole log, and a smaller at_seq view still answers."""
    with running_server(
        tmp_path / "d", max_message_bytes=SMALL_MESSAGES, limits=SMALL_EVENTS
    ) as small:
        stub = small.stub()
        for _ in range(8):  # 320 KiB of user messages, all on the surface
            append(stub, "s", *(event(USER, content="v" * (4 << 10)) for _ in range(10)))
        request_type = pb.SurfaceRequest if rpc == "Surface" else pb.DeriveMessagesRequest
        error = failure(lambda: getattr(stub, rpc)(request_type(session_id="s")))
        metadata = check_error(
            error,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "RESPONSE_TOO_LARGE",
            limit=SMALL_MESSAGES,
        )
        assert int(metadata["size"]) > SMALL_MESSAGES
        log = [e.seq for r in stub.Since(pb.SinceRequest(session_id="s")) for e in r.events]
        assert log == list(range(80))  # Since still reads the whole log
        view = getattr(stub, rpc)(request_type(session_id="s", at_seq=9))
        assert view.event_count == 10


def test_append_over_a_default_clients_receive_limit_is_all_or_nothing(
    server: RunningServer, stub: Stub, sid: Sid
) -> None:
    """With default settings on both sides, a 5 MiB append is answered, or fails having written
    nothing: gRPC clients accept 4 MiB replies by default, and the reply echoes every event."""
    events = [event(USER, content="w" * (100 << 10)) for _ in range(50)]
    reply, error = outcome(lambda: append(stub, sid("s"), *events))
    if error is not None:
        assert not get(stub, sid("s")).exists, (
            f"the client got {error.code()} but all {len(events)} events were committed"
        )
    else:
        assert reply.next_seq == len(events)
