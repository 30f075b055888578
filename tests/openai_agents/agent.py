"""An Agents SDK agent against the local stub model server, with guarded or plain tools."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from aaa_celery.contrib.openai_agents import AgentTools

from ..llm.stub_server import Reply, openai_reply
from . import agents_app as aa

set_tracing_disabled(True)  # nothing is exported: the tests run offline

Call = tuple[str, str, Any]  # (the model's tool call id, tool, arguments: a dict, or raw JSON text)


class Script:
    """A stub model: turn n (the n-th model request of a conversation) makes ``turns[n]``'s
    tool calls; after the last, it answers with every tool output it was sent, joined."""

    def __init__(self, *turns: Sequence[Call]) -> None:
        self.turns = turns

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        n = sum(1 for m in messages if m["role"] == "assistant")
        if n < len(self.turns):
            return openai_reply(tool_calls=[(i, name, a if isinstance(a, str) else json.dumps(a))
                                            for i, name, a in self.turns[n]])
        return openai_reply(text="done: " + " | ".join(str(m["content"]) for m in messages if m["role"] == "tool"))


def model(base_url: str) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=base_url, api_key="stub", max_retries=0)
    return OpenAIChatCompletionsModel(model="stub-model", openai_client=client)


def guarded(guard: AgentTools, base_url: str) -> Agent[Any]:
    return Agent(name="support", instructions="Help the customer.", tools=list(guard.function_tools()),
                 model=model(base_url))


def plain(base_url: str) -> Agent[Any]:
    """The same agent with the SDK's own function tools of the same functions, unguarded."""
    return Agent(name="support", instructions="Help the customer.",
                 tools=[function_tool(t.fn) for t in aa.REGISTRY if t.context_param is None], model=model(base_url))


async def drive(guard: AgentTools, agent: Agent[Any], input: Any, run_id: str, tenant: str | None = None) -> Any:
    with guard.run(run_id, tenant=tenant):
        return await Runner.run(agent, input)
