"""A Pydantic AI agent whose tools run under the guard (docs/pydantic-ai.md).

``python examples/pydantic_ai_refund.py`` needs no network and no server: Pydantic AI's
``FunctionModel`` and ``TestModel`` stand in for the model, and the toolset runs its calls
on an in-process worker (the embedded default). On a fleet, pass ``app=celery_app`` to
``GuardedToolset`` and run ``celery -A <this module> worker``: the tools are the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from pydantic_ai import (
    Agent,
    FunctionToolset,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from aaa_celery.contrib.pydantic_ai import GuardedToolset, decide

tools: FunctionToolset[Any] = FunctionToolset()


@tools.tool_plain
def refund(order_id: str, amount_cents: int) -> str:
    """Refund an order (money moves: never twice)."""
    return f"refunded {amount_cents} cents on {order_id}"


@tools.tool_plain
def search(query: str) -> list[str]:
    """Search the orders (a read: safe to run again)."""
    return [f"{query}: paid 3000 cents on 2026-11-30"]


@tools.tool_plain
def wire(to: str, amount_cents: int) -> str:
    """Wire money to an account."""
    return f"wired {amount_cents} cents to {to}"


# The tool functions stay as they are; each gets a guard policy.
guarded = GuardedToolset(tools, tenant="acme", policies={
    "refund": {"delivery": "at_most_once"},
    "search": {"delivery": "at_least_once"},
    "wire": {"delivery": "at_most_once", "requires_approval": True},
})


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Search and refund in one response, then wire; answer with every result."""
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("search", {"query": "A-100"}),
                                    ToolCallPart("refund", {"order_id": "A-100", "amount_cents": 3000})])
    if len(messages) == 3:
        return ModelResponse(parts=[ToolCallPart("wire", {"to": "ACME", "amount_cents": 100})])
    results = [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart)]
    return ModelResponse(parts=[TextPart(" | ".join(map(str, results)))])


def a_person_approves() -> None:
    """Another thread (a web page, in a real app) shows the wire and approves it by its digest."""
    while True:
        for request in guarded.pending("order-A-100", tenant="acme"):
            print(f"approval asked: {request['tool']}({request['arguments']}), digest {request['digest'][:12]}…")
            decide(guarded.app, request, granted=True, digest=request["digest"])
            return
        time.sleep(0.05)


async def main() -> None:
    agent = Agent(FunctionModel(model), toolsets=[guarded], capabilities=[guarded.wait_for_approvals()])
    person = threading.Thread(target=a_person_approves)
    person.start()
    result = await agent.run("refund A-100", conversation_id="order-A-100")
    person.join()
    print("agent:", result.output)
    # the same conversation driven again (its web process died, say) runs no tool twice
    again = await agent.run("refund A-100", conversation_id="order-A-100")
    print("again:", again.output)
    # wrapping changes nothing for tools that do not fail: Pydantic AI's TestModel
    plain = await Agent(TestModel(call_tools=["refund", "search"]), toolsets=[tools]).run("go")
    wrapped = await Agent(TestModel(call_tools=["refund", "search"]), toolsets=[guarded]).run("go")
    print("same output with and without the guard:", plain.output == wrapped.output)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    finally:
        guarded.close()
