"""Sharded servers (--shard-map FILE): each group's server serves its own sessions only, and
refuses another group's with WRONG_GROUP naming the owner."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.shard import ShardMap, slot_of
from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import errors as client_errors
from sessionlog_client._status import to_error
from tests.e2e import _web
from tests.e2e._helpers import append, check, failure, get, log, stats, user
from tests.e2e._proc import ServerProcess, free_port, run_cli

TIMEOUT = 10.0
FAILED = grpc.StatusCode.FAILED_PRECONDITION


@dataclass
class Groups:
    shard_map: ShardMap
    map_path: Path
    g1: str
    g2: str
    http1: str
    channel1: grpc.Channel
    channel2: grpc.Channel

    @property
    def stub1(self) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(self.channel1)  # type: ignore[no-untyped-call]

    @property
    def stub2(self) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(self.channel2)  # type: ignore[no-untyped-call]

    def session_of(self, group: str, nth: int = 0) -> str:
        """The ``nth`` id ``s0``, ``s1``... that ``group`` owns."""
        found = [f"s{n}" for n in range(200) if self.shard_map.owner(f"s{n}").name == group]
        return found[nth]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Groups]:
    """Two static groups of one server each: g1 finds its group by its --listen address, g2 is
    told --group g2."""
    work = tmp_path_factory.mktemp("shards")
    g1, g2 = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    http1 = f"127.0.0.1:{free_port()}"
    shard_map = ShardMap.even_split({"g1": [g1], "g2": [g2]}, epoch=7)
    map_path = work / "shards.toml"
    map_path.write_text(shard_map.to_toml())
    common = ["--shard-map", str(map_path), "--shutdown-grace", "1"]
    one = ServerProcess(
        ["--data", str(work / "d1"), "--listen", g1, "--http-listen", http1, *common],
        work,
        name="g1",
    )
    two = ServerProcess(
        ["--data", str(work / "d2"), "--listen", g2, "--group", "g2", *common], work, name="g2"
    )
    with one, two:
        one.wait_serving(g1)
        two.wait_serving(g2)
        with grpc.insecure_channel(g1) as channel1, grpc.insecure_channel(g2) as channel2:
            yield Groups(shard_map, map_path, g1, g2, http1, channel1, channel2)


def test_each_group_serves_its_own_sessions(groups: Groups) -> None:
    """Writes and reads of a session work on the group that owns it."""
    for stub, group in ((groups.stub1, "g1"), (groups.stub2, "g2")):
        session = groups.session_of(group, 1)
        append(stub, session, user("hello"))
        assert [e.data["content"] for e in log(stub, session)] == ["hello"]
        assert get(stub, session).event_count == 1


def _calls(stub: pb_grpc.SessionLogServiceStub, sid: str) -> dict[str, Callable[[], Any]]:
    """Every SessionLogService call that names the session ``sid``."""
    return {
        "Append": lambda: stub.Append(
            pb.AppendRequest(session_id=sid, events=[user()]), timeout=TIMEOUT
        ),
        "Since": lambda: list(stub.Since(pb.SinceRequest(session_id=sid), timeout=TIMEOUT)),
        "Follow": lambda: list(
            stub.Since(pb.SinceRequest(session_id=sid, follow=True), timeout=TIMEOUT)
        ),
        "ListEvents": lambda: stub.ListEvents(
            pb.ListEventsRequest(session_id=sid, order_by="seq desc"), timeout=TIMEOUT
        ),
        "Surface": lambda: stub.Surface(pb.SurfaceRequest(session_id=sid), timeout=TIMEOUT),
        "DeriveMessages": lambda: stub.DeriveMessages(
            pb.DeriveMessagesRequest(session_id=sid), timeout=TIMEOUT
        ),
        "GetState": lambda: stub.GetState(pb.GetStateRequest(session_id=sid), timeout=TIMEOUT),
        "GetUsage": lambda: stub.GetUsage(pb.GetUsageRequest(session_id=sid), timeout=TIMEOUT),
        "CreateSession": lambda: stub.CreateSession(
            pb.CreateSessionRequest(session_id=sid, events=[user()]), timeout=TIMEOUT
        ),
        "SeedSession": lambda: stub.SeedSession(
            pb.SeedSessionRequest(session_id=sid), timeout=TIMEOUT
        ),
        "GetSession": lambda: stub.GetSession(
            pb.GetSessionRequest(session_id=sid), timeout=TIMEOUT
        ),
        "ForkSession": lambda: stub.ForkSession(
            pb.ForkSessionRequest(parent_session_id=sid, session_id=sid + "-fork"),
            timeout=TIMEOUT,
        ),
        "AcquireLease": lambda: stub.AcquireLease(
            pb.AcquireLeaseRequest(session_id=sid, holder="w"), timeout=TIMEOUT
        ),
        "RenewLease": lambda: stub.RenewLease(
            pb.RenewLeaseRequest(session_id=sid, holder="w"), timeout=TIMEOUT
        ),
        "ReleaseLease": lambda: stub.ReleaseLease(
            pb.ReleaseLeaseRequest(session_id=sid, holder="w"), timeout=TIMEOUT
        ),
        "ImportSession": lambda: stub.ImportSession(
            pb.ImportSessionRequest(session_id=sid, events=[user()]), timeout=TIMEOUT
        ),
        "GetSessionRecords": lambda: stub.GetSessionRecords(
            pb.GetSessionRecordsRequest(session_id=sid), timeout=TIMEOUT
        ),
        "DeleteSession": lambda: stub.DeleteSession(
            pb.DeleteSessionRequest(session_id=sid), timeout=TIMEOUT
        ),
        "RedactEvents": lambda: stub.RedactEvents(
            pb.RedactEventsRequest(session_id=sid, seqs=[0]), timeout=TIMEOUT
        ),
    }


def test_every_session_rpc_for_a_foreign_session_is_wrong_group(groups: Groups) -> None:
    """g1 refuses each call naming a g2 session, says where it belongs, and writes nothing."""
    foreign = groups.session_of("g2", 2)
    before = stats(groups.channel1)
    for name, call in _calls(groups.stub1, foreign).items():
        error = failure(call)
        try:
            check(
                error,
                FAILED,
                "WRONG_GROUP",
                session_id=foreign,
                slot=slot_of(foreign),
                group="g2",
                primary=groups.g2,
                members=groups.g2,
                map_epoch=7,
            )
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    after = stats(groups.channel1)
    assert (after.session_count, after.position) == (before.session_count, before.position)


def test_a_fork_into_another_group_is_refused(groups: Groups) -> None:
    """A fork's new session must lie in its parent's group: CROSS_GROUP_FORK otherwise."""
    parent, target = groups.session_of("g1", 3), groups.session_of("g2", 3)
    append(groups.stub1, parent, user("fork me"))
    error = failure(
        groups.stub1.ForkSession,
        pb.ForkSessionRequest(parent_session_id=parent, session_id=target),
        timeout=TIMEOUT,
    )
    check(error, FAILED, "CROSS_GROUP_FORK", source_group="g1", target_group="g2")
    assert error_info(error).metadata["target_slot"] == str(slot_of(target))
    child = groups.session_of("g1", 4)
    groups.stub1.ForkSession(
        pb.ForkSessionRequest(parent_session_id=parent, session_id=child), timeout=TIMEOUT
    )
    assert get(groups.stub1, child).event_count == 1


def test_get_shard_map_describes_the_map_and_the_answering_group(groups: Groups) -> None:
    """GetShardMap returns the epoch, each group's members, ranges and primary, and my group."""
    reply = groups.stub2.GetShardMap(pb.GetShardMapRequest(), timeout=TIMEOUT)
    assert reply.group == "g2"
    assert reply.shard_map.epoch == 7
    described = [
        (g.name, list(g.members), [(r.first, r.last) for r in g.slot_ranges], g.primary)
        for g in reply.shard_map.groups
    ]
    assert described == [
        ("g1", [groups.g1], [(0, 511)], groups.g1),
        ("g2", [groups.g2], [(512, 1023)], groups.g2),
    ]


