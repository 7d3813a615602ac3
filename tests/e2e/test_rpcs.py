"""The semantics of Append, Since, Surface and DeriveMessages (SPEC §1-8), end to end over gRPC.

One server for the module (in workers mode a `serve --workers 2` process, whose start costs
seconds); each test names its sessions through the ``sid`` fixture, so no two share one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import (
    ASSISTANT,
    STEP_START,
    SYSTEM,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_START,
    USER,
    Stub,
    append,
    get,
    replace,
    say,
)
from tests.e2e._proc import running_server

pytestmark = pytest.mark.workers

Role = message_pb2.Role
Sid = Callable[[str], str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for every test of the module."""
    with running_server(tmp_path_factory.mktemp("rpcs") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Stub:
    return server.stub()


# -- helpers ------------------------------------------------------------------------------------


def event(type_: int = USER, content: str | None = None, **data: Any) -> event_pb2.Event:
    made = event_pb2.Event(type=type_)  # type: ignore[arg-type]
    if content is not None:
        data["content"] = content
    made.data.update(data)
    return made


def since_responses(stub: Stub, session_id: str, seq: int = 0) -> list[pb.SinceResponse]:
    return list(stub.Since(pb.SinceRequest(session_id=session_id, seq=seq), timeout=30))


def since(stub: Stub, session_id: str, seq: int = 0) -> list[event_pb2.Event]:
    return [e for r in since_responses(stub, session_id, seq) for e in r.events]


def surface(stub: Stub, session_id: str, at_seq: int | None = None) -> pb.SurfaceResponse:
    request = pb.SurfaceRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = at_seq
    response: pb.SurfaceResponse = stub.Surface(request)
    return response


def derive(stub: Stub, session_id: str, at_seq: int | None = None) -> pb.DeriveMessagesResponse:
    request = pb.DeriveMessagesRequest(session_id=session_id)
    if at_seq is not None:
        request.at_seq = at_seq
    response: pb.DeriveMessagesResponse = stub.DeriveMessages(request)
    return response


def contents(events: Any) -> list[str]:
    return [e.data["content"] for e in events]


# -- seq ----------------------------------------------------------------------------------------


def test_seq_is_dense_from_zero(stub: Stub, sid: Sid) -> None:
    """Seqs run 0, 1, 2, ... across single and batch appends, and Since returns them in order."""
    seqs: list[int] = []
    for size in (1, 3, 1, 5, 2):
        reply = append(stub, sid("s"), *(say(f"m{len(seqs) + i}") for i in range(size)))
        assert reply.next_seq == len(seqs) + size
        seqs.extend(e.seq for e in reply.events)
    assert seqs == list(range(12))
    assert [e.seq for e in since(stub, sid("s"))] == seqs
    assert contents(since(stub, sid("s"))) == [f"m{i}" for i in range(12)]


def test_sessions_are_independent(stub: Stub, sid: Sid) -> None:
    """Each session has its own seq from 0; ids that prefix each other do not mix."""
    append(stub, sid("ab"), say("ab0"), say("ab1"))
    append(stub, sid("abc"), say("abc0"))
    append(stub, sid("a"), say("a0"))
    assert contents(since(stub, sid("ab"))) == ["ab0", "ab1"]
    assert contents(since(stub, sid("abc"))) == ["abc0"]
    assert contents(since(stub, sid("a"))) == ["a0"]
    assert [e.seq for e in since(stub, sid("abc"))] == [0]


def test_append_response_matches_stored_events(stub: Stub, sid: Sid) -> None:
    """The events an append returns are byte for byte what Since later returns."""
    reply = append(stub, sid("s"), say("x"), event(STEP_START), event(ASSISTANT, "y"))
    assert list(reply.events) == since(stub, sid("s"))
    assert all(e.HasField("time") for e in reply.events)


# -- never-written sessions ---------------------------------------------------------------------


def test_never_written_session_reads_empty(stub: Stub, sid: Sid) -> None:
    """Since, Surface and DeriveMessages of an unknown session answer empty, not an error."""
    assert since_responses(stub, sid("ghost")) == []
    assert since(stub, sid("ghost"), seq=5) == []
    folded = surface(stub, sid("ghost"))
    assert list(folded.events) == []
    assert folded.event_count == 0
    assert folded.replace_generation == 0
    derived = derive(stub, sid("ghost"))
    assert list(derived.messages) == []
    assert list(derived.seqs) == []
    assert derived.event_count == 0


# -- SPEC §4 worked examples --------------------------------------------------------------------


def test_example_bookkeeping_is_not_on_the_surface(stub: Stub, sid: Sid) -> None:
    """0 user "one", 1 step_start, 2 assistant "two" -> surface [0, 2]."""
    append(stub, sid("s"), say("one"), event(STEP_START))
    append(stub, sid("s"), event(ASSISTANT, "two"))
    folded = surface(stub, sid("s"))
    assert [e.seq for e in folded.events] == [0, 2]
    derived = derive(stub, sid("s"))
    assert [(m.role, m.content) for m in derived.messages] == [
        (Role.ROLE_USER, "one"),
        (Role.ROLE_ASSISTANT, "two"),
    ]
    assert list(derived.seqs) == [0, 2]
    assert len(since(stub, sid("s"))) == 3


def test_example_two_summaries(stub: Stub, sid: Sid) -> None:
    """a, b, c, d, sum-ab replace(0,1), sum-cd replace(2,3) -> [sum-ab, sum-cd]."""
    append(stub, sid("s"), say("a"), say("b"), say("c"), say("d"))
    append(stub, sid("s"), replace(0, 1, "sum-ab"))
    append(stub, sid("s"), replace(2, 3, "sum-cd"))
    folded = surface(stub, sid("s"))
    assert contents(folded.events) == ["sum-ab", "sum-cd"]
    assert [e.seq for e in folded.events] == [4, 5]
    derived = derive(stub, sid("s"))
    assert [m.content for m in derived.messages] == ["sum-ab", "sum-cd"]
    assert list(derived.seqs) == [4, 5]
    assert folded.replace_generation == 2
    assert contents(since(stub, sid("s"))) == ["a", "b", "c", "d", "sum-ab", "sum-cd"]


def test_example_summary_in_the_middle(stub: Stub, sid: Sid) -> None:
    """sys, a, b, c, [summary] replace(1,2) -> [sys, [summary], c]; the log holds 5 events."""
    append(stub, sid("s"), event(SYSTEM, "sys"), say("a"), say("b"), say("c"))
    append(stub, sid("s"), replace(1, 2, "[summary]", SYSTEM))
    derived = derive(stub, sid("s"))
    assert [(m.role, m.content) for m in derived.messages] == [
        (Role.ROLE_SYSTEM, "sys"),
        (Role.ROLE_SYSTEM, "[summary]"),
        (Role.ROLE_USER, "c"),
    ]
    assert list(derived.seqs) == [0, 4, 3]
    assert [e.seq for e in surface(stub, sid("s")).events] == [0, 4, 3]
    assert len(since(stub, sid("s"))) == 5
    assert derived.event_count == 5
    assert derived.replace_generation == 1


def test_example_nested_replace_keeps_hidden(stub: Stub, sid: Sid) -> None:
    """a, b, c, S replace(0,2), X replace(0,0) -> [X]; b and c stay hidden."""
    append(stub, sid("s"), say("a"), say("b"), say("c"), replace(0, 2, "S"), replace(0, 0, "X"))
    assert contents(surface(stub, sid("s")).events) == ["X"]
    derived = derive(stub, sid("s"))
    assert [m.content for m in derived.messages] == ["X"]
    assert list(derived.seqs) == [4]
    assert contents(since(stub, sid("s"))) == ["a", "b", "c", "S", "X"]


def test_replace_does_not_hide_later_events(stub: Stub, sid: Sid) -> None:
    """A replace whose range runs past the end never hides events appended after it."""
    append(stub, sid("s"), say("a"), say("b"), replace(1, 100, "sum"))
    append(stub, sid("s"), say("later"))
    assert contents(surface(stub, sid("s")).events) == ["a", "sum", "later"]


# -- at_seq views -------------------------------------------------------------------------------


def test_at_seq_views(stub: Stub, sid: Sid) -> None:
    """Surface and DeriveMessages at_seq show the fold of events 0..at_seq only."""
    append(stub, sid("s"), event(SYSTEM, "sys"), say("a"), say("b"), say("c"))
    append(stub, sid("s"), replace(1, 2, "[summary]", SYSTEM), say("d"))
    expected = {
        0: (["sys"], 0),
        2: (["sys", "a", "b"], 0),
        3: (["sys", "a", "b", "c"], 0),
        4: (["sys", "[summary]", "c"], 1),
        5: (["sys", "[summary]", "c", "d"], 1),
    }
    for at_seq, (texts, generation) in expected.items():
        folded = surface(stub, sid("s"), at_seq)
        assert contents(folded.events) == texts, at_seq
        assert folded.event_count == at_seq + 1
        assert folded.replace_generation == generation
        derived = derive(stub, sid("s"), at_seq)
        assert [m.content for m in derived.messages] == texts, at_seq
        assert list(derived.seqs) == [e.seq for e in folded.events]
        assert derived.event_count == at_seq + 1
        assert derived.replace_generation == generation
    assert derive(stub, sid("s")) == derive(stub, sid("s"), 5)


def test_at_seq_view_then_full_view(stub: Stub, sid: Sid) -> None:
    """Reading an old view does not disturb the memoized full view, nor the reverse."""
    append(stub, sid("s"), say("a"), say("b"), replace(0, 1, "ab"))
    assert contents(surface(stub, sid("s")).events) == ["ab"]
    assert contents(surface(stub, sid("s"), 1).events) == ["a", "b"]
    assert contents(surface(stub, sid("s")).events) == ["ab"]
    append(stub, sid("s"), say("c"))
    assert contents(surface(stub, sid("s"), 2).events) == ["ab"]
    assert contents(surface(stub, sid("s")).events) == ["ab", "c"]


# -- time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(1_700_000_000, 123_456_789), (0, 1), (-62_135_596_800, 0), (253_402_300_799, 999_999_999)],
)
def test_client_time_preserved_to_the_nanosecond(
    stub: Stub, seconds: int, nanos: int, sid: Sid
) -> None:
    """A client-supplied time comes back exactly through Append, Since, Surface and messages."""
    sent = say("timed")
    sent.time.seconds, sent.time.nanos = seconds, nanos
    reply = append(stub, sid("s"), sent)
    want = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    assert reply.events[0].time == want
    assert since(stub, sid("s"))[0].time == want
    assert surface(stub, sid("s")).events[0].time == want
    assert derive(stub, sid("s")).messages[0].created_at == want


