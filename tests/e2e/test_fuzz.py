"""Hostile input over the wire: every RPC fuzzed, and hand-picked nasties, against one server.

One `sessionlog serve` process takes every case of this module. Hypothesis builds requests for all
thirteen RPCs (``_fuzz_strategies``) and also sends random and mangled bytes to each method. Every
call is checked by ``_fuzz_harness``: never INTERNAL or UNKNOWN, exactly one sessionlog ErrorInfo
on each error with the code its reason maps to, the sessions a rejected call names unchanged, and
every 25 calls the full session listing equal to a model built only from successful writes. The
hand-picked cases then pin the exact reason for each nasty. The last test checks the server is
still SERVING and that its RSS grew, after the warm-up, by less than ``RSS_GROWTH_LIMIT_KIB``
plus ``CACHE_FACTOR`` times the bytes of events stored meanwhile: the fold memo keeps the surfaces
of up to 1024 sessions in memory (bounded by sessions, not bytes), so data the run stores and
reads back legitimately stays resident; anything beyond that is a leak.

Runs are derandomized (the same cases every time). SESSIONLOG_FUZZ_EXAMPLES (default 300) sets
the examples per Hypothesis test; `-s` prints cases tried and the RSS figures.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, assume, given, settings

from sessionlog import fold, wire
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e import _fuzz_strategies as fs
from tests.e2e._fuzz_harness import REQUESTS, Outcome, Target, describe
from tests.e2e._helpers import user
from tests.e2e._proc import ServerProcess, free_port, health_status

EXAMPLES = int(os.environ.get("SESSIONLOG_FUZZ_EXAMPLES", "300"))
RSS_GROWTH_LIMIT_KIB = 50 * 1024
CACHE_FACTOR = 5
"""Measured: a memoized surface costs about 4x its events' bytes in anonymous memory (each event
parsed, and its projected message), plus 1x in LMDB pages mapped while reading it."""
WARM_UP_ROUNDS = 30

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)

BASELINE: dict[str, int] = {}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A `sessionlog serve` process, warmed up, with its RSS recorded after the warm-up."""
    folder = tmp_path_factory.mktemp("fuzz")
    address = f"127.0.0.1:{free_port()}"
    with ServerProcess(["--data", str(folder / "data"), "--listen", address], cwd=folder) as proc:
        proc.wait_serving(address)
        running = Target(address, proc.pid)
        try:
            warm_up(running)
            BASELINE.update(running.rss(), stored=running.stored_bytes())
            yield running
        finally:
            running.close()
        assert proc.stop() == 0, proc.log()


def send(target: Target, rpc: str, request: Message | bytes) -> Outcome:
    raw = request if isinstance(request, bytes) else request.SerializeToString()
    return target.exercise(rpc, raw)


def warm_up(target: Target) -> None:
    """Every RPC, successes and failures, enough times that caches and pools are allocated, and
    requests as big as the fuzz sends, so the allocator's high-water mark is reached before the
    baseline: what the RSS check should see is growth that keeps coming, not memory kept once."""
    for n in range(8):
        big = user("é" * (1 << 20) if n % 2 else "x" * (2 << 20))
        send(target, "Append", pb.AppendRequest(session_id="fz-Warm", events=[big]))
        content = "x" * (2 << 20)
        seed = pb.SeedSessionRequest(
            session_id="fz-Warm",
            messages=[message_pb2.Message(role=message_pb2.ROLE_SYSTEM, content=content)],
        )
        send(target, "SeedSession", seed)
    for n in range(WARM_UP_ROUNDS):
        session_id = fs.POOL[n % len(fs.POOL)]
        send(target, "Append", pb.AppendRequest(session_id=session_id, events=[user(f"w{n}")]))
        send(target, "Append", pb.AppendRequest(session_id="bad id", events=[user()]))
        send(target, "Since", pb.SinceRequest(session_id=session_id))
        send(target, "Surface", pb.SurfaceRequest(session_id=session_id))
        send(target, "DeriveMessages", pb.DeriveMessagesRequest(session_id=session_id))
        send(target, "GetSession", pb.GetSessionRequest(session_id=session_id))
        send(target, "ListSessions", pb.ListSessionsRequest(page_size=2))
        send(target, "ForkSession", pb.ForkSessionRequest(parent_session_id=session_id, at_seq=0))
        send(target, "CreateSession", pb.CreateSessionRequest(session_id=session_id))
        send(target, "SeedSession", pb.SeedSessionRequest(session_id="", messages=[]))
        send(target, "AcquireLease", pb.AcquireLeaseRequest(session_id="lease-warm", holder="w"))
        send(target, "RenewLease", pb.RenewLeaseRequest(session_id="lease-warm", holder="w"))
        send(target, "ReleaseLease", pb.ReleaseLeaseRequest(session_id="lease-warm", holder="w"))
        send(target, "Append", b"\xff\xff")