def test_get_stats_reports_the_map_epoch_group_and_owned_slots(groups: Groups) -> None:
    """GetStats and `admin stats --server`: map_epoch, shard_group and owned_slots."""
    reply = stats(groups.channel1)
    assert (reply.map_epoch, reply.shard_group, reply.owned_slots) == (7, "g1", 512)
    done = run_cli(["admin", "stats", "--server", groups.g2, "--json"], groups.map_path.parent)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["map_epoch"], shown["shard_group"], shown["owned_slots"]) == (7, "g2", 512)


def test_list_lease_audit_lists_the_groups_own(groups: Groups) -> None:
    """ListLeaseAudit on each group lists the forced releases of the sessions it owns (the RPC
    names no session, so no WRONG_GROUP: each group answers for its own)."""
    mine = {"g1": groups.session_of("g1", 7), "g2": groups.session_of("g2", 7)}
    for group, stub in (("g1", groups.stub1), ("g2", groups.stub2)):
        stub.AcquireLease(pb.AcquireLeaseRequest(session_id=mine[group], holder="w"), timeout=10)
        forced = pb.ReleaseLeaseRequest(session_id=mine[group], holder="ops", force=True)
        stub.ReleaseLease(forced, timeout=10)
    for group, channel in (("g1", groups.channel1), ("g2", groups.channel2)):
        admin = apb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = admin.ListLeaseAudit(apb.ListLeaseAuditRequest(prefix=mine[group]), timeout=10)
        assert [(e.session_id, e.entry.actor) for e in reply.entries] == [(mine[group], "ops")]
        everything = admin.ListLeaseAudit(apb.ListLeaseAuditRequest(page_size=1000), timeout=10)
        owners = {groups.shard_map.owner(e.session_id).name for e in everything.entries}
        assert owners == {group}