def test_missing_time_is_the_server_now(stub: Stub, sid: Sid) -> None:
    """An event sent without time gets the server's clock, the same in every read."""
    before = timestamp_pb2.Timestamp()
    before.GetCurrentTime()
    reply = append(stub, sid("s"), say("now"))
    after = timestamp_pb2.Timestamp()
    after.GetCurrentTime()
    stamped = reply.events[0].time.ToNanoseconds()
    assert before.ToNanoseconds() <= stamped <= after.ToNanoseconds()
    assert since(stub, sid("s"))[0].time == reply.events[0].time


# -- lenient append -----------------------------------------------------------------------------


def test_lenient_append_drops_and_reports(stub: Stub, sid: Sid) -> None:
    """Lenient: bad events are dropped with index and reason; the rest are written densely."""
    append(stub, sid("s"), say("first"))
    seq_set = say("seq")
    seq_set.seq = 9
    batch = [say("a"), event(0), say("b"), event(ASSISTANT, content=None, name=3), seq_set]
    batch.append(replace(50, 60, "future"))
    batch.append(say("c"))
    reply = append(stub, sid("s"), *batch, lenient=True)
    assert [(d.index, d.reason) for d in reply.drops] == [
        (1, "UNKNOWN_EVENT_TYPE"),
        (3, "INVALID_MESSAGE_FIELD"),
        (4, "SEQ_ASSIGNED_BY_SERVER"),
        (5, "INVALID_SURFACE_OP"),
    ]
    assert all(len(d.message.split()) >= 4 for d in reply.drops)
    assert contents(reply.events) == ["a", "b", "c"]
    assert [e.seq for e in reply.events] == [1, 2, 3]
    assert reply.next_seq == 4
    assert contents(since(stub, sid("s"))) == ["first", "a", "b", "c"]


