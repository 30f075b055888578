"""The Celery app of the engine's fleet tests, run by real ``celery worker`` processes.

Configured by one environment variable, so the workers and the test process
(``make_app(url)``, the engine's client app) build the same app:

- ``AAA_ENGINE_REDIS``: the Redis URL of the broker, the result backend and the store.

The tools append to an effect ledger (a Redis list) when their body runs, so a
test sees every body run, when it started and ended, and in which process.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

from aaa_celery.tools import ToolContext, ToolError, ToolHandler, ToolRegistry, tool
from tests.fleet_apps import ProcessRedis, redis_app

LEDGER_KEY = "aaa:test:engine-ledger"
ENV = "AAA_ENGINE_REDIS"
#: This process's Redis client for the ledger.
ledger = ProcessRedis(ENV)


def record(tool_name: str, event: str, ctx: ToolContext | None = None, **fields: Any) -> None:
    entry = {"tool": tool_name, "event": event, "pid": os.getpid(), "at": time.time(), **fields}
    if ctx is not None:
        entry.update(task_id=ctx.meta.get("task_id"), call_id=ctx.call_id, tenant=ctx.tenant)
    ledger().rpush(LEDGER_KEY, json.dumps(entry))


def read_ledger(client: Any, tool_name: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
    """The ledger's entries, optionally one tool's and one kind."""
    entries = [json.loads(raw) for raw in client.lrange(LEDGER_KEY, 0, -1)]
    return [e for e in entries if tool_name in (None, e["tool"]) and event in (None, e["event"])]


@tool
def lookup(order_id: str) -> str:
    """Look an order up (a plain read: at_least_once)."""
    return f"order {order_id}: paid 30 EUR"


@tool(delivery="at_most_once", idempotency_key=lambda a: f"charge:{a['order_id']}")
def charge(order_id: str, amount: int, ctx: ToolContext) -> str:
    """Charge a card (never twice)."""
    record("charge", "start", ctx)
    return f"charged {amount} for {order_id}"


@tool(requires_approval=True, delivery="at_most_once")
def wire(to: str, amount: int, ctx: ToolContext) -> str:
    """Wire money (a person must approve)."""
    record("wire", "start", ctx, to=to, amount=amount)
    return f"wired {amount} to {to}"


@tool
def nap(seconds: float, ctx: ToolContext) -> int:
    """Sleep in the default pool."""
    record("nap", "start", ctx)
    time.sleep(seconds)
    record("nap", "end", ctx)
    return os.getpid()


@tool(pool="slow")
def slow_nap(seconds: float, ctx: ToolContext) -> int:
    """Sleep in the slow pool."""
    record("slow_nap", "start", ctx)
    time.sleep(seconds)
    record("slow_nap", "end", ctx)
    return os.getpid()


@tool(delivery="at_most_once", timeout_s=120)
def hang(ctx: ToolContext) -> str:
    """Start an effect and hang (the test kills the process running it)."""
    record("hang", "start", ctx)
    time.sleep(110)
    return "never"


@tool
def whoami(ctx: ToolContext) -> dict[str, Any]:
    """Say which call this is."""
    record("whoami", "start", ctx)
    return {"tenant": ctx.tenant, "run_id": ctx.run_id, "call_id": ctx.call_id, "task_id": ctx.meta.get("task_id")}


@tool
def boom() -> str:
    """Fail cleanly."""
    raise ToolError("the account is frozen")


REGISTRY = ToolRegistry([lookup, charge, wire, nap, slow_nap, hang, whoami, boom])


def handler() -> ToolHandler:
    """The fleet's tools: ``default`` runs 4 calls at once, ``slow`` one.

    The lease TTL is the longest a pool child may go unheard before its attempt counts as
    lost: a child starved for 2 s on a loaded 2-core machine had its lease lapse, so recovery
    sent the call again (a nap ran twice; a charge was refused as ``OutcomeUnknown``). 10 s
    holds under load; only the lost-call test waits it out."""
    return ToolHandler(REGISTRY, pools={"default": 4, "slow": 1}, guard={"lease_ttl_s": 10, "wait_poll_s": 0.25})


def make_app(url: str) -> Celery:
    app = redis_app("fleet_engine_app", url)
    handler().bind(app)
    return app


app = make_app(os.environ[ENV]) if ENV in os.environ else None