def test_list_sessions_lists_the_groups_own(groups: Groups) -> None:
    """ListSessions scoped to the group (``x-sessionlog-scope: group``, what a cluster-wide
    listing forwards: tests/cluster/test_across_groups.py) returns only sessions its group
    owns."""
    append(groups.stub1, groups.session_of("g1", 5), user())
    reply = groups.stub1.ListSessions(
        pb.ListSessionsRequest(), metadata=(("x-sessionlog-scope", "group"),), timeout=TIMEOUT
    )
    assert reply.sessions
    assert {groups.shard_map.owner(s.session_id).name for s in reply.sessions} == {"g1"}


def test_a_listing_across_groups_sums_every_groups_usage(groups: Groups) -> None:
    """An unscoped ListSessions gathers both groups' sessions, each with its usage, and the
    page's usage_total sums them all; GetUsage answers on the owner's group only."""
    ids = {name: groups.session_of(name, 9) for name in ("g1", "g2")}
    for (name, session_id), stub in zip(ids.items(), (groups.stub1, groups.stub2), strict=True):
        spent = user()
        spent.usage.CopyFrom(event_pb2.Usage(model="m", input_tokens=10 if name == "g1" else 5))
        append(stub, session_id, spent)
    reply = groups.stub1.ListSessions(pb.ListSessionsRequest(page_size=1000), timeout=TIMEOUT)
    listed = {s.session_id: s.usage[0].input_tokens for s in reply.sessions if s.usage}
    assert listed == {ids["g1"]: 10, ids["g2"]: 5}
    assert [(u.model, u.input_tokens, u.event_count) for u in reply.usage_total] == [("m", 15, 2)]
    own = groups.stub2.GetUsage(pb.GetUsageRequest(session_id=ids["g2"]), timeout=TIMEOUT)
    assert own.usage[0].input_tokens == 5


