"""The single-writer lease end to end: acquire, renew, release, takeover, fencing and audit.

Short TTLs (1 s) stand in for a crashed worker; every wait polls with a deadline. A test that
shows a lease still held calls the server again after acquiring it, so the TTL must outlast
what a busy machine can hold a process up between two calls (200 ms did not: a 20 ms sleep
overran by up to 0.3 s at load 15). One server for the module; each test names its sessions
through the ``sid`` fixture, so no two share one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import Stub, append, check, failure, log, say
from tests.e2e._proc import running_server

TAKEOVER = pb.LeaseAuditKind.LEASE_AUDIT_KIND_TAKEOVER
FORCED_RELEASE = pb.LeaseAuditKind.LEASE_AUDIT_KIND_FORCED_RELEASE

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INVALID = grpc.StatusCode.INVALID_ARGUMENT
SHORT_MS = 1000
Sid = Callable[[str], str]

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for every test of the module."""
    with running_server(tmp_path_factory.mktemp("lease") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Stub:
    return server.stub()


# -- helpers ------------------------------------------------------------------------------------


def ttl(ms: float) -> duration_pb2.Duration:
    made = duration_pb2.Duration()
    made.FromNanoseconds(int(ms * 1_000_000))
    return made


def acquire(stub: Stub, session_id: str, holder: str, ttl_ms: float | None = None) -> pb.Lease:
    request = pb.AcquireLeaseRequest(session_id=session_id, holder=holder)
    if ttl_ms is not None:
        request.ttl.CopyFrom(ttl(ttl_ms))
    lease: pb.Lease = stub.AcquireLease(request).lease
    return lease


def renew(stub: Stub, session_id: str, holder: str, ttl_ms: float | None = None) -> pb.Lease:
    request = pb.RenewLeaseRequest(session_id=session_id, holder=holder)
    if ttl_ms is not None:
        request.ttl.CopyFrom(ttl(ttl_ms))
    lease: pb.Lease = stub.RenewLease(request).lease
    return lease


def release(stub: Stub, session_id: str, holder: str, force: bool = False) -> Any:
    return stub.ReleaseLease(
        pb.ReleaseLeaseRequest(session_id=session_id, holder=holder, force=force)
    )


def described(stub: Stub, session_id: str) -> pb.GetSessionResponse:
    response: pb.GetSessionResponse = stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    return response


def lease_of(stub: Stub, session_id: str) -> pb.Lease | None:
    session = described(stub, session_id).session
    return session.lease if session.HasField("lease") else None


def wait_until_expired(stub: Stub, session_id: str, lease: pb.Lease) -> None:
    """Poll (bounded) until the lease's expire_time has passed and GetSession stops showing it."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if (
            time.time_ns() > lease.expire_time.ToNanoseconds()
            and lease_of(stub, session_id) is None
        ):
            return
        time.sleep(0.02)
    raise AssertionError("the lease did not expire within 5 s")


def acquire_when_free(stub: Stub, session_id: str, holder: str) -> pb.Lease:
    """Acquire as soon as the current lease expires: retry on LEASE_HELD for up to 5 s."""
    deadline = time.monotonic() + 5
    reason = ""
    while time.monotonic() < deadline:
        try:
            return acquire(stub, session_id, holder, ttl_ms=30_000)
        except grpc.RpcError as error:
            reason = error_info(error).reason
        if reason != "LEASE_HELD":
            break
        time.sleep(0.01)
    raise AssertionError(f"could not take the lease over (last reason {reason!r})")


# -- acquire, renew, release --------------------------------------------------------------------


def test_acquire_renew_release(stub: Stub, sid: Sid) -> None:
    """A lease is granted, shown, extended by renewal and given up by its holder."""
    append(stub, sid("s"), say("a"))
    before = time.time_ns()
    lease = acquire(stub, sid("s"), "w1")
    assert (lease.holder, lease.token) == ("w1", 1)
    start = lease.acquire_time.ToNanoseconds()
    assert before <= start <= time.time_ns()
    assert lease.expire_time.ToNanoseconds() - start == 30 * 10**9
    assert lease_of(stub, sid("s")) == lease

    renewed = renew(stub, sid("s"), "w1", ttl_ms=60_000)
    assert (renewed.holder, renewed.token) == ("w1", 1)
    assert renewed.acquire_time == lease.acquire_time
    assert renewed.expire_time.ToNanoseconds() >= before + 60 * 10**9
    assert lease_of(stub, sid("s")) == renewed

    released = release(stub, sid("s"), "w1")
    assert released.released == renewed
    assert lease_of(stub, sid("s")) is None
    assert list(described(stub, sid("s")).lease_audit) == []
    assert not release(stub, sid("s"), "w1").HasField("released")


def test_acquire_again_while_holding_keeps_the_token(stub: Stub, sid: Sid) -> None:
    """Re-acquiring one's own live lease extends it and keeps its token."""
    first = acquire(stub, sid("s"), "w1", ttl_ms=10_000)
    again = acquire(stub, sid("s"), "w1", ttl_ms=60_000)
    assert again.token == first.token == 1
    assert again.expire_time.ToNanoseconds() > first.expire_time.ToNanoseconds()


def test_tokens_grow_with_every_acquisition(stub: Stub, sid: Sid) -> None:
    """Each new acquisition gets a larger token, across holders and releases."""
    tokens = []
    for holder in ["w1", "w2", "w1", "w3"]:
        tokens.append(acquire(stub, sid("s"), holder).token)
        release(stub, sid("s"), holder)
    assert tokens == [1, 2, 3, 4]
    assert list(described(stub, sid("s")).lease_audit) == []


def test_lease_before_the_first_write(stub: Stub, sid: Sid) -> None:
    """A lease on a never-written session: others cannot create it, the holder's append can."""
    acquire(stub, sid("new"), "w1")
    check(failure(append, stub, sid("new"), say("x")), PRECONDITION, "LEASE_HELD", holder="w1")
    create = pb.CreateSessionRequest(session_id=sid("new"), events=[say("x")])
    check(failure(stub.CreateSession, create), PRECONDITION, "LEASE_HELD", holder="w1")
    assert not described(stub, sid("new")).session.exists
    reply = append(stub, sid("new"), say("mine"), lease_holder="w1")
    assert [e.seq for e in reply.events] == [0]
    assert described(stub, sid("new")).session.exists


def test_fork_cannot_write_into_a_leased_session(stub: Stub, sid: Sid) -> None:
    """A fork into an id whose lease another worker holds is refused like any other write."""
    append(stub, sid("parent"), say("a"))
    acquire(stub, sid("kid"), "w1")
    request = pb.ForkSessionRequest(parent_session_id=sid("parent"), session_id=sid("kid"))
    check(failure(stub.ForkSession, request), PRECONDITION, "LEASE_HELD", holder="w1")
    assert not described(stub, sid("kid")).session.exists


# -- appends under a lease ----------------------------------------------------------------------


def test_appends_while_a_lease_is_held(stub: Stub, sid: Sid) -> None:
    """Only the holder writes: no holder, another holder, or a bare token without the holder's
    name is LEASE_HELD and writes nothing."""
    append(stub, sid("s"), say("before"))
    lease = acquire(stub, sid("s"), "w1")
    check(
        failure(append, stub, sid("s"), say("x")), PRECONDITION, "LEASE_HELD", holder="w1", token=1
    )
    check(failure(append, stub, sid("s"), say("x"), lease_holder="w2"), PRECONDITION, "LEASE_HELD")
    check(failure(append, stub, sid("s"), say("x"), lease_token=1), PRECONDITION, "LEASE_HELD")
    assert [e.data["content"] for e in log(stub, sid("s"))] == ["before"]
    reply = append(stub, sid("s"), say("mine"), lease_holder="w1")
    assert [e.seq for e in reply.events] == [1]
    reply = append(stub, sid("s"), say("fenced"), lease_holder="w1", lease_token=lease.token)
    assert [e.seq for e in reply.events] == [2]
    assert described(stub, sid("s")).session.event_count == 3


def test_naming_a_holder_without_a_lease(stub: Stub, sid: Sid) -> None:
    """An append that names a holder on a session with no lease is LEASE_LOST: the writer
    believes it holds a lease it does not have, so its fencing is broken."""
    append(stub, sid("s"), say("a"))
    error = failure(append, stub, sid("s"), say("x"), lease_holder="w1")
    check(error, PRECONDITION, "LEASE_LOST", holder="w1", current_holder="")
    assert [e.data["content"] for e in log(stub, sid("s"))] == ["a"]


def test_other_holder_cannot_acquire_a_live_lease(stub: Stub, sid: Sid) -> None:
    """Acquiring someone else's live lease is LEASE_HELD; the lease stays as it was."""
    lease = acquire(stub, sid("s"), "w1")
    error = failure(acquire, stub, sid("s"), "w2")
    check(error, PRECONDITION, "LEASE_HELD", holder="w1", token=1)
    assert lease_of(stub, sid("s")) == lease


def test_an_expired_lease_blocks_no_one(stub: Stub, sid: Sid) -> None:
    """Once expired (and not taken over), appends without a holder go through again."""
    append(stub, sid("s"), say("a"))
    lease = acquire(stub, sid("s"), "w1", ttl_ms=SHORT_MS)
    check(failure(append, stub, sid("s"), say("x")), PRECONDITION, "LEASE_HELD")
    wait_until_expired(stub, sid("s"), lease)
    assert [e.seq for e in append(stub, sid("s"), say("anyone")).events] == [1]


# -- takeover -----------------------------------------------------------------------------------


def test_takeover_after_expiry_is_recorded(stub: Stub, sid: Sid) -> None:
    """An expired lease goes to the next acquirer with a larger token; the loser gets LEASE_LOST."""
    append(stub, sid("s"), say("a"), lease_holder="")
    old = acquire(stub, sid("s"), "w1", ttl_ms=SHORT_MS)
    check(failure(acquire, stub, sid("s"), "w2"), PRECONDITION, "LEASE_HELD")
    wait_until_expired(stub, sid("s"), old)
    before = time.time_ns()
    new = acquire(stub, sid("s"), "w2", ttl_ms=30_000)
    after = time.time_ns()
    assert (new.holder, new.token) == ("w2", old.token + 1)
    (entry,) = described(stub, sid("s")).lease_audit
    assert entry.kind == TAKEOVER
    assert (entry.actor, entry.previous_holder, entry.previous_token) == ("w2", "w1", old.token)
    assert before <= entry.time.ToNanoseconds() <= after

    size = described(stub, sid("s")).session.event_count
    error = failure(append, stub, sid("s"), say("late"), lease_holder="w1")
    check(error, PRECONDITION, "LEASE_LOST", holder="w1", current_holder="w2")
    error = failure(append, stub, sid("s"), say("late"), lease_holder="w1", lease_token=old.token)
    check(error, PRECONDITION, "LEASE_LOST")
    check(failure(renew, stub, sid("s"), "w1"), PRECONDITION, "LEASE_LOST")
    assert described(stub, sid("s")).session.event_count == size
    assert lease_of(stub, sid("s")) == new
    assert [e.seq for e in append(stub, sid("s"), say("w2"), lease_holder="w2").events] == [size]


@pytest.mark.parametrize("fenced", [True, False])
def test_old_holder_never_writes_after_takeover(stub: Stub, fenced: bool, sid: Sid) -> None:
    """A holder that keeps appending through its lease's expiry and takeover never lands a write
    after the new holder's first one; once taken over, every attempt is LEASE_LOST."""
    old = acquire(stub, sid("s"), "old", ttl_ms=SHORT_MS)
    token = old.token if fenced else 0
    done = threading.Event()
    outcomes: list[tuple[int, str]] = []

    def keep_writing() -> None:
        stop_at = time.monotonic() + 10
        for n in range(2000):
            if done.is_set() or time.monotonic() > stop_at:
                return
            try:
                append(
                    stub,
                    sid("s"),
                    say(f"old {n}", writer="old"),
                    lease_holder="old",
                    lease_token=token,
                )
                outcomes.append((n, "OK"))
            except grpc.RpcError as error:
                outcomes.append((n, error_info(error).reason))
            time.sleep(0.002)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        new = acquire_when_free(stub, sid("s"), "new")
        taken_at = len(outcomes)
        first_new = append(stub, sid("s"), say("new 0", writer="new"), lease_holder="new").events[0]
        for _ in range(500):  # let the old holder try a while longer after the takeover
            if len(outcomes) >= taken_at + 20:
                break
            time.sleep(0.005)
    finally:
        done.set()
        writer.join(15)
    assert not writer.is_alive()
    assert new.token == old.token + 1
    stored = log(stub, sid("s"))
    olds = [e.seq for e in stored if e.data["writer"] == "old"]
    assert olds, "the old holder never wrote before the takeover"
    assert max(olds) < first_new.seq
    assert len(olds) == sum(1 for _, reason in outcomes if reason == "OK")
    reasons = [reason for _, reason in outcomes]
    assert set(reasons) <= {"OK", "LEASE_LOST"}, reasons
    lost = [n for n, reason in outcomes if reason == "LEASE_LOST"]
    assert len(lost) >= 20
    assert all(reason == "LEASE_LOST" for _, reason in outcomes[lost[0] :])
    (entry,) = described(stub, sid("s")).lease_audit
    assert (entry.kind, entry.actor, entry.previous_holder) == (TAKEOVER, "new", "old")


def test_token_fences_a_reused_holder_name(stub: Stub, sid: Sid) -> None:
    """A stale token fails LEASE_LOST even when its holder name holds the lease again."""
    first = acquire(stub, sid("s"), "w1", ttl_ms=SHORT_MS)
    wait_until_expired(stub, sid("s"), first)
    second = acquire(stub, sid("s"), "w2", ttl_ms=SHORT_MS)
    wait_until_expired(stub, sid("s"), second)
    third = acquire(stub, sid("s"), "w1", ttl_ms=30_000)
    assert (first.token, second.token, third.token) == (1, 2, 3)
    for stale in (first.token, second.token, 99):
        error = failure(append, stub, sid("s"), say("stale"), lease_holder="w1", lease_token=stale)
        check(error, PRECONDITION, "LEASE_LOST", current_token=3)
    assert log(stub, sid("s")) == []
    reply = append(stub, sid("s"), say("current"), lease_holder="w1", lease_token=third.token)
    assert [e.seq for e in reply.events] == [0]
    audit = described(stub, sid("s")).lease_audit
    assert [(e.kind, e.actor, e.previous_holder, e.previous_token) for e in audit] == [
        (TAKEOVER, "w2", "w1", 1),
        (TAKEOVER, "w1", "w2", 2),
    ]


# -- release and renew by others ----------------------------------------------------------------


def test_release_by_a_non_holder_is_refused(stub: Stub, sid: Sid) -> None:
    """Only the holder may release; the lease is unchanged and nothing is recorded."""
    lease = acquire(stub, sid("s"), "w1")
    check(failure(release, stub, sid("s"), "intruder"), PRECONDITION, "LEASE_HELD", holder="w1")
    assert lease_of(stub, sid("s")) == lease
    assert list(described(stub, sid("s")).lease_audit) == []


def test_forced_release_is_recorded(stub: Stub, sid: Sid) -> None:
    """An operator's forced release ends the lease and is audited; the old holder has LOST it."""
    append(stub, sid("s"), say("a"))
    lease = acquire(stub, sid("s"), "w1")
    before = time.time_ns()
    released = release(stub, sid("s"), "operator", force=True)
    assert released.released == lease
    assert lease_of(stub, sid("s")) is None
    (entry,) = described(stub, sid("s")).lease_audit
    assert entry.kind == FORCED_RELEASE
    assert (entry.actor, entry.previous_holder, entry.previous_token) == ("operator", "w1", 1)
    assert before <= entry.time.ToNanoseconds() <= time.time_ns()
    check(failure(append, stub, sid("s"), say("x"), lease_holder="w1"), PRECONDITION, "LEASE_LOST")
    check(failure(renew, stub, sid("s"), "w1"), PRECONDITION, "LEASE_LOST")
    assert [e.seq for e in append(stub, sid("s"), say("free")).events] == [1]
    assert acquire(stub, sid("s"), "w2").token == 2


def test_forced_release_by_the_holder_records_nothing(stub: Stub, sid: Sid) -> None:
    """force on one's own lease is a plain release: no audit entry."""
    acquire(stub, sid("s"), "w1")
    assert release(stub, sid("s"), "w1", force=True).released.holder == "w1"
    assert list(described(stub, sid("s")).lease_audit) == []


def test_renew_by_a_former_holder_after_release(stub: Stub, sid: Sid) -> None:
    """Renewing a lease one released is LEASE_LOST; the renewal does not bring it back."""
    acquire(stub, sid("s"), "w1")
    release(stub, sid("s"), "w1")
    check(failure(renew, stub, sid("s"), "w1"), PRECONDITION, "LEASE_LOST")
    assert lease_of(stub, sid("s")) is None


def test_renew_without_any_lease(stub: Stub, sid: Sid) -> None:
    """Renewing on a session that never had a lease is LEASE_LOST and creates none."""
    check(failure(renew, stub, sid("s"), "w1"), PRECONDITION, "LEASE_LOST")
    assert lease_of(stub, sid("s")) is None


def test_renew_by_a_non_holder(stub: Stub, sid: Sid) -> None:
    """RenewLease by a worker that does not hold the live lease is LEASE_LOST, lease unchanged."""
    lease = acquire(stub, sid("s"), "w1")
    check(failure(renew, stub, sid("s"), "w2"), PRECONDITION, "LEASE_LOST")
    assert lease_of(stub, sid("s")) == lease


# -- invalid requests ---------------------------------------------------------------------------


LONG_ASCII = "h" * 257
LONG_UTF8 = "é" * 129  # 129 characters, 258 bytes


@pytest.mark.parametrize("holder", ["", LONG_ASCII, LONG_UTF8])
@pytest.mark.parametrize("rpc", ["acquire", "renew", "release"])
def test_invalid_holder(stub: Stub, rpc: str, holder: str, sid: Sid) -> None:
    """An empty holder or one over 256 bytes is INVALID_LEASE; the lease is untouched."""
    lease = acquire(stub, sid("s"), "w1")
    call = {"acquire": acquire, "renew": renew, "release": release}[rpc]
    check(failure(call, stub, sid("s"), holder), INVALID, "INVALID_LEASE")
    assert lease_of(stub, sid("s")) == lease


def test_holder_of_256_bytes_is_accepted(stub: Stub, sid: Sid) -> None:
    """256 bytes is the longest holder name."""
    holder = "é" * 128
    assert acquire(stub, sid("s"), holder).holder == holder
    assert [e.seq for e in append(stub, sid("s"), say("x"), lease_holder=holder).events] == [0]


@pytest.mark.parametrize("holder", [LONG_ASCII, LONG_UTF8])
def test_append_with_an_invalid_holder(stub: Stub, holder: str, sid: Sid) -> None:
    """An Append naming an over-long lease holder is INVALID_LEASE and writes nothing."""
    check(failure(append, stub, sid("s"), say("x"), lease_holder=holder), INVALID, "INVALID_LEASE")
    assert log(stub, sid("s")) == []


@pytest.mark.parametrize("ttl_ms", [0, 0.999, -1, -1000, 24 * 3600 * 1000 + 1])
@pytest.mark.parametrize("rpc", ["acquire", "renew"])
def test_ttl_out_of_range(stub: Stub, rpc: str, ttl_ms: float, sid: Sid) -> None:
    """A TTL outside 1 ms to 24 h is INVALID_LEASE; nothing changes."""
    lease = acquire(stub, sid("s"), "w1")
    call = acquire if rpc == "acquire" else renew
    check(failure(call, stub, sid("s"), "w1", ttl_ms=ttl_ms), INVALID, "INVALID_LEASE")
    assert lease_of(stub, sid("s")) == lease


@pytest.mark.parametrize("ttl_ms", [1, 24 * 3600 * 1000])
def test_ttl_at_the_bounds(stub: Stub, ttl_ms: int, sid: Sid) -> None:
    """1 ms and 24 h are both accepted."""
    lease = acquire(stub, sid("s"), "w1", ttl_ms=ttl_ms)
    span = lease.expire_time.ToNanoseconds() - lease.acquire_time.ToNanoseconds()
    assert span == ttl_ms * 1_000_000


@pytest.mark.parametrize("rpc", ["AcquireLease", "RenewLease", "ReleaseLease"])
def test_lease_rpcs_check_the_session_id(stub: Stub, rpc: str) -> None:
    """Lease RPCs refuse an invalid session id."""
    request_type = getattr(pb, f"{rpc}Request")
    error = failure(getattr(stub, rpc), request_type(session_id="no spaces", holder="w1"))
    check(error, INVALID, "INVALID_SESSION_ID")


# -- races and restarts -------------------------------------------------------------------------


def test_concurrent_acquirers_have_one_winner(stub: Stub, sid: Sid) -> None:
    """Eight workers racing for a free lease: exactly one gets it, the rest see LEASE_HELD."""
    workers = 8
    barrier = threading.Barrier(workers)
    outcomes: dict[str, Any] = {}

    def racer(holder: str) -> None:
        barrier.wait(10)
        try:
            outcomes[holder] = acquire(stub, sid("s"), holder)
        except grpc.RpcError as error:
            outcomes[holder] = error

    threads = [threading.Thread(target=racer, args=(f"w{n}",)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(outcomes) == workers
    winners = [h for h, o in outcomes.items() if isinstance(o, pb.Lease)]
    assert len(winners) == 1, outcomes
    (winner,) = winners
    assert outcomes[winner].token == 1
    for holder, outcome in outcomes.items():
        if holder != winner:
            check(outcome, PRECONDITION, "LEASE_HELD", holder=winner)
    assert lease_of(stub, sid("s")) == outcomes[winner]
    assert list(described(stub, sid("s")).lease_audit) == []


def test_leases_and_audit_survive_a_restart(tmp_path: Path, sid: Sid) -> None:
    """A lease, its token and the audit are durable: a restarted server enforces them."""
    data = tmp_path / "data"
    with running_server(data) as server:
        stub = server.stub()
        append(stub, sid("s"), say("a"))
        acquire(stub, sid("s"), "w1")
        release(stub, sid("s"), "operator", force=True)
        lease = acquire(stub, sid("s"), "w2", ttl_ms=60_000)
        append(stub, sid("s"), say("b"), lease_holder="w2")
        audit = list(described(stub, sid("s")).lease_audit)
    with running_server(data) as server:
        stub = server.stub()
        assert lease_of(stub, sid("s")) == lease
        assert list(described(stub, sid("s")).lease_audit) == audit
        check(failure(append, stub, sid("s"), say("x")), PRECONDITION, "LEASE_HELD", holder="w2")
        check(failure(acquire, stub, sid("s"), "w3"), PRECONDITION, "LEASE_HELD")
        check(
            failure(append, stub, sid("s"), say("x"), lease_holder="w1"), PRECONDITION, "LEASE_LOST"
        )
        reply = append(stub, sid("s"), say("c"), lease_holder="w2", lease_token=lease.token)
        assert [e.seq for e in reply.events] == [2]
        assert acquire(stub, sid("s"), "w2", ttl_ms=60_000).token == lease.token
