"""Send a request to a live server and check what every hostile call must leave behind.

For each call: the status is never INTERNAL or UNKNOWN; an error carries exactly one ErrorInfo,
domain ``sessionlog``, whose reason maps to the status code the error table gives it; a reply
decodes as the RPC's response type; the sessions the call names are unchanged when it fails (their
Since bytes, GetSession and lease audit) and only grown at the end when it succeeds. A model of
every session's event count, updated only from successful writes, is compared against a full
ListSessions every ``CHECK_EVERY`` calls, so a rejected call that wrote anywhere is caught.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sessionlog import errors, fold, wire
from sessionlog.service.errors import status_code
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService/"
CALL_SECONDS = 20.0
CHECK_EVERY = 25

RESPONSES: dict[str, type[Message]] = {
    "Append": pb.AppendResponse,
    "Since": pb.SinceResponse,
    "ListEvents": pb.ListEventsResponse,
    "Surface": pb.SurfaceResponse,
    "DeriveMessages": pb.DeriveMessagesResponse,
    "GetUsage": pb.GetUsageResponse,
    "CreateSession": pb.CreateSessionResponse,
    "SeedSession": pb.SeedSessionResponse,
    "GetSession": pb.GetSessionResponse,
    "ListSessions": pb.ListSessionsResponse,
    "ForkSession": pb.ForkSessionResponse,
    "AcquireLease": pb.AcquireLeaseResponse,
    "RenewLease": pb.RenewLeaseResponse,
    "ReleaseLease": pb.ReleaseLeaseResponse,
}
REQUESTS: dict[str, type[Message]] = {
    name: getattr(pb, response.DESCRIPTOR.name.replace("Response", "Request"))
    for name, response in RESPONSES.items()
}
WRITES = frozenset(
    {
        "Append",
        "CreateSession",
        "SeedSession",
        "ForkSession",
        "AcquireLease",
        "RenewLease",
        "ReleaseLease",
    }
)
EVENT_WRITES = frozenset({"Append", "CreateSession", "SeedSession", "ForkSession"})


@dataclass(frozen=True)
class Snapshot:
    """What a client can see of one session."""

    log: tuple[bytes, ...]
    session: bytes
    """GetSession's Session without its lease (the lease expires on its own)."""
    lease: tuple[str, int, int] | None
    """(holder, token, expire ns) of the live lease."""
    audit: bytes


@dataclass
class Outcome:
    """How one call ended."""

    ok: bool
    replies: list[bytes] = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""


def session_ids_of(rpc: str, request: Message | None) -> list[str]:
    """The session ids a request names (a fork's child too)."""
    if request is None:
        return []
    names = ["session_id", "parent_session_id"]
    return [getattr(request, n) for n in names if n in request.DESCRIPTOR.fields_by_name]


