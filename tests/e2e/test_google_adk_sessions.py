"""sessionlog_client.google_adk against a real server and Google ADK itself: the session-service
scenarios of ADK's own tests (create, get with its filters, list, delete, state scopes, stale
appends), events that round trip exactly, the conversation DeriveMessages shows, and a Runner
turn with a stub model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event as AdkEvent
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, errors
from sessionlog_client.convert import struct_to_dict
from sessionlog_client.google_adk import SessionlogSessionService
from sessionlog_client.v1.message_pb2 import Role
from tests.e2e._proc import run_cli_here, running_server

_ids = count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each test uses its own app name."""
    folder: Path = tmp_path_factory.mktemp("google-adk")
    with running_server(folder / "data") as server:
        yield server


def new_app() -> str:
    return f"app-{next(_ids)}"


def run(
    running: RunningServer,
    test: Callable[[SessionlogSessionService, AsyncClient], Awaitable[None]],
) -> None:
    """Run ``test(service, client)`` on a fresh loop with a service and a raw client."""

    async def main() -> None:
        async with AsyncClient(running.address) as client:
            service = SessionlogSessionService(client)
            await test(service, client)

    asyncio.run(main())


def said(author: str, text: str, **fields: Any) -> AdkEvent:
    role = "user" if author == "user" else "model"
    content = types.Content(role=role, parts=[types.Part(text=text)])
    return AdkEvent(invocation_id="inv-1", author=author, content=content, **fields)


def delta(**state: Any) -> EventActions:
    return EventActions(state_delta=state)


# -- ids ------------------------------------------------------------------------------------------


def test_an_id_past_the_limit_is_refused_before_writing(running: RunningServer) -> None:
    """A session id that cannot fit sessionlog's 235 bytes is a ValueError; nothing is written."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        with pytest.raises(ValueError, match="235"):
            await service.create_session(app_name=app, user_id="u", session_id="x" * 240)
        pages = [p async for p in client.list_sessions(prefix=f"adk.s.{app}.")]
        assert [s for p in pages for s in p.sessions] == []

    run(running, test)


# -- create, get, list, delete -------------------------------------------------------------------


def test_create_get_list_delete(running: RunningServer) -> None:
    """The lifecycle of ADK's in-memory service: created sessions are got and listed without
    events, a deleted one is neither, and deleting it twice is fine."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        first = await service.create_session(
            app_name=app, user_id="ann", state={"k": "v"}, session_id="s1"
        )
        assert (first.id, first.user_id, first.state, first.events) == ("s1", "ann", {"k": "v"}, [])
        made = await service.create_session(app_name=app, user_id="ann")
        assert len(made.id) == 36  # a UUID
        await service.create_session(app_name=app, user_id="bob", session_id="s1")
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=app, user_id="ann", session_id="s1")

        got = await service.get_session(app_name=app, user_id="ann", session_id="s1")
        assert got is not None
        assert (got.id, got.state, got.events) == ("s1", {"k": "v"}, [])
        assert got.last_update_time == pytest.approx(first.last_update_time)
        assert await service.get_session(app_name=app, user_id="ann", session_id="nope") is None
        assert await service.get_session(app_name=app, user_id="bob", session_id=made.id) is None

        listed = await service.list_sessions(app_name=app, user_id="ann")
        assert sorted(s.id for s in listed.sessions) == sorted(["s1", made.id])
        everyone = await service.list_sessions(app_name=app)
        assert sorted((s.user_id, s.id) for s in everyone.sessions) == sorted(
            [("ann", "s1"), ("ann", made.id), ("bob", "s1")]
        )
        assert all(s.events == [] for s in everyone.sessions)
        times = [s.last_update_time for s in everyone.sessions]
        assert times == sorted(times)

        await service.append_event(got, said("user", "old life"))
        await service.delete_session(app_name=app, user_id="ann", session_id="s1")
        await service.delete_session(app_name=app, user_id="ann", session_id="s1")
        assert await service.get_session(app_name=app, user_id="ann", session_id="s1") is None
        listed = await service.list_sessions(app_name=app, user_id="ann")
        assert [s.id for s in listed.sessions] == [made.id]
        erased = await client.get_session(service.session_log_id(app, "ann", "s1"))
        assert not erased.session.exists  # DeleteSession: the log itself is gone
        assert [e async for e in client.since(service.session_log_id(app, "ann", "s1"))] == []

        again = await service.create_session(
            app_name=app, user_id="ann", session_id="s1", state={"fresh": 1}
        )
        assert again.state == {"fresh": 1}
        back = await service.get_session(app_name=app, user_id="ann", session_id="s1")
        assert back is not None
        assert (back.state, back.events) == ({"fresh": 1}, [])
        await service.append_event(back, said("user", "new life"))
        for config in (None, GetSessionConfig(num_recent_events=5)):
            reborn = await service.get_session(
                app_name=app, user_id="ann", session_id="s1", config=config
            )
            assert reborn is not None
            assert [
                e.content.parts[0].text for e in reborn.events if e.content and e.content.parts
            ] == ["new life"]

    run(running, test)


