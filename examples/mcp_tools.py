"""The tools of the MCP example, imported by the workers and by the MCP server process.

    AAA_REDIS=redis://localhost:6379/0 celery --workdir examples -A mcp_tools worker -c 2
    AAA_REDIS=redis://localhost:6379/0 python examples/mcp_server.py
"""

from __future__ import annotations

import os

from celery import Celery

from aaa_celery.contrib.mcp import annotate
from aaa_celery.tools import ToolHandler, ToolRegistry, tool

REDIS = os.environ.get("AAA_REDIS", "redis://localhost:6379/0")


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: paid 30 EUR"


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refund an order (never twice)."""
    return f"refunded {amount_cents} on {order_id}"


@tool(requires_approval=True)
def wire(to: str, amount_cents: int) -> str:
    """Wire money; a person approves each wire."""
    return f"wired {amount_cents} to {to}"


annotate(lookup, read_only=True)  # at_least_once, no approval
annotate(refund)  # the MCP defaults: destructive, not idempotent -> at_most_once
annotate(wire)

handler = ToolHandler(ToolRegistry([lookup, refund, wire]))
app = Celery("mcp_example", broker=REDIS, backend=REDIS)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"], aaa_store_url=REDIS,
                worker_prefetch_multiplier=1)
handler.bind(app)
