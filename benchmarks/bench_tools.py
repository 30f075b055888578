"""The benchmarks' tools: a no-op (or a sleep) for the overhead, three an agent calls for the engine."""

from __future__ import annotations

import os
import time

from aaa_celery.tools import ToolRegistry, tool

#: The overhead tasks' body: a sleep this long (``BENCH_BODY_MS``), like a tool waiting on I/O.
BODY_S = float(os.environ.get("BENCH_BODY_MS") or 0) / 1000


def body(i: int) -> int:
    """The overhead benchmark's body: return i, after ``BODY_S`` of sleep."""
    if BODY_S:
        time.sleep(BODY_S)
    return i


@tool
def noop(i: int) -> int:
    """Return i."""
    return body(i)


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
