"""The shop's tools, and a scripted stand-in for a model.

``cancel_order`` needs a person's approval and never runs twice; ``order_status`` is a read.
"""

from __future__ import annotations

from aaa_celery.llm import FakeLLMClient, LLMRequest, LLMResponse
from aaa_celery.llm.fake import text, tool_calls
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool


@tool
def order_status(order_id: str) -> str:
    """The order's shipping status."""
    return f"{order_id} is not shipped yet"


@tool(requires_approval=True, delivery="at_most_once")
def cancel_order(order_id: str, ctx: ToolContext) -> str:
    """Cancel an order and refund it (a person approves it first)."""
    return f"cancelled {order_id} for {ctx.tenant or 'the shop'}"


handler = ToolHandler(ToolRegistry([order_status, cancel_order]), pools={"default": 8})


def scripted(request: LLMRequest) -> LLMResponse:
    """Stands in for a real model: check the order and cancel it in one turn, then answer."""
    order = next(m.content for m in request.messages if m.role == "user").split()[-1]
    facts = [m.content for m in request.messages if m.role == "tool"]
    if not facts:
        return tool_calls(("order_status", {"order_id": order}), ("cancel_order", {"order_id": order}))
    return text("; ".join(facts))


model = FakeLLMClient(scripted)