def test_the_console_answers_421_for_another_groups_session(groups: Groups) -> None:
    """The web console's session API: 421 Misdirected Request with the error JSON."""
    foreign = groups.session_of("g2", 6)
    status, _, body = _web.get(f"http://{groups.http1}/api/sessions/{foreign}")
    assert status == 421
    assert body["reason"] == "WRONG_GROUP"
    assert body["metadata"]["group"] == "g2"
    status, _, _ = _web.get(f"http://{groups.http1}/api/sessions/{groups.session_of('g1', 6)}")
    assert status == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("epoch = 1\n[groups.g1]\nmembers = ['127.0.0.1:1']\nslots = ['0-100']\n", "owned by no"),
        ("this is not toml =", "not valid TOML"),
        (None, "cannot read the shard map"),
    ],
)
def test_a_bad_shard_map_stops_the_server_with_a_clear_message(
    tmp_path: Path, text: str | None, message: str
) -> None:
    """A map file that is invalid, unreadable or without this server's group: exit 2, one line."""
    path = tmp_path / "shards.toml"
    if text is not None:
        path.write_text(text)
    args = ["serve", "--data", str(tmp_path / "d"), "--listen", f"127.0.0.1:{free_port()}"]
    done = run_cli([*args, "--shard-map", str(path)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert "--shard-map" in done.stderr, done.stderr


def test_a_server_outside_every_group_does_not_start(groups: Groups, tmp_path: Path) -> None:
    """A valid map that does not list this server (nor its --group): exit 2, naming the cause."""
    args = ["serve", "--data", str(tmp_path / "d"), "--listen", f"127.0.0.1:{free_port()}"]
    done = run_cli([*args, "--shard-map", str(groups.map_path)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "lists this server's address" in done.stderr, done.stderr
    done = run_cli([*args, "--shard-map", str(groups.map_path), "--group", "g9"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "no group 'g9'" in done.stderr, done.stderr


def test_an_unsharded_server_owns_everything(server: RunningServer) -> None:
    """Without --shard-map: any session works, GetShardMap is epoch 0 with no groups."""
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for n in range(4):
            append(stub, f"any{n}", user())
        reply = stub.GetShardMap(pb.GetShardMapRequest(), timeout=TIMEOUT)
        assert (reply.shard_map.epoch, len(reply.shard_map.groups), reply.group) == (0, 0, "")
        reply_stats = stats(channel)
        assert (reply_stats.map_epoch, reply_stats.shard_group) == (0, "")
        assert reply_stats.owned_slots == 1024


def test_the_python_client_raises_wrong_group_with_the_owner(groups: Groups) -> None:
    """The Python client turns the refusal back into errors.WrongGroup, owner attached."""
    foreign = groups.session_of("g2", 7)
    raw = failure(groups.stub1.GetSession, pb.GetSessionRequest(session_id=foreign), timeout=5)
    error = to_error(raw)
    assert isinstance(error, client_errors.WrongGroup)
    assert isinstance(error, client_errors.FailedPrecondition)
    assert (error.group, error.primary, error.members) == ("g2", groups.g2, [groups.g2])
    assert (error.slot, error.map_epoch) == (slot_of(foreign), 7)


def test_a_fork_without_a_new_id_stays_in_its_parents_group(groups: Groups) -> None:
    """ForkSession with no session_id: the id the server makes up lies in the parent's group
    (not ``fork-<uuid>`` anywhere, which half the time named another group's slot; and not the
    empty id's slot 0, which refused g2's forks as CROSS_GROUP_FORK)."""
    for group, stub in (("g1", groups.stub1), ("g2", groups.stub2)):
        parent = groups.session_of(group, 8)
        append(stub, parent, user("fork me"))
        for _ in range(6):
            child = stub.ForkSession(
                pb.ForkSessionRequest(parent_session_id=parent), timeout=TIMEOUT
            ).session.session_id
            assert groups.shard_map.owner(child).name == group, (group, child)
            assert child.startswith("fork-")
            assert get(stub, child).event_count == 1


def test_the_body_not_the_header_decides_ownership(groups: Groups) -> None:
    """An x-session-id header naming one of g1's sessions does not let a call for a g2 session
    (named in the body) through g1."""
    mine, foreign = groups.session_of("g1", 9), groups.session_of("g2", 9)
    error = failure(
        groups.stub1.Append,
        pb.AppendRequest(session_id=foreign, events=[user("x")]),
        metadata=(("x-session-id", mine),),
        timeout=TIMEOUT,
    )
    check(error, FAILED, "WRONG_GROUP", session_id=foreign, group="g2")


def test_an_invalid_id_of_another_groups_slot_is_invalid_not_wrong_group(groups: Groups) -> None:
    """An id too long to be one: INVALID_SESSION_ID as on its owner, not a WRONG_GROUP that
    echoes it (its trailers of 15 KB broke the call with RESOURCE_EXHAUSTED at the client)."""
    long_id = next(
        f"{'x' * 5000}{n}"
        for n in range(100)
        if groups.shard_map.owner(f"{'x' * 5000}{n}").name == "g2"
    )
    error = failure(
        groups.stub1.GetSession, pb.GetSessionRequest(session_id=long_id), timeout=TIMEOUT
    )
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SESSION_ID")