def test_lenient_future_replace_is_judged_after_earlier_drops(stub: Stub, sid: Sid) -> None:
    """A dropped event frees its seq: a later replace is judged by the seq it really gets."""
    reply = append(stub, sid("s"), say("a"), event(0), replace(1, 1, "r"), lenient=True)
    assert [(d.index, d.reason) for d in reply.drops] == [(1, "UNKNOWN_EVENT_TYPE")]
    assert [e.seq for e in reply.events] == [0, 1]
    reply = append(stub, sid("t"), say("a"), event(0), replace(2, 2, "r"), lenient=True)
    assert [(d.index, d.reason) for d in reply.drops] == [
        (1, "UNKNOWN_EVENT_TYPE"),
        (2, "INVALID_SURFACE_OP"),
    ]
    assert [e.seq for e in reply.events] == [0]


def test_lenient_append_with_everything_dropped(
    server: RunningServer, stub: Stub, sid: Sid
) -> None:
    """A lenient append whose events are all dropped writes nothing and creates no session."""
    reply = append(stub, sid("fresh"), event(0), event(99), lenient=True)
    assert [d.index for d in reply.drops] == [0, 1]
    assert list(reply.events) == []
    assert reply.next_seq == 0
    assert since(stub, sid("fresh")) == []
    assert not get(stub, sid("fresh")).exists