# -- generated -----------------------------------------------------------------------------------


@FUZZ
@given(case=fs.any_request())
def test_generated_requests(target: Target, case: tuple[str, Message]) -> None:
    """Generated requests to every RPC get a proper answer and rejected ones change nothing."""
    rpc, request = case
    raw = request.SerializeToString()
    assume(len(raw) < fs.MAX_REQUEST_BYTES)
    target.generated += 1
    target.exercise(rpc, raw)


@FUZZ
@given(case=fs.raw_requests())
def test_random_and_mangled_bytes(target: Target, case: tuple[str, bytes]) -> None:
    """Random and mangled request bytes to every method: MALFORMED_REQUEST or a proper answer."""
    rpc, raw = case
    target.generated += 1
    target.exercise(rpc, raw)


# -- hand-picked ---------------------------------------------------------------------------------


def expect(target: Target, rpc: str, request: Message | bytes, reason: str) -> Outcome:
    """The call fails with ``reason`` (and the harness checks code, detail and no change)."""
    outcome = send(target, rpc, request)
    assert not outcome.ok, f"{rpc} accepted a request that should fail with {reason}"
    assert outcome.reason == reason, f"{rpc}: {outcome.reason}, expected {reason}"
    return outcome


def accept(target: Target, rpc: str, request: Message | bytes) -> Outcome:
    outcome = send(target, rpc, request)
    assert outcome.ok, f"{rpc} refused a valid request: {outcome.reason}"
    return outcome


