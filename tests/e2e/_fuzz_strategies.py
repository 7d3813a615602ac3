"""Hypothesis strategies for every SessionLogService request, valid and hostile.

Values lean on the edges: session ids from a small pool (so calls pile up on the same sessions and
interact) mixed with random and invalid ones; uint64 fields at 0, 1, 2**63 and 2**64 - 1; event
types and roles past the enum; replace ranges around the pool sessions' lengths; Struct data with
NaN, infinities, empty values and deep nesting; timestamps and durations out of range.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, cast

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct, Value
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st

from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

POOL = ("fz-a", "fz-b", "fz-c", "fz-ü.d", "_fz-e")
"""The sessions most calls aim at."""
HOLDERS = ("", "h1", "h2")
U64_MAX = 2**64 - 1
MAX_REQUEST_BYTES = 3 << 20
"""Generated requests stay below the server's 4 MiB message limit (oversize is hand-picked)."""

EDGE_IDS = (
    "",
    "a" * 235,
    "a" * 236,
    "é" * 117 + "a",  # 235 bytes
    "é" * 118,  # 236 bytes
    "\u0301a",  # starts with a combining mark
    "a\u0301",
    "a\x00b",
    "a b",
    "a/b",
    "😀",
    "١٢٣",
    "ǅx",
    "a\u200b",
    "-a",
    ".a",
    "_",
)

U64_EDGES = (0, 1, 2, 3, 5, 10, 30, 2**31 - 1, 2**32, 2**63 - 1, 2**63, U64_MAX - 1, U64_MAX)


def uint64s() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(U64_EDGES), st.integers(0, 40), st.integers(0, U64_MAX))


def session_ids() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(POOL),
        st.sampled_from(POOL),
        st.sampled_from(EDGE_IDS),
        st.from_regex(r"fz-[a-z0-9_.\-]{1,12}", fullmatch=True),
        st.text(st.characters(codec="utf-8"), max_size=30),
    )


def tokens() -> st.SearchStrategy[int]:
    """A lease token: usually 0 (not fenced), else anything."""
    return st.one_of(st.just(0), st.just(0), st.just(0), st.just(0), uint64s())


def short_texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just(""),
        st.just(""),
        st.sampled_from(HOLDERS),
        st.text(st.characters(codec="utf-8"), max_size=20),
        st.sampled_from(("h" * 256, "h" * 257, "r" * 300, "\x00", "\uffff")),
    )


def huge_strings() -> st.SearchStrategy[str]:
    """Big strings: 64 KiB, or past the 1 MiB event limit (built, not drawn: cheap).

    Near-limit strings that are accepted are hand-picked instead: every one stored stays in the
    fold memo, which would blur the memory check at the end of the run."""
    sizes = st.sampled_from((1 << 16, (1 << 20) + 1, 2 << 20))
    return st.builds(lambda n, c: c * n, sizes, st.sampled_from("xé"))


JSON_KEYS = ("content", "reasoning_content", "tool_call_id", "name", "tool_calls", "metadata")


def json_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(st.characters(codec="utf-8"), max_size=12),
    )
    keys = st.one_of(st.sampled_from(JSON_KEYS), st.text(max_size=6))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)
        ),
        max_leaves=12,
    )


def nested(depth: int, leaf: Any) -> Any:
    """``leaf`` inside ``depth - 1`` alternating objects and lists."""
    value = leaf
    for level in range(depth - 1):
        value = {"k": value} if level % 2 else [value]
    return value


@st.composite
def structs(draw: st.DrawFn) -> Struct:
    """Random JSON data: projected keys with any types, NaN, inf, a value with no kind, depth."""
    keys = st.one_of(st.sampled_from(JSON_KEYS), st.text(max_size=8))
    fields = draw(st.dictionaries(keys, json_values(), max_size=5))
    extra = draw(st.sampled_from(("none",) * 9 + ("deep", "deep", "empty_value", "huge")))
    if extra == "deep":
        fields["deep"] = nested(draw(st.integers(20, 27)), "x")
    elif extra == "huge":
        fields["content"] = draw(huge_strings())
    data = Struct()
    data.update(fields)
    if extra == "empty_value":
        data.fields["unset"].CopyFrom(Value())
    return data