def test_events_round_trip_and_show_as_the_conversation(running: RunningServer) -> None:
    """Appended events come back equal to what was appended (function calls, responses and
    thoughts included), and DeriveMessages shows the conversation they make."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        session = await service.create_session(app_name=app, user_id="u", session_id="talk")
        call = types.FunctionCall(id="call-1", name="lookup", args={"q": "lmdb", "n": 2})
        answer = types.FunctionResponse(id="call-1", name="lookup", response={"hits": [1, 2.5]})
        appended = [
            said("user", "What is LMDB?"),
            AdkEvent(
                invocation_id="inv-1",
                author="helper",
                content=types.Content(
                    role="model",
                    parts=[
                        types.Part(text="let me look", thought=True),
                        types.Part(function_call=call),
                    ],
                ),
            ),
            AdkEvent(
                invocation_id="inv-1",
                author="helper",
                content=types.Content(role="user", parts=[types.Part(function_response=answer)]),
            ),
            said("helper", "A key-value store.", actions=delta(done=True)),
            AdkEvent(invocation_id="inv-1", author="helper", actions=delta(step=1)),
        ]
        for ev in appended:
            await service.append_event(session, ev)
        got = await service.get_session(app_name=app, user_id="u", session_id="talk")
        assert got is not None
        assert got.events == appended
        assert got.state == {"done": True, "step": 1}

        log_id = service.session_log_id(app, "u", "talk")
        derived = await client.derive_messages(log_id)
        shown = [(m.role, m.content, m.reasoning_content) for m in derived.messages]
        assert shown[0][:2] == (Role.ROLE_USER, "What is LMDB?")
        assert shown[1][0] == Role.ROLE_ASSISTANT
        assert shown[1][2] == "let me look"
        assert struct_to_dict(derived.messages[1].tool_calls[0])["function"] == {
            "name": "lookup",
            "arguments": '{"q": "lmdb", "n": 2}',
        }
        assert derived.messages[2].role == Role.ROLE_TOOL
        assert derived.messages[2].tool_call_id == "call-1"
        assert shown[3][:2] == (Role.ROLE_ASSISTANT, "A key-value store.")
        assert len(derived.messages) == 4  # the state-only event is bookkeeping

    run(running, test)


def test_a_complete_event_and_bytes_round_trip(running: RunningServer) -> None:
    """An event with every kind of field ADK's own test sets (bytes, grounding, usage,
    transcriptions, a set of ids, actions) reads back equal, and the session got back equals the
    one appended through, state, time and storage marker included."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        session = await service.create_session(app_name=app, user_id="u", state={"k": 1})
        assert await service.get_session(app_name=app, user_id="u", session_id=session.id) == (
            session
        )
        picture = types.Content(
            role="user",
            parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")],
        )
        grounding = types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
        )
        complete = AdkEvent(
            invocation_id="invocation",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text="test_text")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(
                artifact_delta={"file": 0},
                transfer_to_agent="agent",
                escalate=True,
                state_delta={"n": 2.5},
            ),
            long_running_tool_ids={"tool1", "tool2"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="input transcription", finished=True),
            output_transcription=types.Transcription(text="output transcription", finished=True),
        )
        await service.append_event(
            session,
            AdkEvent(
                invocation_id="invocation",
                author="user",
                content=picture,
                grounding_metadata=grounding,
            ),
        )
        await service.append_event(session, complete)
        got = await service.get_session(app_name=app, user_id="u", session_id=session.id)
        assert got is not None
        assert got.events[0].content == picture
        assert got.events[0].grounding_metadata == grounding
        assert got == session

    run(running, test)


