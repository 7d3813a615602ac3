"""Session records on sharded servers: a cluster-wide listing applies the filter in every group
and merges by id, or newest first by (update_time desc, id); UpdateSession and a sub-agent child
check ownership like the other writes."""

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


def test_update_time_order_merges_every_groups_newest_first(
    groups: Groups,  # noqa: F811
) -> None:
    """Newest first across groups, page by page: sessions touched last in either group come
    first, each once; one group alone (x-sessionlog-scope: group) lists only its own."""
    stubs = {"g1": groups.stub1, "g2": groups.stub2}
    by_group = {
        name: [f"new{n}" for n in range(400) if groups.shard_map.owner(f"new{n}").name == name]
        for name in stubs
    }
    touched = [ids[i] for i in range(4) for ids in by_group.values()]  # g1, g2, g1, g2, ...
    for session_id in touched:
        append(stubs[groups.shard_map.owner(session_id).name], session_id, user("now"))
    assert {groups.shard_map.owner(s).name for s in touched} == {"g1", "g2"}
    found: list[str] = []
    token = ""
    while True:
        request = pb.ListSessionsRequest(
            order_by="update_time desc", prefix="new", page_size=3, page_token=token
        )
        reply = groups.stub1.ListSessions(request, timeout=TIMEOUT)
        found += [s.session_id for s in reply.sessions]
        token = reply.next_page_token
        if not token:
            break
    assert found == list(reversed(touched))
    alone = groups.stub1.ListSessions(
        pb.ListSessionsRequest(order_by="update_time desc", prefix="new"),
        metadata=SCOPE_GROUP,
        timeout=TIMEOUT,
    )
    mine = [s for s in reversed(touched) if groups.shard_map.owner(s).name == "g1"]
    assert [s.session_id for s in alone.sessions] == mine


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


def test_a_full_view_listing_carries_the_state_of_every_groups_sessions(
    groups: Groups,  # noqa: F811
) -> None:
    """ListSessions with SESSION_VIEW_FULL through g1 carries the state of g2's sessions too
    (the view goes to every group, in id order and newest first)."""
    stubs = {"g1": groups.stub1, "g2": groups.stub2}
    made = []
    for n in range(40):
        session_id = f"stv{n}"
        event = user("x")
        event.state_delta.update({"n": n})
        append(stubs[groups.shard_map.owner(session_id).name], session_id, event)
        made.append(session_id)
    assert {groups.shard_map.owner(s).name for s in made} == {"g1", "g2"}
    for order in ("", "update_time desc"):
        request = pb.ListSessionsRequest(
            prefix="stv", page_size=100, order_by=order, view=pb.SESSION_VIEW_FULL
        )
        reply = groups.stub1.ListSessions(request, timeout=TIMEOUT)
        got = {s.session_id: dict(s.state) for s in reply.sessions}
        assert got == {f"stv{n}": {"n": float(n)} for n in range(40)}


def test_a_merged_full_view_page_fits_the_message_limit(groups: Groups) -> None:  # noqa: F811
    """Sessions of both groups with 700 KiB of state each (8.4 MiB in all), listed through g1
    with page_size 100: the merged page of the groups' pages is cut to fit the 4 MiB message
    limit too, and the pages list every session once, in either order."""
    stubs = {"g1": groups.stub1, "g2": groups.stub2}
    ids = [f"bigst{n:03}" for n in range(200)]
    owned = {g: [s for s in ids if groups.shard_map.owner(s).name == g][:6] for g in stubs}
    made = {}
    for n, session_id in enumerate(sorted(owned["g1"] + owned["g2"])):
        event = user("x")
        event.state_delta.update({"blob": f"{n}" + "b" * (700 << 10)})
        append(stubs[groups.shard_map.owner(session_id).name], session_id, event)
        made[session_id] = event.state_delta["blob"]
    assert len(made) == 12
    for order in ("", "update_time desc"):
        request = pb.ListSessionsRequest(
            prefix="bigst", page_size=100, order_by=order, view=pb.SESSION_VIEW_FULL
        )
        listed: dict[str, str] = {}
        for _ in range(20):  # bounded: twelve sessions take far fewer pages
            reply = groups.stub1.ListSessions(request, timeout=TIMEOUT)
            assert reply.ByteSize() <= 4 << 20
            assert reply.sessions
            for session in reply.sessions:
                assert session.session_id not in listed
                listed[session.session_id] = session.state["blob"]
            request.page_token = reply.next_page_token
            if not request.page_token:
                break
        assert listed == made
