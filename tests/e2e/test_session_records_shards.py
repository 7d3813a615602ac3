"""Session records on sharded servers: a cluster-wide listing applies the filter in every group
and merges by id; it refuses update-time order (one group at a time has it); UpdateSession and
a sub-agent child check ownership like the other writes."""

from __future__ import annotations

import grpc

from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import append, check, failure, user
from tests.e2e.test_shards import TIMEOUT, Groups, groups  # noqa: F401  (the module's servers)

SCOPE_GROUP = (("x-sessionlog-scope", "group"),)


def test_a_filter_lists_matches_of_every_group_in_id_order(groups: Groups) -> None:  # noqa: F811
    """Labelled sessions of both groups; a filtered listing through g1 lists all of them."""
    stubs = {"g1": groups.stub1, "g2": groups.stub2}
    labelled = []
    for n in range(12):
        session_id = f"lab{n}"
        owner = groups.shard_map.owner(session_id).name
        labels = {"kind": "even" if n % 2 == 0 else "odd"}
        stubs[owner].CreateSession(
            pb.CreateSessionRequest(session_id=session_id, labels=labels), timeout=TIMEOUT
        )
        if n % 2 == 0:
            labelled.append(session_id)
    assert {groups.shard_map.owner(s).name for s in labelled} == {"g1", "g2"}
    found: list[str] = []
    token = ""
    while True:
        request = pb.ListSessionsRequest(
            filter='labels.kind = "even"', page_size=2, page_token=token, prefix="lab"
        )
        reply = groups.stub1.ListSessions(request, timeout=TIMEOUT)
        found += [s.session_id for s in reply.sessions]
        token = reply.next_page_token
        if not token:
            break
    assert found == sorted(labelled)


def test_update_time_order_is_refused_across_groups_but_served_per_group(
    groups: Groups,  # noqa: F811
) -> None:
    by_time = pb.ListSessionsRequest(order_by="update_time desc")
    error = failure(groups.stub1.ListSessions, by_time, timeout=TIMEOUT)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ORDER_BY", sharded="true")
    mine = groups.session_of("g1", 7)
    append(groups.stub1, mine, user("newest"))
    reply = groups.stub1.ListSessions(by_time, metadata=SCOPE_GROUP, timeout=TIMEOUT)
    assert reply.sessions[0].session_id == mine


def test_updates_and_children_check_ownership(groups: Groups) -> None:  # noqa: F811
    """UpdateSession of another group's session is WRONG_GROUP; a child whose id lies in another
    group than its parent is CROSS_GROUP_FORK; neither writes anything."""
    foreign = groups.session_of("g2", 8)
    append(groups.stub2, foreign, user())
    update = pb.UpdateSessionRequest(session=pb.Session(session_id=foreign, title="x"))
    check(
        failure(groups.stub1.UpdateSession, update, timeout=TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
        "WRONG_GROUP",
        group="g2",
    )
    parent = groups.session_of("g1", 9)
    append(groups.stub1, parent, user())
    child = pb.CreateSessionRequest(session_id=groups.session_of("g2", 9), parent_session_id=parent)
    check(
        failure(groups.stub1.CreateSession, child, timeout=TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
        "CROSS_GROUP_FORK",
    )
    described = groups.stub2.GetSession(
        pb.GetSessionRequest(session_id=foreign), timeout=TIMEOUT
    ).session
    assert described.title == ""