def test_concurrent_stale_writers_one_wins(running: RunningServer) -> None:
    """Two appends through copies of one read race: one is stored, the other is
    StaleSessionError, and the log holds exactly the winners' deltas and events."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        made = await service.create_session(app_name=app, user_id="u")
        rounds = 5
        for i in range(rounds):
            latest = await service.get_session(app_name=app, user_id="u", session_id=made.id)
            assert latest is not None
            one, two = latest.model_copy(deep=True), latest.model_copy(deep=True)
            results = await asyncio.gather(
                service.append_event(one, AdkEvent(author="user", actions=delta(**{f"a{i}": 1}))),
                service.append_event(two, AdkEvent(author="user", actions=delta(**{f"b{i}": 2}))),
                return_exceptions=True,
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            assert len(failed) == 1
            assert isinstance(failed[0], StaleSessionError)
        final = await service.get_session(app_name=app, user_id="u", session_id=made.id)
        assert final is not None
        assert len(final.events) == rounds
        for i in range(rounds):
            assert (f"a{i}" in final.state) != (f"b{i}" in final.state)

    run(running, test)


def test_get_with_num_recent_events_and_after_timestamp(running: RunningServer) -> None:
    """num_recent_events keeps the latest N (0: none), after_timestamp the events from that time
    on, both as ADK's in-memory service applies them."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        session = await service.create_session(app_name=app, user_id="u", session_id="long")
        appended = [said("user", f"m{i}", timestamp=1000.0 + i) for i in range(250)]
        for ev in appended:
            await service.append_event(session, ev)

        async def get(**config: Any) -> list[AdkEvent]:
            found = await service.get_session(
                app_name=app, user_id="u", session_id="long", config=GetSessionConfig(**config)
            )
            assert found is not None
            return found.events

        assert await get(num_recent_events=3) == appended[-3:]
        assert await get(num_recent_events=0) == []
        assert await get(num_recent_events=1000) == appended
        assert await get(after_timestamp=1245.0) == appended[245:]
        assert await get(after_timestamp=1245.5) == appended[246:]
        assert await get(after_timestamp=0.0) == appended
        assert await get(num_recent_events=10, after_timestamp=1247.0) == appended[247:]
        assert await get() == appended

        log_id = service.session_log_id(app, "u", "long")
        newest = (await client.last_events(log_id, 1))[0].seq
        await client.hide(log_id, newest - 1, newest - 1)  # another writer hides one event
        shown = appended[:-2] + appended[-1:]
        fresh = await service.get_session(app_name=app, user_id="u", session_id="long")
        assert fresh is not None
        assert fresh.events == shown
        assert await get(num_recent_events=3) == shown[-3:]
        assert await get(after_timestamp=1247.0) == shown[-2:]
        with pytest.raises(ValueError, match="num_recent_events"):
            GetSessionConfig(num_recent_events=-1)

    run(running, test)


# -- state -----------------------------------------------------------------------------------------