def timestamps() -> st.SearchStrategy[Timestamp]:
    seconds = st.one_of(
        st.integers(0, 2_000_000_000),
        st.sampled_from((-62135596801, -62135596800, 253402300799, 253402300800, -(2**63))),
        st.integers(-(2**63), 2**63 - 1),
    )
    nanos = st.one_of(st.integers(0, 999_999_999), st.sampled_from((-1, 10**9, -(2**31))))
    return st.builds(Timestamp, seconds=seconds, nanos=nanos)


@st.composite
def events(draw: st.DrawFn) -> event_pb2.Event:
    event = event_pb2.Event()
    event.type = cast(
        event_pb2.EventType,
        draw(st.one_of(st.integers(0, 10), st.sampled_from((11, 12, 99, 2**31 - 1, -1, -(2**31))))),
    )
    op = draw(st.sampled_from(("none", "none", "append", "empty", "replace", "replace")))
    if op == "append":
        event.surface_op.append.SetInParent()
    elif op == "empty":
        event.surface_op.SetInParent()
    elif op == "replace":
        event.surface_op.replace.start_seq = draw(uint64s())
        event.surface_op.replace.stop_seq = draw(uint64s())
    if draw(st.booleans()):
        event.time.CopyFrom(draw(timestamps()))
    if draw(st.integers(0, 9)) == 0:
        event.seq = draw(uint64s())
    event.data.CopyFrom(draw(structs()))
    if draw(st.integers(0, 2)) == 0:
        event.usage.CopyFrom(draw(usages()))
    return event


@st.composite
def usages(draw: st.DrawFn) -> event_pb2.Usage:
    """A usage, valid or not: any model text (empty, control characters, too long), and counts
    that may pass the limit or exceed the total they are part of."""
    counts = st.one_of(st.integers(0, 2000), uint64s())
    return event_pb2.Usage(
        model=draw(st.one_of(st.sampled_from(("m", "gpt-5", "")), st.text(max_size=300))),
        input_tokens=draw(counts),
        output_tokens=draw(counts),
        cached_input_tokens=draw(counts),
        reasoning_tokens=draw(counts),
    )


def event_lists() -> st.SearchStrategy[list[event_pb2.Event]]:
    return st.lists(events(), max_size=6)


@st.composite
def messages(draw: st.DrawFn) -> message_pb2.Message:
    role = draw(st.sampled_from((0, 1, 2, 3, 4, 4, 5, 99, -1)))
    message = message_pb2.Message(role=cast(message_pb2.Role, role))
    for name in ("content", "reasoning_content", "tool_call_id", "name"):
        value = draw(st.none() | st.text(max_size=10))
        if value is not None:
            setattr(message, name, value)
    for _ in range(draw(st.integers(0, 2))):
        message.tool_calls.add().CopyFrom(draw(structs()))
    if draw(st.booleans()):
        message.metadata.CopyFrom(draw(structs()))
    if draw(st.booleans()):
        message.created_at.CopyFrom(draw(timestamps()))
    return message


def durations() -> st.SearchStrategy[Duration | None]:
    short = st.builds(Duration, seconds=st.just(0), nanos=st.integers(1_000_000, 200_000_000))
    edges = st.builds(
        Duration,
        seconds=st.sampled_from((-1, 0, 1, 86400, 86401, 2**62, -(2**63), 315576000001)),
        nanos=st.sampled_from((0, 999_999, 1_000_000, -1, 10**9)),
    )
    return st.one_of(st.none(), short, short, edges)


def page_tokens() -> st.SearchStrategy[str]:
    def token(payload: bytes) -> str:
        return base64.urlsafe_b64encode(payload).decode().rstrip("=")

    forged = st.builds(
        lambda last, prefix: token(json.dumps([last, prefix]).encode()),
        st.one_of(st.sampled_from(POOL), st.text(max_size=5)),
        st.sampled_from(("", "fz")),
    )
    odd_json = st.sampled_from(
        (b'["\\ud800", ""]', b'["\\udfff", "fz"]', b"[1, 2]", b"{}", b'"x"', b"null", b"\xff\xfe")
    ).map(token)
    return st.one_of(st.just(""), forged, odd_json, st.text(max_size=20))