def test_strict_append_reports_no_drops(stub: Stub, sid: Sid) -> None:
    """A strict append that succeeds has an empty drops list."""
    reply = append(stub, sid("s"), say("a"))
    assert list(reply.drops) == []


# -- request_id ---------------------------------------------------------------------------------


def test_request_id_replay_returns_the_same_response(stub: Stub, sid: Sid) -> None:
    """A retry with the same request_id and events returns the first response and writes nothing."""
    append(stub, sid("s"), say("zero"))
    first = append(stub, sid("s"), say("a"), say("b"), request_id="req-7")
    append(stub, sid("s"), say("c"))
    retry = append(stub, sid("s"), say("a"), say("b"), request_id="req-7")
    assert retry == first
    assert [e.seq for e in retry.events] == [1, 2]
    assert retry.next_seq == 3
    assert contents(since(stub, sid("s"))) == ["zero", "a", "b", "c"]


def test_request_id_replay_of_a_lenient_append(stub: Stub, sid: Sid) -> None:
    """A replayed lenient append reports the same drops and writes nothing."""
    first = append(stub, sid("s"), say("a"), event(0), request_id="r", lenient=True)
    retry = append(stub, sid("s"), say("a"), event(0), request_id="r", lenient=True)
    assert retry == first
    assert [d.index for d in retry.drops] == [1]
    assert len(since(stub, sid("s"))) == 1


def test_request_id_is_per_session(stub: Stub, sid: Sid) -> None:
    """The same request_id on another session is a new request."""
    append(stub, sid("s"), say("a"), request_id="r")
    reply = append(stub, sid("t"), say("a"), request_id="r")
    assert [e.seq for e in reply.events] == [0]
    assert len(since(stub, sid("t"))) == 1


def test_request_id_replay_beats_seq_conflict(stub: Stub, sid: Sid) -> None:
    """A replay is answered before expected_seq is compared (the retry of a won race succeeds)."""
    first = append(stub, sid("s"), say("a"), request_id="r", expected_seq=0)
    append(stub, sid("s"), say("b"))
    retry = append(stub, sid("s"), say("a"), request_id="r", expected_seq=0)
    assert retry == first
    assert len(since(stub, sid("s"))) == 2


# -- expected_seq -------------------------------------------------------------------------------