class Target:
    """A running server, the model of what it holds, and counters for the report."""

    def __init__(self, address: str, pid: int) -> None:
        self.address = address
        self.pid = pid
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.model: dict[str, int] = {}
        self.cases = 0
        self.generated = 0
        self.calls = 0
        self.codes: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()

    def close(self) -> None:
        self.channel.close()

    # -- calls ------------------------------------------------------------------------------

    def call(self, rpc: str, raw: bytes) -> Outcome:
        """Send ``raw`` to ``rpc`` as is and check the status or the reply."""
        self.calls += 1
        try:
            if rpc == "Since":
                stream = self.channel.unary_stream(
                    SERVICE + rpc, request_serializer=None, response_deserializer=None
                )
                replies = list(stream(raw, timeout=CALL_SECONDS))
            else:
                unary = self.channel.unary_unary(
                    SERVICE + rpc, request_serializer=None, response_deserializer=None
                )
                replies = [unary(raw, timeout=CALL_SECONDS)]
        except grpc.RpcError as error:
            return self._failed(rpc, error)
        for reply in replies:
            RESPONSES[rpc].FromString(reply)  # every reply decodes as its type
        self.codes["OK"] += 1
        return Outcome(ok=True, replies=replies)

    def _failed(self, rpc: str, error: grpc.RpcError) -> Outcome:
        code = error.code()
        self.codes[code.name] += 1
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            f"{rpc} answered {code.name}: {error.details()}"
        )
        try:
            status = rpc_status.from_call(error)
        except ValueError as mismatch:  # the status detail disagrees with the status itself
            raise AssertionError(f"{rpc} {code.name}: {str(mismatch)[:600]}") from None
        assert status is not None, f"{rpc} {code.name} without a rich status: {error.details()}"
        infos = []
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                infos.append(info)
        assert len(infos) == 1, f"{rpc} {code.name}: {len(infos)} ErrorInfo details"
        info = infos[0]
        assert info.domain == errors.DOMAIN, f"ErrorInfo domain {info.domain!r}"
        assert info.reason in errors.BY_REASON, f"unknown reason {info.reason}"
        expected = status_code(errors.BY_REASON[info.reason]("probe"))
        assert code == expected, f"{info.reason} came as {code.name}, not {expected.name}"
        self.reasons[info.reason] += 1
        return Outcome(ok=False, code=code, reason=info.reason)

    def exercise(self, rpc: str, raw: bytes) -> Outcome:
        """One fuzz case: call, then check the named sessions and (now and then) the model."""
        self.cases += 1
        request = decode_like_server(rpc, raw)
        named = [s for s in session_ids_of(rpc, request) if valid_id(s)]
        before = {s: self.snapshot(s) for s in named}
        outcome = self.call(rpc, raw)
        if request is None:
            assert not outcome.ok, f"{rpc} accepted bytes that do not decode"
            assert outcome.reason == "MALFORMED_REQUEST", f"undecodable bytes got {outcome.reason}"
        after = {s: self.snapshot(s) for s in named}
        for session_id in named:
            if outcome.ok and rpc in WRITES:
                assert_grown(before[session_id], after[session_id], session_id)
            else:
                assert_same(before[session_id], after[session_id], session_id)
        if outcome.ok and rpc in EVENT_WRITES:
            self._written(rpc, outcome.replies[0], named, after)
        if self.cases % CHECK_EVERY == 0:
            self.check_model()
        return outcome

    def _written(
        self, rpc: str, reply: bytes, named: list[str], after: dict[str, Snapshot]
    ) -> None:
        """Fold a successful write into the model; its reply events are the stored ones."""
        if rpc == "ForkSession":
            child = pb.ForkSessionResponse.FromString(reply).session
            named = [child.session_id]
            after = {child.session_id: self.snapshot(child.session_id)}
            assert child.event_count == len(after[child.session_id].log)
        else:
            if rpc == "Append":
                for drop in pb.AppendResponse.FromString(reply).drops:
                    assert drop.reason in errors.BY_REASON, f"lenient drop reason {drop.reason}"
            field_number = 1 if rpc == "Append" else 2
            target = named[0]
            log = after[target].log
            for raw in wire.split_field(reply, field_number)[1]:
                seq = event_pb2.Event.FromString(raw).seq
                assert seq < len(log), f"{rpc} replied seq {seq}, past the stored log"
                assert log[seq] == raw, f"{rpc} reply is not what was stored"
        for session_id in named:
            if after[session_id].log:
                self.model[session_id] = len(after[session_id].log)
            elif rpc in ("CreateSession", "SeedSession") and session_id == named[0]:
                self.model[session_id] = 0

    # -- state ------------------------------------------------------------------------------

    def snapshot(self, session_id: str) -> Snapshot:
        since = self.channel.unary_stream(
            SERVICE + "Since", request_serializer=None, response_deserializer=None
        )
        request = pb.SinceRequest(session_id=session_id).SerializeToString()
        log = tuple(
            raw
            for reply in since(request, timeout=CALL_SECONDS)
            for raw in wire.split_field(reply, 1)[1]
        )
        get = self.channel.unary_unary(
            SERVICE + "GetSession",
            request_serializer=pb.GetSessionRequest.SerializeToString,
            response_deserializer=pb.GetSessionResponse.FromString,
        )
        reply = get(pb.GetSessionRequest(session_id=session_id), timeout=CALL_SECONDS)
        session = reply.session
        lease = None
        if session.HasField("lease"):
            held = session.lease
            lease = (held.holder, held.token, held.expire_time.ToNanoseconds())
            session.ClearField("lease")
        audit = b"".join(entry.SerializeToString() for entry in reply.lease_audit)
        return Snapshot(log, session.SerializeToString(), lease, audit)

    def sessions(self) -> dict[str, int]:
        """Every session the server lists, with its event count (all pages)."""
        listing = self.channel.unary_unary(
            SERVICE + "ListSessions",
            request_serializer=pb.ListSessionsRequest.SerializeToString,
            response_deserializer=pb.ListSessionsResponse.FromString,
        )
        found: dict[str, int] = {}
        token = ""
        for _ in range(10_000):
            page = listing(
                pb.ListSessionsRequest(page_size=1000, page_token=token), timeout=CALL_SECONDS
            )
            for session in page.sessions:
                assert session.session_id not in found, f"{session.session_id} listed twice"
                found[session.session_id] = session.event_count
            token = page.next_page_token
            if not token:
                return found
        raise AssertionError("ListSessions never ended")

    def check_model(self) -> None:
        """The server holds exactly the sessions and event counts successful calls wrote."""
        listed = self.sessions()
        assert listed == self.model, model_diff(self.model, listed)

    def stored_bytes(self) -> int:
        """The bytes of every event the server holds (as Since sends them)."""
        return sum(
            len(raw) for session_id in self.sessions() for raw in self.snapshot(session_id).log
        )

    def rss(self) -> dict[str, int]:
        """VmRSS, VmHWM (peak) and RssAnon of the server process, in KiB."""
        wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
        values: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in wanted:
                values[key] = int(rest.split()[0])
        return values


