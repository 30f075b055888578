"""The benchmarks' tools: a no-op for the overhead, three an agent calls for the engine."""

from __future__ import annotations

from aaa_celery.tools import ToolRegistry, tool


@tool
def noop(i: int) -> int:
    """Return i."""
    return i


@tool
def lookup(order_id: str) -> dict:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@tool
def score(order_id: str) -> float:
    """Score an order's risk."""
    return float(len(order_id)) / 10


@tool
def notify(order_id: str, text: str) -> str:
    """Notify the customer."""
    return f"sent to {order_id}: {text}"


registry = ToolRegistry([noop, lookup, score, notify])
agent_registry = ToolRegistry([lookup, score, notify])