def optional(message: Message, name: str, value: Any) -> None:
    if value is not None:
        setattr(message, name, value)


@st.composite
def append_requests(draw: st.DrawFn) -> pb.AppendRequest:
    request = pb.AppendRequest(
        session_id=draw(session_ids()),
        events=draw(event_lists()),
        request_id=draw(st.one_of(st.just(""), st.sampled_from(("r1", "r2")), short_texts())),
        lease_holder=draw(short_texts()),
        lenient=draw(st.booleans()),
        lease_token=draw(tokens()),
    )
    optional(request, "expected_seq", draw(st.none() | uint64s()))
    return request


@st.composite
def since_requests(draw: st.DrawFn) -> pb.SinceRequest:
    return pb.SinceRequest(session_id=draw(session_ids()), seq=draw(uint64s()))


@st.composite
def surface_requests(draw: st.DrawFn) -> pb.SurfaceRequest:
    request = pb.SurfaceRequest(session_id=draw(session_ids()))
    optional(request, "at_seq", draw(st.none() | uint64s()))
    return request


@st.composite
def derive_requests(draw: st.DrawFn) -> pb.DeriveMessagesRequest:
    request = pb.DeriveMessagesRequest(session_id=draw(session_ids()))
    optional(request, "at_seq", draw(st.none() | uint64s()))
    if draw(st.booleans()):
        request.page_size = draw(page_sizes())
        request.page_token = draw(tail_tokens(b"M", 4))
    return request


def page_sizes() -> st.SearchStrategy[int]:
    return st.sampled_from((0, 1, 2, 10, 1000, 1001, -1, 2**31 - 1, -(2**31)))


def tail_tokens(kind: bytes, fields: int) -> st.SearchStrategy[str]:
    """Page tokens of ListEvents and paged DeriveMessages: empty, forged in the right layout
    (version, kind, an 8-byte digest that rarely matches, u64 fields at their edges), or junk."""

    def token(payload: bytes) -> str:
        return base64.urlsafe_b64encode(payload).decode().rstrip("=")

    u64 = st.sampled_from((0, 1, 2, 5, 2**63, 2**64 - 1)).map(lambda n: n.to_bytes(8, "big"))
    forged = st.builds(
        lambda kind_, digest, values: token(bytes((1,)) + kind_ + digest + b"".join(values)),
        st.sampled_from((kind, b"A", b"D", b"M")),
        st.binary(min_size=8, max_size=8),
        st.lists(u64, min_size=fields, max_size=fields),
    )
    return st.one_of(st.just(""), forged, st.text(max_size=40))


@st.composite
def list_events_requests(draw: st.DrawFn) -> pb.ListEventsRequest:
    order = draw(st.sampled_from(("", "seq", "seq desc", "SEQ DESC", "seq asc", "time", "seq,x")))
    return pb.ListEventsRequest(
        session_id=draw(session_ids()),
        page_size=draw(page_sizes()),
        page_token=draw(tail_tokens(b"D" if "desc" in order.lower() else b"A", 1)),
        order_by=order,
    )


@st.composite
def usage_requests(draw: st.DrawFn) -> pb.GetUsageRequest:
    request = pb.GetUsageRequest(
        session_id=draw(session_ids()), include_descendants=draw(st.booleans())
    )
    optional(request, "at_seq", draw(st.none() | uint64s()))
    return request


@st.composite
def create_requests(draw: st.DrawFn) -> pb.CreateSessionRequest:
    return pb.CreateSessionRequest(
        session_id=draw(session_ids()),
        events=draw(event_lists()),
        lease_holder=draw(short_texts()),
        lease_token=draw(tokens()),
    )