def decode_like_server(rpc: str, raw: bytes) -> Message | None:
    """The request as the server will decode it, or None when it cannot be decoded."""
    try:
        return REQUESTS[rpc].FromString(raw)
    except (DecodeError, RecursionError, ValueError):
        return None


def valid_id(session_id: str) -> bool:
    try:
        fold.check_session_id(session_id)
    except errors.InvalidSessionId:
        return False
    return True


def assert_same(before: Snapshot, after: Snapshot, session_id: str) -> None:
    """Nothing changed but a lease running out on its own."""
    assert after.log == before.log, f"{session_id}: log changed by a call that wrote nothing"
    assert after.session == before.session, f"{session_id}: session changed"
    assert after.audit == before.audit, f"{session_id}: lease audit changed"
    if after.lease != before.lease:
        assert after.lease is None, f"{session_id}: lease changed"
        assert before.lease is not None, f"{session_id}: lease appeared"
        assert before.lease[2] <= time.time_ns(), f"{session_id}: live lease vanished"


def assert_grown(before: Snapshot, after: Snapshot, session_id: str) -> None:
    """A successful write only adds events at the end; stored bytes never change."""
    assert after.log[: len(before.log)] == before.log, f"{session_id}: stored events changed"


def model_diff(model: dict[str, int], listed: dict[str, int]) -> str:
    extra = {k: v for k, v in listed.items() if k not in model}
    missing = {k: v for k, v in model.items() if k not in listed}
    changed = {
        k: (model[k], listed[k]) for k in model.keys() & listed.keys() if model[k] != listed[k]
    }
    return (
        f"server vs model: unexpected {extra}, missing {missing}, counts (model, server) {changed}"
    )


def describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v / 1024:.1f} MiB" for k, v in values.items())