def utf8_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field holding ``payload`` (here: bytes that are not UTF-8)."""
    return wire.length_delimited(number, [payload])


BAD_UTF8 = b"ok\xff\xfe\xc0\x80"

STRING_FIELDS = [
    ("Append", 1),
    ("Append", 4),
    ("Append", 5),
    ("Since", 1),
    ("Surface", 1),
    ("DeriveMessages", 1),
    ("CreateSession", 1),
    ("CreateSession", 3),
    ("SeedSession", 1),
    ("SeedSession", 3),
    ("GetSession", 1),
    ("ListSessions", 2),
    ("ListSessions", 3),
    ("ForkSession", 1),
    ("ForkSession", 3),
    ("ForkSession", 4),
    ("AcquireLease", 1),
    ("AcquireLease", 2),
    ("RenewLease", 1),
    ("RenewLease", 2),
    ("ReleaseLease", 1),
    ("ReleaseLease", 2),
]


@pytest.mark.parametrize(("rpc", "number"), STRING_FIELDS)
def test_invalid_utf8_in_every_string_field(target: Target, rpc: str, number: int) -> None:
    """Invalid UTF-8 in any declared string field is MALFORMED_REQUEST."""
    prefix = b"" if number == 1 else utf8_field(1, b"fz-a")
    expect(target, rpc, prefix + utf8_field(number, BAD_UTF8), "MALFORMED_REQUEST")


def struct_entry(key: bytes, value: bytes) -> bytes:
    return utf8_field(1, utf8_field(1, key) + utf8_field(2, value))


def event_with_data(data: bytes) -> bytes:
    return wire.uint_field(2, event_pb2.EVENT_TYPE_USER_MESSAGE) + utf8_field(4, data)


def test_invalid_utf8_inside_event_data(target: Target) -> None:
    """Invalid UTF-8 in a Struct key, a string value, or a message field is MALFORMED_REQUEST."""
    for data in (
        struct_entry(BAD_UTF8, utf8_field(3, b"x")),
        struct_entry(b"content", utf8_field(3, BAD_UTF8)),
    ):
        request = utf8_field(1, b"fz-a") + utf8_field(2, event_with_data(data))
        expect(target, "Append", request, "MALFORMED_REQUEST")
        expect(
            target,
            "CreateSession",
            utf8_field(1, b"fz-New") + utf8_field(2, event_with_data(data)),
            "MALFORMED_REQUEST",
        )
    message = utf8_field(2, BAD_UTF8)  # Message.content
    expect(
        target,
        "SeedSession",
        utf8_field(1, b"fz-Seed") + utf8_field(2, message),
        "MALFORMED_REQUEST",
    )


def deep_struct(levels: int) -> bytes:
    """A Struct ``levels`` deep ({"k": {"k": ... {"leaf": "x"}}}), built as bytes."""
    struct = struct_entry(b"leaf", utf8_field(3, b"x"))
    for _ in range(levels - 1):
        struct = struct_entry(b"k", utf8_field(5, struct))
    return struct


@pytest.mark.parametrize(
    ("levels", "reasons"),
    [
        (24, ()),
        (25, ("UNSERIALIZABLE_EVENT_DATA",)),
        (31, ("UNSERIALIZABLE_EVENT_DATA", "MALFORMED_REQUEST")),
        (40, ("MALFORMED_REQUEST",)),
        (1000, ("MALFORMED_REQUEST",)),
    ],
)
@pytest.mark.parametrize("lenient", [False, True])
def test_deep_structs(target: Target, levels: int, reasons: tuple[str, ...], lenient: bool) -> None:
    """Nesting 24 is stored; 25 is refused; past the decoder's limit the whole call fails."""
    request = (
        utf8_field(1, b"fz-Deep")
        + utf8_field(2, event_with_data(deep_struct(levels)))
        + wire.uint_field(6, int(lenient))
    )
    outcome = send(target, "Append", request)
    if not reasons:
        assert outcome.ok
        assert len(pb.AppendResponse.FromString(outcome.replies[0]).events) == 1
    elif lenient and "UNSERIALIZABLE_EVENT_DATA" in reasons and outcome.ok:
        reply = pb.AppendResponse.FromString(outcome.replies[0])
        assert [(d.index, d.reason) for d in reply.drops] == [(0, "UNSERIALIZABLE_EVENT_DATA")]
        assert not reply.events
    else:
        assert not outcome.ok, f"nesting {levels} was accepted"
        assert outcome.reason in reasons, outcome


@pytest.mark.parametrize(
    "rpc",
    [
        "Append",
        "Since",
        "Surface",
        "DeriveMessages",
        "CreateSession",
        "SeedSession",
        "GetSession",
        "ForkSession",
        "AcquireLease",
        "RenewLease",
        "ReleaseLease",
    ],
)
@pytest.mark.parametrize("session_id", ["", "a" * 236, "é" * 118, "\u0301a", "a b", "😀"])
def test_invalid_session_ids(target: Target, rpc: str, session_id: str) -> None:
    """Empty, 236-byte and ill-formed session ids are INVALID_SESSION_ID on every RPC."""
    fields: dict[str, Any] = {"holder": "h1"} if "Lease" in rpc else {}
    if rpc == "ForkSession":
        message: Message = pb.ForkSessionRequest(parent_session_id=session_id)
    else:
        request: Callable[..., Message] = REQUESTS[rpc]  # a Message takes its fields as keywords
        message = request(session_id=session_id, **fields)
    expect(target, rpc, message, "INVALID_SESSION_ID")