def test_expected_seq_matches(stub: Stub, sid: Sid) -> None:
    """expected_seq equal to the next seq appends; 0 means the session is still empty."""
    reply = append(stub, sid("s"), say("a"), expected_seq=0)
    assert reply.next_seq == 1
    reply = append(stub, sid("s"), say("b"), say("c"), expected_seq=1)
    assert [e.seq for e in reply.events] == [1, 2]


def test_expected_seq_race(stub: Stub, sid: Sid) -> None:
    """Two writers naming the same expected_seq: one wins, the other is ABORTED with next_seq."""
    append(stub, sid("s"), say("a"))
    append(stub, sid("s"), say("writer-1"), expected_seq=1)
    with pytest.raises(grpc.RpcError) as caught:
        append(stub, sid("s"), say("writer-2"), expected_seq=1)
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert error_info(caught.value).metadata["next_seq"] == "2"
    assert contents(since(stub, sid("s"))) == ["a", "writer-1"]


# -- empty append -------------------------------------------------------------------------------


def test_empty_append_on_a_new_session(server: RunningServer, stub: Stub, sid: Sid) -> None:
    """An append with no events returns next_seq 0 and creates no session."""
    reply = append(stub, sid("fresh"))
    assert reply.next_seq == 0
    assert list(reply.events) == []
    assert not get(stub, sid("fresh")).exists
    reply = append(stub, sid("fresh"), expected_seq=0)
    assert reply.next_seq == 0
    assert not get(stub, sid("fresh")).exists


def test_empty_append_on_an_existing_session(stub: Stub, sid: Sid) -> None:
    """An empty append returns the current next_seq, writes nothing, and compares expected_seq."""
    append(stub, sid("s"), say("a"), say("b"))
    assert append(stub, sid("s")).next_seq == 2
    assert append(stub, sid("s"), expected_seq=2).next_seq == 2
    assert len(since(stub, sid("s"))) == 2


# -- DeriveMessages fields ----------------------------------------------------------------------


def test_derived_message_fields(stub: Stub, sid: Sid) -> None:
    """Fields are copied from data: absent stays absent, "" stays "", null is absent."""
    calls: list[dict[str, Any]] = [
        {"id": "c1", "function": {"name": "grep", "arguments": "{}"}},
        {"id": "c2"},
    ]
    sent = [
        event(SYSTEM, "be brief"),
        event(USER, "", name="ann"),
        event(USER),
        event(ASSISTANT, tool_calls=calls, reasoning_content="think", extra="hidden"),
        event(TOOL_CALL, name="grep"),
        event(TOOL_RESULT, "found", tool_call_id="c1", name="grep", metadata={"exit": 0}),
        event(ASSISTANT, content=None, name=None, metadata={"content_parts": [{"type": "text"}]}),
    ]
    sent[0].time.seconds, sent[0].time.nanos = 1_700_000_000, 5
    reply = append(stub, sid("s"), *sent)
    derived = derive(stub, sid("s"))
    assert list(derived.seqs) == [0, 1, 2, 3, 5, 6]
    system, empty, absent, assistant, tool, parts = derived.messages

    assert system.role == Role.ROLE_SYSTEM
    assert system.content == "be brief"
    assert system.created_at == timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5)

    assert empty.role == Role.ROLE_USER
    assert empty.HasField("content")
    assert empty.content == ""
    assert empty.name == "ann"

    assert absent.role == Role.ROLE_USER
    for field in ("content", "reasoning_content", "tool_call_id", "name"):
        assert not absent.HasField(field), field
    assert list(absent.tool_calls) == []
    assert absent.metadata == struct_pb2.Struct()

    assert assistant.role == Role.ROLE_ASSISTANT
    assert not assistant.HasField("content")
    assert assistant.reasoning_content == "think"
    assert [json_format.MessageToDict(c) for c in assistant.tool_calls] == calls

    assert tool.role == Role.ROLE_TOOL
    assert (tool.content, tool.tool_call_id, tool.name) == ("found", "c1", "grep")
    assert dict(tool.metadata) == {"exit": 0}

    assert not parts.HasField("content")
    assert not parts.HasField("name")
    assert json_format.MessageToDict(parts.metadata) == {"content_parts": [{"type": "text"}]}

    for message, seq in zip(derived.messages, derived.seqs, strict=True):
        assert message.created_at == reply.events[seq].time


