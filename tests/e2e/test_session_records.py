"""Session records end to end: UpdateSession (AIP-134 masks), CreateSession's title, labels,
owner, status and parent link, and ListSessions' filter, order_by and page tokens.

One server for the module; each test keeps to its own id prefix so the listings stay apart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import TOOL_CALL, Stub, append, check, ev, failure, get, say
from tests.e2e._proc import running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("records") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Stub:
    return server.stub()


def create(stub: Stub, session_id: str, **fields: object) -> pb.Session:
    session: pb.Session = stub.CreateSession(
        pb.CreateSessionRequest(session_id=session_id, **fields)  # type: ignore[arg-type]
    ).session
    return session


def update(stub: Stub, session: pb.Session, *paths: str) -> pb.Session:
    request = pb.UpdateSessionRequest(session=session)
    if paths:
        request.update_mask.CopyFrom(FieldMask(paths=list(paths)))
    updated: pb.Session = stub.UpdateSession(request).session
    return updated


def ids(stub: Stub, **fields: object) -> list[str]:
    """Every session a listing returns, page by page (page_size 2, to cross pages)."""
    out: list[str] = []
    token = ""
    while True:
        page = stub.ListSessions(
            pb.ListSessionsRequest(page_size=2, page_token=token, **fields)  # type: ignore[arg-type]
        )
        out += [s.session_id for s in page.sessions]
        token = page.next_page_token
        if not token:
            return out


# -- UpdateSession ------------------------------------------------------------------------------


def test_update_sets_only_the_masked_fields(stub: Stub) -> None:
    """A mask names what changes; the rest of the record and the log stay as they were."""
    created = create(stub, "u1", title="first", labels={"team": "core"}, owner="ana")
    assert (created.title, dict(created.labels), created.owner) == (
        "first",
        {"team": "core"},
        "ana",
    )
    given = pb.Session(session_id="u1", title="second", owner="bob", status="done")
    updated = update(stub, given, "title", "status")
    assert (updated.title, updated.owner, updated.status) == ("second", "ana", "done")
    assert dict(updated.labels) == {"team": "core"}
    assert updated.update_time.ToNanoseconds() > created.update_time.ToNanoseconds()
    assert updated.event_count == 0
    assert get(stub, "u1") == updated


def test_update_labels_whole_map_and_single_keys(stub: Stub) -> None:
    """ "labels" replaces the map; "labels.K" sets K, or removes it when the request lacks it."""
    create(stub, "u2", labels={"a": "1", "b": "2"})
    one = update(stub, pb.Session(session_id="u2", labels={"c": "3"}), "labels.c", "labels.a")
    assert dict(one.labels) == {"b": "2", "c": "3"}
    whole = update(stub, pb.Session(session_id="u2", labels={"z": "9"}), "labels")
    assert dict(whole.labels) == {"z": "9"}
    star = update(stub, pb.Session(session_id="u2", title="t"), "*")
    assert (star.title, dict(star.labels), star.owner) == ("t", {}, "")


def test_update_without_mask_sets_the_filled_fields(stub: Stub) -> None:
    """No mask: the settable fields the request fills, and nothing else."""
    create(stub, "u3", title="keep", owner="ana")
    updated = update(stub, pb.Session(session_id="u3", status="running"))
    assert (updated.title, updated.owner, updated.status) == ("keep", "ana", "running")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("event_count", "INVALID_UPDATE_MASK"),
        ("session_id", "INVALID_UPDATE_MASK"),
        ("parent_session_id", "INVALID_UPDATE_MASK"),
        ("update_time", "INVALID_UPDATE_MASK"),
        ("colour", "INVALID_UPDATE_MASK"),
        ("labels.-bad-", "INVALID_SESSION_FIELD"),
    ],
)
def test_update_refuses_paths_it_cannot_set(stub: Stub, path: str, reason: str) -> None:
    """Output-only, immutable and unknown paths fail INVALID_ARGUMENT and change nothing."""
    session_id = f"u4-{abs(hash(path))}"
    before = create(stub, session_id, title="same")
    error = failure(update, stub, pb.Session(session_id=session_id, title="x"), "title", path)
    check(error, INVALID, reason)
    assert get(stub, session_id) == before


@pytest.mark.parametrize(
    "session",
    [
        pb.Session(labels={"ok": "has space"}),
        pb.Session(labels={"UPPER/x": "1"}),
        pb.Session(status="not ok"),
        pb.Session(title="a\nb"),
        pb.Session(owner="x" * 300),
    ],
)
def test_update_refuses_bad_values(stub: Stub, session: pb.Session) -> None:
    """A value outside its rule fails INVALID_SESSION_FIELD and changes nothing."""
    session_id = f"u5-{abs(hash(session.SerializeToString()))}"
    before = create(stub, session_id)
    session.session_id = session_id
    check(failure(update, stub, session, "*"), INVALID, "INVALID_SESSION_FIELD")
    assert get(stub, session_id) == before


def test_update_of_a_missing_session_is_not_found(stub: Stub) -> None:
    error = failure(update, stub, pb.Session(session_id="u6-none", title="x"), "title")
    check(error, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND", session_id="u6-none")
    assert not get(stub, "u6-none").exists


def test_update_time_follows_appends_and_updates(stub: Stub) -> None:
    """update_time is the later of the last append and the last UpdateSession."""
    create(stub, "u7")
    appended = append(stub, "u7", say("hi"))
    after_append = get(stub, "u7")
    assert after_append.update_time == after_append.last_append_time
    assert appended.next_seq == 1
    updated = update(stub, pb.Session(session_id="u7", title="x"), "title")
    assert updated.update_time.ToNanoseconds() > updated.last_append_time.ToNanoseconds()


# -- sub-agent children -------------------------------------------------------------------------


def test_child_session_links_to_its_parent_and_tool_call(stub: Stub) -> None:
    """A child starts empty, names its parent and the spawning seq, and lists under it."""
    append(stub, "c-parent", say("do two things"), ev(TOOL_CALL, name="spawn"))
    first = create(stub, "c-kid-1", parent_session_id="c-parent", parent_seq=1, title="one")
    create(stub, "c-kid-2", parent_session_id="c-parent", parent_seq=1)
    create(stub, "c-other", title="unrelated")
    assert (first.parent_session_id, first.parent_seq, first.event_count) == ("c-parent", 1, 0)
    assert first.parent_event_count == 0
    assert first.HasField("parent_seq")
    assert get(stub, "c-kid-1") == first
    stub.ForkSession(pb.ForkSessionRequest(parent_session_id="c-parent", session_id="c-fork"))
    assert ids(stub, filter='parent = "c-parent"') == ["c-fork", "c-kid-1", "c-kid-2"]
    assert ids(stub, filter='parent = "c-kid-1"') == []


def test_child_of_a_missing_parent_or_past_its_end_is_refused(stub: Stub) -> None:
    """No parent: NOT_FOUND; a seq past the parent's end: BOUNDARY_OUT_OF_RANGE; nothing made."""
    error = failure(create, stub, "c-orphan", parent_session_id="c-nobody")
    check(error, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND", session_id="c-nobody")
    append(stub, "c-short", say("one"))
    error = failure(create, stub, "c-late", parent_session_id="c-short", parent_seq=1)
    check(error, INVALID, "BOUNDARY_OUT_OF_RANGE", at_seq=1, next_seq=1)
    error = failure(create, stub, "c-loose", parent_seq=0)
    check(error, INVALID, "INVALID_SESSION_FIELD", field="parent_seq")
    for session_id in ("c-orphan", "c-late", "c-loose"):
        assert not get(stub, session_id).exists


# -- ListSessions -------------------------------------------------------------------------------


def test_filters_by_labels_owner_status_and_time(stub: Stub) -> None:
    """Each kind of term, and terms joined by AND."""
    create(stub, "f.a", labels={"team": "core", "env": "prod"}, owner="ana", status="done")
    create(stub, "f.b", labels={"team": "core"}, owner="bob")
    create(stub, "f.c", labels={"team": "web", "env": "prod"}, owner="ana")
    middle = get(stub, "f.c").update_time.ToJsonString()
    create(stub, "f.d", status="done")

    def listed(text: str, **more: object) -> list[str]:
        return ids(stub, prefix="f.", filter=text, **more)

    assert listed('labels.team = "core"') == ["f.a", "f.b"]
    assert listed("labels.team = core AND owner = ana") == ["f.a"]
    assert listed("labels.env:*") == ["f.a", "f.c"]
    assert listed('labels.team != "core"') == ["f.c", "f.d"]
    assert listed('status = "done"') == ["f.a", "f.d"]
    assert listed('owner = "ana" AND labels.env = "prod"') == ["f.a", "f.c"]
    assert listed(f'update_time > "{middle}"') == ["f.d"]
    assert listed(f'update_time >= "{middle}"', order_by="update_time desc") == ["f.d", "f.c"]
    assert listed("") == ["f.a", "f.b", "f.c", "f.d"]


def test_order_by_update_time_newest_first(stub: Stub) -> None:
    """update_time desc lists the last touched first; an append or an update moves a session."""
    for name in ("o.1", "o.2", "o.3"):
        create(stub, name)
    assert ids(stub, prefix="o.", order_by="update_time desc") == ["o.3", "o.2", "o.1"]
    append(stub, "o.1", say("back"))
    assert ids(stub, prefix="o.", order_by="update_time desc") == ["o.1", "o.3", "o.2"]
    update(stub, pb.Session(session_id="o.2", title="now"), "title")
    assert ids(stub, prefix="o.", order_by="update_time desc") == ["o.2", "o.1", "o.3"]
    assert ids(stub, prefix="o.", order_by="session_id") == ["o.1", "o.2", "o.3"]


@pytest.mark.parametrize(
    "text",
    [
        "labels.team",
        'labels.team = "core" OR owner = "x"',
        "colour = red",
        'owner > "a"',
        'update_time > "yesterday"',
        'labels.team = "a" owner = "b"',
    ],
)
def test_bad_filters_are_invalid_filter(stub: Stub, text: str) -> None:
    error = failure(stub.ListSessions, pb.ListSessionsRequest(filter=text))
    check(error, INVALID, "INVALID_FILTER")


def test_bad_order_and_foreign_tokens_are_refused(stub: Stub) -> None:
    """An unknown order_by; a token used with another filter or order: INVALID_ARGUMENT."""
    for name in ("t.1", "t.2", "t.3"):
        create(stub, name, labels={"k": "v"})
    error = failure(stub.ListSessions, pb.ListSessionsRequest(order_by="title"))
    check(error, INVALID, "INVALID_ORDER_BY")
    by_id = stub.ListSessions(pb.ListSessionsRequest(prefix="t.", page_size=1))
    by_time = stub.ListSessions(
        pb.ListSessionsRequest(prefix="t.", page_size=1, order_by="update_time desc")
    )
    assert by_id.next_page_token
    assert by_time.next_page_token
    for token, fields in (
        (by_id.next_page_token, {"order_by": "update_time desc"}),
        (by_time.next_page_token, {}),
        (by_id.next_page_token, {"filter": "labels.k = v"}),
    ):
        request = pb.ListSessionsRequest(prefix="t.", page_token=token, **fields)  # type: ignore[arg-type]
        check(
            failure(stub.ListSessions, request), INVALID, "INVALID_PAGE_TOKEN", field="page_token"
        )


def test_paging_under_concurrent_appends(stub: Stub) -> None:
    """While others append and update, an id-order listing returns every session once, and an
    update-time listing never repeats one."""
    names = [f"w.{i:02}" for i in range(20)]
    for name in names:
        create(stub, name, labels={"batch": "w"})
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            append(stub, names[i % len(names)], say(str(i)))
            i += 1

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(3):
            assert ids(stub, prefix="w.") == names
            assert ids(stub, filter='labels.batch = "w"') == names
            by_time = ids(stub, prefix="w.", order_by="update_time desc")
            assert len(by_time) == len(set(by_time))
    finally:
        stop.set()
        writer.join()
    final = ids(stub, prefix="w.", order_by="update_time desc")
    times = [get(stub, name).update_time.ToNanoseconds() for name in final]
    assert sorted(final) == names
    assert times == sorted(times, reverse=True)


def test_create_retries_must_repeat_the_record(stub: Stub) -> None:
    """A create's request_id covers its labels and parent: the same request replays, another
    record under the same id is REQUEST_ID_REUSED."""
    first = create(stub, "r-idem", labels={"a": "1"}, request_id="rid-1")
    assert create(stub, "r-idem", labels={"a": "1"}, request_id="rid-1") == first
    error = failure(create, stub, "r-idem", labels={"a": "2"}, request_id="rid-1")
    check(error, INVALID, "REQUEST_ID_REUSED")
    assert dict(get(stub, "r-idem").labels) == {"a": "1"}


def test_owner_and_status_filters_follow_updates(stub: Stub) -> None:
    """Owner and status are indexed like labels: an update moves the session between them."""
    create(stub, "x.1", owner="ana", status="running")
    create(stub, "x.2", owner="ana", status="done")
    assert ids(stub, prefix="x.", filter='status = "running"') == ["x.1"]
    update(stub, pb.Session(session_id="x.1", status="done", owner="bob"), "status", "owner")
    assert ids(stub, prefix="x.", filter='status = "running"') == []
    assert ids(stub, prefix="x.", filter='status = "done"') == ["x.1", "x.2"]
    assert ids(stub, prefix="x.", filter='owner = "ana"') == ["x.2"]
    update(stub, pb.Session(session_id="x.2", owner=""), "owner")
    assert ids(stub, prefix="x.", filter='owner = "ana"') == []
    assert ids(stub, prefix="x.", filter='owner = ""') == ["x.2"]