def test_longest_session_id_is_accepted(target: Target) -> None:
    """A 235-byte id (the limit) works end to end; the fork child id is checked too."""
    longest = "é" * 117 + "a"
    accept(target, "Append", pb.AppendRequest(session_id=longest, events=[user()]))
    expect(
        target,
        "ForkSession",
        pb.ForkSessionRequest(parent_session_id=longest, session_id="a" * 236),
        "INVALID_SESSION_ID",
    )


def test_unknown_enum_numbers(target: Target) -> None:
    """Types past the enum are UNKNOWN_EVENT_TYPE (dropped when lenient); such roles are dropped."""
    for number in (0, max(event_pb2.EventType.values()) + 1, 2**31 - 1, -1):
        event = user()
        event.type = cast(event_pb2.EventType, number)
        expect(
            target,
            "Append",
            pb.AppendRequest(session_id="fz-Enum", events=[event]),
            "UNKNOWN_EVENT_TYPE",
        )
        reply = accept(
            target,
            "Append",
            pb.AppendRequest(session_id="fz-Enum", events=[event, user()], lenient=True),
        )
        decoded = pb.AppendResponse.FromString(reply.replies[0])
        assert [(d.index, d.reason) for d in decoded.drops] == [(0, "UNKNOWN_EVENT_TYPE")]
        assert len(decoded.events) == 1
    messages = [
        message_pb2.Message(role=cast(message_pb2.Role, r), content=f"r{r}") for r in (5, -1, 2, 99)
    ]
    seeded = accept(
        target, "SeedSession", pb.SeedSessionRequest(session_id="fz-Roles", messages=messages)
    )
    decoded_seed = pb.SeedSessionResponse.FromString(seeded.replies[0])
    assert [(d.index, d.reason) for d in decoded_seed.drops] == [
        (0, "UNKNOWN_ROLE"),
        (1, "UNKNOWN_ROLE"),
        (3, "UNKNOWN_ROLE"),
    ]
    assert len(decoded_seed.events) == 1


def replace(start: int, stop: int) -> event_pb2.Event:
    event = event_pb2.Event(type=event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE)
    event.surface_op.replace.start_seq = start
    event.surface_op.replace.stop_seq = stop
    event.data.update({"content": f"sum {start}-{stop}"})
    return event


def test_replace_ranges_at_every_edge(target: Target) -> None:
    """Replace start = own seq and stop = 2**64 - 1 pass; start past own seq or past stop fails."""
    session_id = "fz-Edges"
    top = fs.U64_MAX

    def append(*events: event_pb2.Event) -> pb.AppendRequest:
        return pb.AppendRequest(session_id=session_id, events=events)

    def next_seq() -> int:
        return len(target.snapshot(session_id).log)

    accept(target, "Append", append(user("a"), user("b")))
    n = next_seq()
    for start, stop in ((n + 1, n + 1), (n + 1, top), (top, top), (n, n - 1), (top, 0)):
        expect(target, "Append", append(replace(start, stop)), "INVALID_SURFACE_OP")
    n = next_seq()
    expect(target, "Append", append(user("c"), replace(n + 2, n + 2)), "INVALID_SURFACE_OP")
    makers: list[Callable[[int], event_pb2.Event]] = [
        lambda n: replace(n, n),
        lambda n: replace(0, 0),
        lambda n: replace(0, top),
        lambda n: replace(n, top),
        lambda n: replace(n - 1, n - 1),
    ]
    for make in makers:
        accept(target, "Append", append(make(next_seq())))
    n = next_seq()
    accept(target, "Append", append(user("c"), replace(n + 1, n + 1)))
    assert_fold_matches(target, session_id)


def assert_fold_matches(target: Target, session_id: str) -> None:
    """DeriveMessages and Surface equal a fresh fold over the stored log."""
    log = [event_pb2.Event.FromString(raw) for raw in target.snapshot(session_id).log]
    derived = pb.DeriveMessagesResponse.FromString(
        accept(target, "DeriveMessages", pb.DeriveMessagesRequest(session_id=session_id)).replies[0]
    )
    assert list(derived.messages) == fold.derive_messages(log)
    surface = pb.SurfaceResponse.FromString(
        accept(target, "Surface", pb.SurfaceRequest(session_id=session_id)).replies[0]
    )
    assert list(surface.events) == fold.fold_surface(log)