def test_state_scopes_across_sessions_and_users(running: RunningServer) -> None:
    """app: keys are shared by every session of the app, user: keys by every session of one user,
    plain keys stay in their session, temp: keys are never stored."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        a1 = await service.create_session(
            app_name=app,
            user_id="ann",
            session_id="a1",
            state={"app:theme": "dark", "user:lang": "en", "mine": 1, "temp:x": 9},
        )
        assert a1.state == {"app:theme": "dark", "user:lang": "en", "mine": 1}
        a2 = await service.create_session(app_name=app, user_id="ann", session_id="a2")
        b1 = await service.create_session(app_name=app, user_id="bob", session_id="b1")
        assert a2.state == {"app:theme": "dark", "user:lang": "en"}
        assert b1.state == {"app:theme": "dark"}

        ev = said(
            "helper",
            "ok",
            actions=delta(**{"app:count": 2, "user:lang": "fr", "here": "a2", "temp:t": 1}),
        )
        await service.append_event(a2, ev)
        assert a2.state["temp:t"] == 1  # the in-memory session sees temp keys for its invocation
        assert "temp:t" not in ev.actions.state_delta

        async def state_of(user: str, sid: str) -> dict[str, Any]:
            found = await service.get_session(app_name=app, user_id=user, session_id=sid)
            assert found is not None
            return found.state

        assert await state_of("ann", "a1") == {
            "app:theme": "dark",
            "app:count": 2,
            "user:lang": "fr",
            "mine": 1,
        }
        assert await state_of("ann", "a2") == {
            "app:theme": "dark",
            "app:count": 2,
            "user:lang": "fr",
            "here": "a2",
        }
        assert await state_of("bob", "b1") == {"app:theme": "dark", "app:count": 2}
        assert await service.get_user_state(app_name=app, user_id="ann") == {"lang": "fr"}
        assert await service.get_user_state(app_name=app, user_id="bob") == {}

        listed = await service.list_sessions(app_name=app, user_id="bob")
        assert listed.sessions[0].state == {"app:theme": "dark", "app:count": 2}
        everyone = await service.list_sessions(app_name=app)
        assert {(s.user_id, s.id): s.state for s in everyone.sessions} == {
            ("ann", "a1"): await state_of("ann", "a1"),
            ("ann", "a2"): await state_of("ann", "a2"),
            ("bob", "b1"): await state_of("bob", "b1"),
        }
        log_state = await client.get_state(service.session_log_id(app, "ann", "a2"))
        assert log_state["here"] == "a2"
        assert "app:count" not in log_state
        assert await client.get_state(service.app_log_id(app)) == {"theme": "dark", "count": 2}

    run(running, test)


class CallCounter(AsyncClient):
    """An AsyncClient that counts the GetState and ListSessions calls made through it."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.states = self.listings = 0

    async def get_state_with_count(self, *args: Any, **kwargs: Any) -> Any:
        self.states += 1
        return await super().get_state_with_count(*args, **kwargs)

    async def list_sessions(self, *args: Any, **kwargs: Any) -> Any:
        self.listings += 1
        async for page in super().list_sessions(*args, **kwargs):
            yield page


def test_listing_every_user_reads_the_scopes_once_not_per_user(running: RunningServer) -> None:
    """list_sessions of an app whose 30 sessions belong to 30 users reads the app state once
    and the user states from one listing, not two GetState calls per user; each session
    still shows its own user's state."""

    async def main() -> None:
        client = CallCounter(running.address)
        async with client:
            service, app = SessionlogSessionService(client), new_app()
            for n in range(30):
                state = {"user:n": n, "app:k": "a"} if n == 0 else {"user:n": n}
                await service.create_session(
                    app_name=app, user_id=f"u{n}", session_id="s", state=state
                )
            client.states = client.listings = 0
            everyone = await service.list_sessions(app_name=app)
            assert sorted((s.user_id, s.state["user:n"]) for s in everyone.sessions) == sorted(
                (f"u{n}", n) for n in range(30)
            )
            assert all(s.state["app:k"] == "a" for s in everyone.sessions)
            assert (client.states, client.listings) == (1, 2)

    asyncio.run(main())


def test_listing_every_user_fits_large_user_states_in_the_client_limit(
    running: RunningServer,
) -> None:
    """Users whose states together pass the client's message limit are still all listed: the
    listing of the user state logs reads smaller pages (each user's state alone fits, as a
    GetState per user did)."""

    async def main() -> None:
        async with AsyncClient(running.address, max_message_bytes=1 << 20) as client:
            service, app = SessionlogSessionService(client), new_app()
            for n in range(12):
                state = {"user:big": f"{n}" + "x" * 100_000}
                await service.create_session(
                    app_name=app, user_id=f"u{n}", session_id="s", state=state
                )
            everyone = await service.list_sessions(app_name=app)
            assert sorted(
                (s.user_id, s.state["user:big"][:2]) for s in everyone.sessions
            ) == sorted((f"u{n}", f"{n}x"[:2]) for n in range(12))

    asyncio.run(main())