def test_other_data_keys_stay_in_the_log(stub: Stub, sid: Sid) -> None:
    """Keys that do not project are kept in the stored event, whatever they hold."""
    append(stub, sid("s"), event(USER, "hi", extra={"deep": [1, "two", None]}, flag=True))
    stored = since(stub, sid("s"))[0]
    assert json_format.MessageToDict(stored.data) == {
        "content": "hi",
        "extra": {"deep": [1, "two", None]},
        "flag": True,
    }
    assert surface(stub, sid("s")).events[0] == stored


def test_assistant_message_without_content_or_calls_still_projects(stub: Stub, sid: Sid) -> None:
    """Nothing is filtered: an empty assistant message is still a message."""
    append(stub, sid("s"), event(ASSISTANT))
    derived = derive(stub, sid("s"))
    assert [m.role for m in derived.messages] == [Role.ROLE_ASSISTANT]


# -- Since --------------------------------------------------------------------------------------


def test_since_batches_a_large_log(stub: Stub, sid: Sid) -> None:
    """Over 300 KiB of events come back in several responses, in order, without gap or dup."""
    payload = "p" * (8 << 10)
    total = 0
    for batch in range(5):
        reply = append(stub, sid("s"), *(say(f"{batch}:{i}:{payload}") for i in range(10)))
        total = reply.next_seq
    assert total == 50
    responses = since_responses(stub, sid("s"))
    assert len(responses) > 1
    assert all(len(r.events) > 0 for r in responses)
    assert all(not r.caught_up for r in responses)
    seqs = [e.seq for r in responses for e in r.events]
    assert seqs == list(range(total))
    assert sum(r.ByteSize() for r in responses) > 300 << 10


@pytest.mark.parametrize("start", [1, 25, 49])
def test_since_from_the_middle(stub: Stub, start: int, sid: Sid) -> None:
    """Since(seq) starts at exactly that seq and runs to the end."""
    for chunk in range(5):
        append(stub, sid("s"), *(say(str(chunk * 10 + i)) for i in range(10)))
    events = since(stub, sid("s"), start)
    assert [e.seq for e in events] == list(range(start, 50))
    assert contents(events) == [str(i) for i in range(start, 50)]


@pytest.mark.parametrize("start", [3, 4, 1 << 40])
def test_since_past_the_end(stub: Stub, start: int, sid: Sid) -> None:
    """Since at or past the end ends at once with no events (and no error)."""
    append(stub, sid("s"), say("a"), say("b"), say("c"))
    assert since(stub, sid("s"), start) == []


def test_since_middle_of_large_log_batches(stub: Stub, sid: Sid) -> None:
    """Since from a middle seq of a large log also batches without gap or dup."""
    payload = "q" * (16 << 10)
    append(stub, sid("s"), *(say(f"{i}:{payload}") for i in range(40)))
    responses = since_responses(stub, sid("s"), 7)
    assert len(responses) > 1
    assert [e.seq for r in responses for e in r.events] == list(range(7, 40))


# -- Surface ------------------------------------------------------------------------------------


def test_surface_events_and_counters(stub: Stub, sid: Sid) -> None:
    """Surface returns the stored surface events with event_count and replace_generation."""
    stored = append(stub, sid("s"), event(SYSTEM, "sys"), say("a"), event(TURN_START), say("b"))
    folded = surface(stub, sid("s"))
    assert list(folded.events) == [stored.events[i] for i in (0, 1, 3)]
    assert folded.event_count == 4
    assert folded.replace_generation == 0
    summary = append(stub, sid("s"), replace(1, 3, "sum"))
    folded = surface(stub, sid("s"))
    assert list(folded.events) == [stored.events[0], summary.events[0]]
    assert folded.event_count == 5
    assert folded.replace_generation == 1
    assert folded.events[1].surface_op.replace.start_seq == 1
    assert folded.events[1].surface_op.replace.stop_seq == 3