def test_max_uint64_everywhere(target: Target) -> None:
    """2**64 - 1 in every uint64 field gets its specific answer, never a crash."""
    top = fs.U64_MAX
    session_id = "fz-Max"
    accept(target, "Append", pb.AppendRequest(session_id=session_id, events=[user()]))
    expect(
        target,
        "Append",
        pb.AppendRequest(session_id=session_id, events=[user()], expected_seq=top),
        "SEQ_CONFLICT",
    )
    expect(
        target, "Append", pb.AppendRequest(session_id=session_id, expected_seq=top), "SEQ_CONFLICT"
    )
    seqd = user()
    seqd.seq = top
    expect(
        target,
        "Append",
        pb.AppendRequest(session_id=session_id, events=[seqd]),
        "SEQ_ASSIGNED_BY_SERVER",
    )
    expect(
        target,
        "Append",
        pb.AppendRequest(session_id=session_id, events=[user()], lease_token=top),
        "LEASE_LOST",
    )
    since = accept(target, "Since", pb.SinceRequest(session_id=session_id, seq=top))
    assert all(not pb.SinceResponse.FromString(r).events for r in since.replies)
    expect(
        target,
        "Surface",
        pb.SurfaceRequest(session_id=session_id, at_seq=top),
        "BOUNDARY_OUT_OF_RANGE",
    )
    expect(
        target,
        "DeriveMessages",
        pb.DeriveMessagesRequest(session_id=session_id, at_seq=top),
        "BOUNDARY_OUT_OF_RANGE",
    )
    expect(
        target,
        "ForkSession",
        pb.ForkSessionRequest(parent_session_id=session_id, at_seq=top),
        "BOUNDARY_OUT_OF_RANGE",
    )
    accept(target, "ListSessions", pb.ListSessionsRequest(page_size=2**32 - 1))


def test_unserializable_and_oversized_events(target: Target) -> None:
    """NaN, infinities, a value with no kind, bad times and >1 MiB events are refused by name."""
    for value in (float("nan"), float("inf"), float("-inf")):
        expect(
            target,
            "Append",
            pb.AppendRequest(session_id="fz-Data", events=[user(x=[{"v": value}])]),
            "UNSERIALIZABLE_EVENT_DATA",
        )
    empty = user()
    empty.data.fields["unset"].SetInParent()
    expect(
        target,
        "Append",
        pb.AppendRequest(session_id="fz-Data", events=[empty]),
        "UNSERIALIZABLE_EVENT_DATA",
    )
    for seconds, nanos in ((253402300800, 0), (-62135596801, 0), (0, -1), (0, 10**9)):
        timed = user()
        timed.time.seconds, timed.time.nanos = seconds, nanos
        expect(
            target,
            "Append",
            pb.AppendRequest(session_id="fz-Data", events=[timed]),
            "UNSERIALIZABLE_EVENT_DATA",
        )
    near = accept(
        target,
        "Append",
        pb.AppendRequest(session_id="fz-Big", events=[user("x" * ((1 << 20) - 200))]),
    )
    assert len(pb.AppendResponse.FromString(near.replies[0]).events) == 1
    big = user("x" * ((1 << 20) + 1))
    expect(
        target, "Append", pb.AppendRequest(session_id="fz-Data", events=[big]), "EVENT_TOO_LARGE"
    )
    expect(
        target,
        "CreateSession",
        pb.CreateSessionRequest(session_id="fz-Big2", events=[big]),
        "EVENT_TOO_LARGE",
    )
    expect(
        target,
        "Append",
        pb.AppendRequest(session_id="fz-Data", events=[user()], request_id="r" * 257),
        "INVALID_REQUEST_ID",
    )
    expect(
        target,
        "AcquireLease",
        pb.AcquireLeaseRequest(session_id="fz-Data", holder="h" * 257),
        "INVALID_LEASE",
    )