def test_append_event_updates_last_update_time_and_skips_partial(running: RunningServer) -> None:
    """last_update_time becomes the event's timestamp, in the object and as stored; a partial
    event is not stored."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        session = await service.create_session(app_name=app, user_id="u", session_id="t")
        await service.append_event(
            session, said("user", "hi", timestamp=session.last_update_time + 5)
        )
        assert session.last_update_time == pytest.approx(session.events[-1].timestamp)
        await service.append_event(session, said("helper", "par", partial=True))
        got = await service.get_session(app_name=app, user_id="u", session_id="t")
        assert got is not None
        assert got.last_update_time == pytest.approx(session.last_update_time)
        assert [e.content.parts[0].text for e in got.events if e.content and e.content.parts] == [
            "hi"
        ]
        listed = await service.list_sessions(app_name=app, user_id="u")
        assert listed.sessions[0].last_update_time == pytest.approx(session.last_update_time)

    run(running, test)


def test_an_event_delivered_again_is_stored_once(running: RunningServer) -> None:
    """append_event is idempotent for an equal re-delivery (ADK's in-memory rule): the event and
    its deltas are stored once; another event that merely shares the id is kept."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        session = await service.create_session(app_name=app, user_id="u", session_id="again")
        first = said("user", "once", id="fixed", actions=delta(**{"n": 1, "user:seen": 1}))
        await service.append_event(session, first)
        await service.append_event(session, first)
        assert len(session.events) == 1
        fresh = await service.get_session(app_name=app, user_id="u", session_id="again")
        assert fresh is not None
        await service.append_event(fresh, said("user", "later", actions=delta(**{"user:seen": 2})))
        await service.append_event(fresh, first)  # a late retry changes nothing
        other = said("user", "same id, other event", id="fixed")
        await service.append_event(fresh, other)
        got = await service.get_session(app_name=app, user_id="u", session_id="again")
        assert got is not None
        assert [e.id for e in got.events] == ["fixed", fresh.events[1].id, "fixed"]
        assert got.events[2] == other
        assert got.state == {"n": 1, "user:seen": 2}

    run(running, test)


def test_a_stale_session_append_fails_and_writes_nothing(running: RunningServer) -> None:
    """Appending through a session object another writer has moved past is StaleSessionError;
    through a deleted or unknown session, SessionNotFoundError."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        one = await service.create_session(app_name=app, user_id="u", session_id="s")
        two = await service.get_session(app_name=app, user_id="u", session_id="s")
        assert two is not None
        await service.append_event(one, said("user", "first"))
        with pytest.raises(StaleSessionError):
            await service.append_event(two, said("user", "second", actions=delta(x=1)))
        got = await service.get_session(app_name=app, user_id="u", session_id="s")
        assert got is not None
        assert [e.content.parts[0].text for e in got.events if e.content and e.content.parts] == [
            "first"
        ]
        assert "x" not in got.state
        await service.append_event(got, said("user", "third"))  # a fresh read appends fine

        await service.delete_session(app_name=app, user_id="u", session_id="s")
        with pytest.raises(SessionNotFoundError):
            await service.append_event(got, said("user", "gone"))
        ghost = got.model_copy(update={"id": "never"})
        with pytest.raises(SessionNotFoundError):
            await service.append_event(ghost, said("user", "nowhere"))

    run(running, test)


def test_the_cli_prints_the_adk_events(running: RunningServer) -> None:
    """`sessionlog items` prints each stored ADK event as its JSON with its seq, and `sessionlog
    messages` the conversation; a deleted session prints nothing."""
    app = new_app()

    async def write(service: SessionlogSessionService, client: AsyncClient) -> None:
        session = await service.create_session(app_name=app, user_id="u", session_id="cli")
        await service.append_event(session, said("user", "q", id="e1"))
        await service.append_event(session, said("helper", "a", id="e2"))

    run(running, write)
    log_id = SessionlogSessionService("127.0.0.1:1").session_log_id(app, "u", "cli")
    shown = run_cli_here(["items", log_id, "--server", running.address])
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(line["seq"], line["event"]["id"]) for line in lines] == [(1, "e1"), (2, "e2")]
    assert lines[0]["event"]["content"] == {"role": "user", "parts": [{"text": "q"}]}
    transcript = run_cli_here(["messages", log_id, "--server", running.address])
    assert transcript.stdout.splitlines() == ["[1] user: q", "[2] assistant: a"]

    async def erase(service: SessionlogSessionService, client: AsyncClient) -> None:
        await service.delete_session(app_name=app, user_id="u", session_id="cli")

    run(running, erase)
    gone = run_cli_here(["items", log_id, "--server", running.address])
    assert gone.stdout == ""


def test_a_tenant_token_keeps_the_service_inside_its_prefix(tmp_path: Path) -> None:
    """With prefix= the tenant's prefix, a tenant token creates and reads its sessions; outside
    it, the token is refused and nothing is written."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\nname = "tenant-a"\ntoken = "tenant-a-secret-0d9c2e7f"\n'
        'permissions = ["read", "write"]\nsession_prefix = "tenant-a."\n'
    )
    secret = "tenant-a-secret-0d9c2e7f"

    async def main(address: str) -> None:
        inside = SessionlogSessionService(address, prefix="tenant-a.adk.", token=secret)
        outside = SessionlogSessionService(address, prefix="tenant-b.adk.", token=secret)
        try:
            made = await inside.create_session(app_name="x", user_id="u", state={"app:k": 1})
            got = await inside.get_session(app_name="x", user_id="u", session_id=made.id)
            assert got is not None
            assert got.state == {"app:k": 1}
            with pytest.raises(errors.PermissionDenied):
                await outside.create_session(app_name="x", user_id="u")
            with pytest.raises(errors.PermissionDenied):
                await outside.list_sessions(app_name="x")
        finally:
            await inside.close()
            await outside.close()

    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as server:
        asyncio.run(main(server.address))


