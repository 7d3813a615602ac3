"""The session log's use cases (service/usecases.py) over a real store, called as the servicer
and the console call them: a caller's token narrows what it reads, lists and writes, and a
refused write changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from sessionlog import errors
from sessionlog.service.auth import READ, WRITE, Principal
from sessionlog.service.usecases import Caller, SessionLog, SessionQuery
from sessionlog.shard.ownership import Ownership
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1.event_pb2 import EVENT_TYPE_USER_MESSAGE, Event

TENANT = Principal("tenant-a", frozenset({READ, WRITE}), session_prefix="a.")


def _cases(store: Store, primary: str = "") -> SessionLog:
    return SessionLog(
        store,
        Ownership(sharded=False),
        max_events_per_append=100,
        max_message_bytes=4 << 20,
        primary=primary,
    )


def _user(text: str) -> Event:
    event = Event(type=EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": text})
    return event


def _append(cases: SessionLog, session_id: str, caller: Caller | None = None) -> int:
    request = pb.AppendRequest(session_id=session_id, events=[_user("hi")])
    result = asyncio.run(cases.append(caller or Caller(), request))
    return result.next_seq


def test_a_token_reads_its_own_sessions_and_no_other(store: Store) -> None:
    """GetSession's use case: the tenant reads a.one with its usage; b.two is refused with
    PERMISSION_DENIED, and an invalid id with INVALID_SESSION_ID."""
    cases = _cases(store)
    assert _append(cases, "a.one") == 1
    assert _append(cases, "b.two") == 1
    read = cases.session(TENANT, "a.one")
    assert read.view.meta is not None
    assert read.view.meta.next_seq == 1
    assert read.usage == {}
    with pytest.raises(errors.PermissionDenied):
        cases.session(TENANT, "b.two")
    with pytest.raises(errors.PermissionDenied):
        cases.state(TENANT, "b.two")
    with pytest.raises(errors.InvalidSessionId):
        cases.reading(None, "")
    assert cases.session(None, "missing").usage is None


def test_a_listing_is_narrowed_to_the_token_and_pages_with_its_token(store: Store) -> None:
    """ListSessions' use case: the tenant lists only a.*, two at a time, the token of the
    first page continuing it; a page token of another listing is refused."""
    cases = _cases(store)
    for session_id in ("a.1", "a.2", "a.3", "b.1"):
        _append(cases, session_id)
    first = asyncio.run(cases.list_sessions(TENANT, SessionQuery(page_size=2)))
    assert [s.session_id for s in first.sessions] == ["a.1", "a.2"]
    assert first.next_page_token
    query = SessionQuery(page_size=2, page_token=first.next_page_token)
    rest = asyncio.run(cases.list_sessions(TENANT, query))
    assert [s.session_id for s in rest.sessions] == ["a.3"]
    assert rest.next_page_token == ""
    everyone = asyncio.run(cases.list_sessions(None, SessionQuery(after="a.3")))
    assert [s.session_id for s in everyone.sessions] == ["b.1"]
    with pytest.raises(errors.InvalidPageToken):
        asyncio.run(
            cases.list_sessions(None, SessionQuery(prefix="b.", page_token=first.next_page_token))
        )


def test_a_refused_write_changes_nothing(store: Store) -> None:
    """Append's use case: outside the token's prefix PERMISSION_DENIED, on a replica
    NOT_PRIMARY naming its primary; neither session gets an event."""
    with pytest.raises(errors.PermissionDenied):
        _append(_cases(store), "b.x", Caller(TENANT))
    with pytest.raises(errors.NotPrimary) as refused:
        _append(_cases(store, primary="127.0.0.1:5000"), "a.x", Caller(TENANT))
    assert refused.value.metadata["primary"] == "127.0.0.1:5000"
    assert store.next_seq("b.x") == 0
    assert store.next_seq("a.x") == 0