@st.composite
def seed_requests(draw: st.DrawFn) -> pb.SeedSessionRequest:
    return pb.SeedSessionRequest(
        session_id=draw(session_ids()),
        messages=draw(st.lists(messages(), max_size=5)),
        lease_holder=draw(short_texts()),
        lease_token=draw(tokens()),
    )


@st.composite
def get_requests(draw: st.DrawFn) -> pb.GetSessionRequest:
    return pb.GetSessionRequest(session_id=draw(session_ids()))


@st.composite
def list_requests(draw: st.DrawFn) -> pb.ListSessionsRequest:
    return pb.ListSessionsRequest(
        page_size=draw(st.one_of(st.integers(0, 5), st.sampled_from((1000, 1001, 2**32 - 1)))),
        page_token=draw(page_tokens()),
        prefix=draw(st.one_of(st.just(""), st.sampled_from(("fz", "fz-a", "\x00"))) | st.text()),
    )


@st.composite
def fork_requests(draw: st.DrawFn) -> pb.ForkSessionRequest:
    request = pb.ForkSessionRequest(
        parent_session_id=draw(session_ids()),
        session_id=draw(st.one_of(st.just(""), session_ids())),
        lease_holder=draw(short_texts()),
        lease_token=draw(tokens()),
    )
    optional(request, "at_seq", draw(st.none() | uint64s()))
    return request


@st.composite
def acquire_requests(draw: st.DrawFn) -> pb.AcquireLeaseRequest:
    request = pb.AcquireLeaseRequest(session_id=draw(session_ids()), holder=draw(short_texts()))
    ttl = draw(durations())
    if ttl is not None:
        request.ttl.CopyFrom(ttl)
    return request


@st.composite
def renew_requests(draw: st.DrawFn) -> pb.RenewLeaseRequest:
    request = pb.RenewLeaseRequest(session_id=draw(session_ids()), holder=draw(short_texts()))
    ttl = draw(durations())
    if ttl is not None:
        request.ttl.CopyFrom(ttl)
    return request


@st.composite
def release_requests(draw: st.DrawFn) -> pb.ReleaseLeaseRequest:
    return pb.ReleaseLeaseRequest(
        session_id=draw(session_ids()), holder=draw(short_texts()), force=draw(st.booleans())
    )


REQUESTS: dict[str, Callable[[], st.SearchStrategy[Any]]] = {
    "Append": append_requests,
    "Since": since_requests,
    "ListEvents": list_events_requests,
    "Surface": surface_requests,
    "DeriveMessages": derive_requests,
    "GetUsage": usage_requests,
    "CreateSession": create_requests,
    "SeedSession": seed_requests,
    "GetSession": get_requests,
    "ListSessions": list_requests,
    "ForkSession": fork_requests,
    "AcquireLease": acquire_requests,
    "RenewLease": renew_requests,
    "ReleaseLease": release_requests,
}
"""Every RPC of SessionLogService and a strategy for its request."""


def any_request() -> st.SearchStrategy[tuple[str, Message]]:
    """An RPC name and a request for it; Append twice as likely, it has the most to check."""
    names = st.sampled_from([*REQUESTS, "Append"])
    return names.flatmap(lambda name: REQUESTS[name]().map(lambda request: (name, request)))


@st.composite
def mangled(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` truncated, with bytes flipped, inserted or deleted."""
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(("flip", "insert", "delete", "truncate")))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if action == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and data:
            del data[at : at + draw(st.integers(1, 4))]
        elif action == "truncate":
            del data[at:]
    return bytes(data)


def raw_requests() -> st.SearchStrategy[tuple[str, bytes]]:
    """An RPC name and bytes for it: random bytes, or a generated request mangled."""
    names = st.sampled_from(list(REQUESTS))

    def for_name(name: str) -> st.SearchStrategy[tuple[str, bytes]]:
        valid = (
            REQUESTS[name]()
            .map(lambda r: r.SerializeToString())
            .filter(lambda raw: len(raw) < 1 << 16)
        )
        body = st.one_of(st.binary(max_size=64), valid.flatmap(lambda raw: mangled(raw)))
        return body.map(lambda raw: (name, raw))

    return names.flatmap(for_name)
