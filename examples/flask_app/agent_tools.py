"""The example's tools and a scripted stand-in for a model.

``refund`` moves money: it needs a person's approval and never runs twice
(``at_most_once``, keyed by the order). ``lookup_order`` is a plain read.
"""

from __future__ import annotations

import re

from aaa_celery.llm import FakeLLMClient, LLMRequest, LLMResponse
from aaa_celery.llm.fake import text, tool_call
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool

ORDERS = {"A-100": 30, "A-200": 125}


@tool
def lookup_order(order_id: str) -> dict[str, str | int]:
    """Look an order up: its amount paid."""
    if order_id not in ORDERS:
        raise KeyError(f"no order {order_id}")
    return {"order_id": order_id, "paid": ORDERS[order_id]}


@tool(requires_approval=True, delivery="at_most_once", idempotency_key=lambda a: f"refund:{a['order_id']}")
def refund(order_id: str, amount: int, ctx: ToolContext) -> str:
    """Refund an order (a person approves it first)."""
    # pass ctx.idempotency_key to the payment provider so a repeat cannot refund twice
    return f"refunded {amount} EUR on {order_id} (key {ctx.idempotency_key})"


registry = ToolRegistry([lookup_order, refund])
handler = ToolHandler(registry, pools={"default": 8})


def scripted_model(request: LLMRequest) -> LLMResponse:
    """Stands in for a real model: look the order up, refund what was paid, then answer."""
    task = next(m.content for m in request.messages if m.role == "user")
    order = (re.findall(r"[A-Z]-\d+", task) or ["A-100"])[0]
    tools = [m for m in request.messages if m.role == "tool"]
    if not tools:
        return tool_call("lookup_order", order_id=order)
    if len(tools) == 1 and not tools[0].is_error:
        paid = int(re.findall(r'"paid": (\d+)', tools[0].content)[0])
        return tool_call("refund", order_id=order, amount=paid)
    return text(tools[-1].content)


model = FakeLLMClient(scripted_model)
