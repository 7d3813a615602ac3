"""One Google ADK turn kept in sessionlog, with a stub model: no API key, no network.

A ``Runner`` whose session service is sessionlog's runs an ``LlmAgent`` on a stub model (a
``BaseLlm`` subclass) that calls the ``lookup`` tool, then answers with what it returned; the
session holds the turn and the agent's ``output_key`` state.

    sessionlog serve --data ./data &
    python examples/google_adk.py   # SESSIONLOG_SERVER=HOST:PORT, 127.0.0.1:50051 by default
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types

from sessionlog_client import AsyncClient
from sessionlog_client.google_adk import SessionlogSessionService

SERVER = os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051")


class StubLlm(BaseLlm):
    """Calls ``lookup`` once, then answers with the tool's result (what a model would do)."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        results = [p.function_response for p in last.parts or [] if p.function_response]
        if results:
            text = str((results[0].response or {}).get("result"))
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        call = types.FunctionCall(id="call-1", name="lookup", args={"word": "LMDB"})
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(function_call=call)])
        )


def lookup(word: str) -> str:
    """Look a word up."""
    return f"{word} is a memory-mapped B+tree store."


async def main() -> None:
    agent = LlmAgent(
        name="helper", model=StubLlm(model="stub"), tools=[lookup], output_key="answer"
    )
    async with AsyncClient(SERVER) as client:
        service = SessionlogSessionService(client)
        runner = Runner(app_name="helper", agent=agent, session_service=service)
        await service.delete_session(app_name="helper", user_id="ann", session_id="adk-example")
        await service.create_session(app_name="helper", user_id="ann", session_id="adk-example")
        question = types.Content(role="user", parts=[types.Part(text="What is LMDB?")])
        turn = runner.run_async(user_id="ann", session_id="adk-example", new_message=question)
        async for event in turn:
            if event.is_final_response() and event.content and event.content.parts:
                print(event.content.parts[0].text)
        session = await service.get_session(
            app_name="helper", user_id="ann", session_id="adk-example"
        )
        assert session is not None
        print(len(session.events), "events, state", session.state)
        log_id = service.session_log_id("helper", "ann", "adk-example")
        print([m["role"] for m in await client.chat_messages(log_id)])


asyncio.run(main())
# -> LMDB is a memory-mapped B+tree store.
# -> 4 events, state {'answer': 'LMDB is a memory-mapped B+tree store.'}
# -> ['user', 'assistant', 'tool', 'assistant']
