"""The Celery app and the Pydantic AI tools of the Pydantic AI fleet tests (tests/contrib/test_pydantic_ai.py).

The web process (the test, or a child it kills) and the ``celery worker`` processes import this
module alike: making the ``GuardedToolset`` binds the tools on the app. Configured by one
environment variable, ``AAA_PAI_REDIS`` (broker, result backend and store).

Each tool body appends to an effect ledger (a Redis list) when it starts, with its process id,
so a test sees every body run, and knows whom to ``kill -9``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery
from pydantic_ai import FunctionToolset

from aaa_celery.contrib.pydantic_ai import GuardedToolset
from tests.fleet_apps import ProcessRedis, redis_app

ENV = "AAA_PAI_REDIS"
LEDGER_KEY = "aaa:test:pai-ledger"
#: This process's Redis client for the ledger.
ledger = ProcessRedis(ENV)


def note(tool: str, **fields: Any) -> int:
    """Append a body's start to the ledger; returns how many starts of ``tool`` with these fields
    the ledger held before (0: this is the first)."""
    before = len(read_ledger(ledger(), tool, **fields))
    ledger().rpush(LEDGER_KEY, json.dumps({"tool": tool, "pid": os.getpid(), "at": time.time(), **fields}))
    return before


def read_ledger(client: Any, tool: str | None = None, **fields: Any) -> list[dict[str, Any]]:
    entries = [json.loads(raw) for raw in client.lrange(LEDGER_KEY, 0, -1)]
    return [e for e in entries if tool in (None, e["tool"]) and all(e.get(k) == v for k, v in fields.items())]


tools: FunctionToolset[Any] = FunctionToolset()


@tools.tool_plain
def refund(order_id: str, amount: int) -> str:
    """Refund an order (money moves: never twice)."""
    note("refund", order_id=order_id)
    if order_id.startswith("slow"):
        time.sleep(100)  # the test kills its process
    elif order_id.startswith("nap"):
        time.sleep(4)  # long enough for the test to kill the web process meanwhile
    return f"refunded {amount} on {order_id}"


@tools.tool_plain
def search(query: str) -> list[str]:
    """Search the orders (a read: safe to run again)."""
    earlier = note("search", query=query)
    if not query.startswith("slow"):
        return [f"{query}: order A-100, paid 30 EUR"]
    if not earlier:
        time.sleep(100)  # the first attempt hangs: the test kills its process
    return [f"{query}: order A-100, paid 30 EUR", f"attempt {earlier + 1}"]


@tools.tool_plain
def wire(to: str, amount: int) -> str:
    """Wire money to an account (a person approves every wire)."""
    note("wire", to=to, amount=amount)
    return f"wired {amount} to {to}"


POLICIES = {
    "refund": {"delivery": "at_most_once"},
    "search": {"delivery": "at_least_once"},
    "wire": {"delivery": "at_most_once", "requires_approval": True},
}


def make_app(url: str) -> tuple[Celery, GuardedToolset]:
    app = redis_app("pydantic_ai_app", url)
    # a lease of 8 s: a pool child starved for a few seconds on a loaded 2-core machine keeps its call
    guarded = GuardedToolset(tools, app=app, policies=POLICIES, tenant=lambda ctx: ctx.deps,
                             guard={"lease_ttl_s": 8, "wait_poll_s": 0.25})
    return app, guarded


app, guarded = make_app(os.environ[ENV]) if ENV in os.environ else (None, None)