# -- an ADK agent run with a stub model ----------------------------------------------------------


def lookup(q: str) -> dict[str, Any]:
    """Look a term up."""
    return {"answer": f"{q} is a key-value store"}


class StubLlm(BaseLlm):
    """Calls ``lookup`` when the last content is the user's, then answers with its result."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        responses = [p.function_response for p in last.parts or [] if p.function_response]
        if responses:
            text = str((responses[0].response or {}).get("answer"))
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        call = types.FunctionCall(id="call-9", name="lookup", args={"q": "LMDB"})
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(function_call=call)])
        )


def test_a_runner_turn_is_stored_with_its_state(running: RunningServer) -> None:
    """Runner.run_async with the service: the session holds the user's message, the call, its
    result and the answer, the output_key state delta is the server's state, and a second turn
    sees the first one's history."""

    async def test(service: SessionlogSessionService, client: AsyncClient) -> None:
        app = new_app()
        agent = LlmAgent(
            name="helper", model=StubLlm(model="stub"), tools=[lookup], output_key="last_answer"
        )
        runner = Runner(app_name=app, agent=agent, session_service=service)
        session = await service.create_session(app_name=app, user_id="u", session_id="run")
        question = types.Content(role="user", parts=[types.Part(text="What is LMDB?")])
        texts = [
            p.text
            async for ev in runner.run_async(user_id="u", session_id="run", new_message=question)
            for p in (ev.content.parts if ev.content and ev.content.parts else [])
            if p.text
        ]
        assert texts == ["LMDB is a key-value store"]
        got = await service.get_session(app_name=app, user_id="u", session_id=session.id)
        assert got is not None
        assert got.state["last_answer"] == "LMDB is a key-value store"
        assert [e.author for e in got.events] == ["user", "helper", "helper", "helper"]
        log_id = service.session_log_id(app, "u", "run")
        assert (await client.get_state(log_id))["last_answer"] == "LMDB is a key-value store"
        derived = await client.derive_messages(log_id)
        assert next(m.content for m in derived.messages) == "What is LMDB?"
        assert derived.messages[-1].content == "LMDB is a key-value store"
        assert derived.messages[2].tool_call_id == "call-9"

        again = types.Content(role="user", parts=[types.Part(text="And again?")])
        async for _ in runner.run_async(user_id="u", session_id="run", new_message=again):
            pass
        after = await service.get_session(app_name=app, user_id="u", session_id="run")
        assert after is not None
        assert len(after.events) == 8

    run(running, test)


def test_the_sync_runner_works_on_a_service_given_an_address(running: RunningServer) -> None:
    """Runner.run (ADK runs it on an event loop of its own, in a thread) with a service made from
    the server's address: the service opens a client for each loop, and the turn is stored."""
    app = new_app()
    service = SessionlogSessionService(running.address)
    agent = LlmAgent(name="helper", model=StubLlm(model="stub"), tools=[lookup])
    runner = Runner(app_name=app, agent=agent, session_service=service)

    async def create() -> None:
        try:
            await service.create_session(app_name=app, user_id="u", session_id="sync")
        finally:
            await service.close()

    asyncio.run(create())
    question = types.Content(role="user", parts=[types.Part(text="What is LMDB?")])
    events = list(runner.run(user_id="u", session_id="sync", new_message=question))
    assert events[-1].content is not None
    assert events[-1].content.parts is not None
    assert events[-1].content.parts[0].text == "LMDB is a key-value store"

    async def read() -> int:
        try:
            got = await service.get_session(app_name=app, user_id="u", session_id="sync")
            assert got is not None
            return len(got.events)
        finally:
            await service.close()

    assert asyncio.run(read()) == 4
