"""The Celery app of the Agents SDK fleet tests, run by real ``celery worker`` processes.

Configured by ``AAA_AGENTS_REDIS`` (broker, result backend and store), so the workers and
the test process build the same app. The tools are plain functions under a guard policy;
each appends to an effect ledger (a Redis list) when its body starts, with its pid.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool
from tests.fleet_apps import ProcessRedis, redis_app

ENV = "AAA_AGENTS_REDIS"
LEDGER_KEY = "aaa:test:agents-ledger"
#: This process's Redis client.
ledger = ProcessRedis(ENV)


def record(tool_name: str, **fields: Any) -> None:
    ledger().rpush(LEDGER_KEY, json.dumps({"tool": tool_name, "pid": os.getpid(), "at": time.time(), **fields}))


def read_ledger(client: Any, tool_name: str | None = None) -> list[dict[str, Any]]:
    entries = [json.loads(raw) for raw in client.lrange(LEDGER_KEY, 0, -1)]
    return [e for e in entries if tool_name in (None, e["tool"])]


def search(query: str) -> str:
    """Search the catalogue. A query starting with ``hang`` hangs on its first run only."""
    record("search", query=query)
    if query.startswith("hang") and ledger().incr(f"aaa:test:agents-hang:{query}") == 1:
        time.sleep(600)
    return f"3 results for {query}"


def refund(order_id: str, amount: int) -> str:
    """Refund an order. An order id starting with ``HANG`` hangs; ``SLOW`` takes 4 s."""
    record("refund", order_id=order_id, amount=amount)
    if order_id.startswith("HANG"):
        time.sleep(600)
    if order_id.startswith("SLOW"):
        time.sleep(4)
    return f"refunded {amount} EUR on {order_id}"


def transfer(to: str, amount: int) -> str:
    """Wire money (a person approves each transfer)."""
    record("transfer", to=to, amount=amount)
    return f"sent {amount} EUR to {to}"


def lookup(order_id: str, ctx: ToolContext) -> str:
    """Look an order up (a tool that reads its guard context: its ids)."""
    record("lookup", order_id=order_id, tool_call_id=ctx.tool_call_id, call_id=ctx.call_id)
    return f"order {order_id} is paid"


REGISTRY = ToolRegistry([
    tool(lookup),
    tool(search, delivery="at_least_once"),
    tool(refund, delivery="at_most_once"),
    tool(transfer, delivery="at_most_once", requires_approval=True),
])


def handler() -> ToolHandler:
    """Lease TTL 10 s: long enough for a pool child starved on a loaded 2-core machine."""
    return ToolHandler(REGISTRY, guard={"lease_ttl_s": 10, "wait_poll_s": 0.25})


def make_app(url: str) -> Celery:
    app = redis_app("agents_app", url)
    handler().bind(app)
    return app


app = make_app(os.environ[ENV]) if ENV in os.environ else None
