"""One OpenAI Agents SDK turn kept in sessionlog, with a stub model: no API key, no network.

The stub calls the ``lookup`` tool, then answers with what the tool returned; ``Runner.run``
stores the turn (the question, the call, its output, the answer) in the session.

    make run   # or: sessionlog serve (./sessionlog-data on 127.0.0.1:50051)
    python examples/openai_agents.py   # SESSIONLOG_SERVER=HOST:PORT, 127.0.0.1:50051 by default
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from sessionlog_client import AsyncClient
from sessionlog_client.openai_agents import SessionlogSession

SERVER = os.environ.get("SESSIONLOG_SERVER", "127.0.0.1:50051")


class StubModel(Model):
    """Calls ``lookup`` once, then answers with the tool's output (what a model would do)."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *a: Any,
        **k: Any,
    ) -> ModelResponse:
        last: Any = input[-1] if isinstance(input, list) else {"content": input}
        if last.get("type") == "function_call_output":
            text = ResponseOutputText(type="output_text", text=last["output"], annotations=[])
            answer = ResponseOutputMessage(
                id="msg_1", type="message", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[answer], usage=Usage(), response_id=None)
        call = ResponseFunctionToolCall(
            type="function_call", call_id="call_1", name="lookup", arguments='{"word": "LMDB"}'
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("this example does not stream")


@function_tool
def lookup(word: str) -> str:
    """Look a word up."""
    return f"{word} is a memory-mapped B+tree store."


async def main() -> None:
    agent = Agent(name="helper", instructions="Be brief.", model=StubModel(), tools=[lookup])
    async with AsyncClient(SERVER) as client:
        session = SessionlogSession("openai-agents-example", client)
        await session.clear_session()  # a second run starts over (the log keeps the first)
        quiet = RunConfig(tracing_disabled=True)  # no trace export: it would want an API key
        result = await Runner.run(agent, "What is LMDB?", session=session, run_config=quiet)
        print(result.final_output)
        print([item.get("type", "message") for item in await session.get_items()])
        print([m["role"] for m in await client.chat_messages("openai-agents-example")])


asyncio.run(main())
# -> LMDB is a memory-mapped B+tree store.
# -> ['message', 'function_call', 'function_call_output', 'message']
# -> ['user', 'assistant', 'tool', 'assistant']