def test_request_over_the_message_limit_gets_an_error_info(target: Target) -> None:
    """A request larger than the 4 MiB message limit is refused with a sessionlog ErrorInfo."""
    for size in (5 << 20, 7 << 20):
        huge = pb.AppendRequest(session_id="fz-Huge", events=[user("x" * size)])
        outcome = expect(target, "Append", huge, "REQUEST_TOO_LARGE")
        assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_big_rejected_requests_are_not_kept_in_memory(tmp_path: Path) -> None:
    """80 rejected 3 MiB requests leave the server's RSS within 50 MiB of where it was."""
    address = f"127.0.0.1:{free_port()}"
    with ServerProcess(
        ["--data", str(tmp_path / "data"), "--listen", address], cwd=tmp_path
    ) as proc:
        proc.wait_serving(address)
        fresh = Target(address, proc.pid)
        try:
            big_id = pb.GetSessionRequest(session_id="a" * (3 << 20))
            big_event = pb.AppendRequest(session_id="fz-a", events=[user("x" * (3 << 20))])

            def burst(rounds: int) -> None:
                for _ in range(rounds):
                    expect(fresh, "GetSession", big_id, "INVALID_SESSION_ID")
                    expect(fresh, "Append", big_event, "EVENT_TOO_LARGE")

            burst(5)  # the allocator's high-water mark for one such request
            before = fresh.rss()
            burst(40)
            after = fresh.rss()
        finally:
            fresh.close()
    growth = after["VmRSS"] - before["VmRSS"]
    print(f"\n80 rejected 3 MiB requests: RSS {describe(before)} -> {describe(after)}")
    assert growth < RSS_GROWTH_LIMIT_KIB, f"RSS grew by {growth / 1024:.1f} MiB"


def test_forged_page_tokens(target: Target) -> None:
    """Page tokens that decode to odd JSON, lone surrogates or nothing are INVALID_PAGE_TOKEN."""
    for payload in (b'["\\ud800", ""]', b'["\\udfff\\ud800", ""]', b"[1, 2]", b"{}", b"\xff"):
        token = base64.urlsafe_b64encode(payload).decode()
        expect(
            target, "ListSessions", pb.ListSessionsRequest(page_token=token), "INVALID_PAGE_TOKEN"
        )
    expect(target, "ListSessions", pb.ListSessionsRequest(page_token="%%%"), "INVALID_PAGE_TOKEN")


# -- the end of the run --------------------------------------------------------------------------


def test_server_still_serving_and_memory_bounded(target: Target) -> None:
    """After every case the server is SERVING, holds what the model says, and did not leak."""
    target.check_model()
    assert health_status(target.address) == health_pb2.HealthCheckResponse.SERVING
    accept(target, "Append", pb.AppendRequest(session_id="fz-Final", events=[user("still here")]))
    end = target.rss()
    stored_kib = (target.stored_bytes() - BASELINE["stored"]) // 1024
    growth = end["VmRSS"] - BASELINE["VmRSS"]
    print(
        f"\nfuzz: {target.cases} cases ({target.generated} from Hypothesis), "
        f"RSS after warm-up {describe({k: BASELINE[k] for k in ('VmRSS', 'RssAnon')})}; "
        f"at end {describe({k: end[k] for k in ('VmRSS', 'RssAnon', 'RssFile')})}; "
        f"peak {describe({'VmHWM': end['VmHWM']})}; stored meanwhile {stored_kib / 1024:.1f} MiB; "
        f"codes {dict(target.codes)}; reasons {dict(target.reasons)}"
    )
    limit = RSS_GROWTH_LIMIT_KIB + CACHE_FACTOR * stored_kib
    assert growth < limit, f"RSS grew by {growth / 1024:.1f} MiB (limit {limit / 1024:.1f} MiB)"
