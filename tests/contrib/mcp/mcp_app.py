"""The Celery app of the MCP tests, imported by the real ``celery worker`` processes and by
the test process (which serves it over MCP). ``AAA_MCP_REDIS`` is the Redis URL of the
broker, the result backend, the store and the effect ledger."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from aaa_celery.contrib.mcp import annotate
from aaa_celery.testing import Ledger
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool
from tests.fleet_apps import redis_app

ENV = "AAA_MCP_REDIS"
_ledger: Ledger | None = None


def ledger() -> Ledger:
    global _ledger
    if _ledger is None:
        _ledger = Ledger(os.environ[ENV], key="aaa:test:mcp-ledger")
    return _ledger


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: paid 30 EUR"


annotate(lookup, read_only=True)


@tool
def charge(order_id: str, amount: int, hold_s: float, ctx: ToolContext) -> str:
    """Charge a card (annotations left at the defaults: at_most_once)."""
    ledger().record("start", ctx=ctx, order_id=order_id)
    time.sleep(hold_s)
    ledger().record("end", ctx=ctx, order_id=order_id)
    return f"charged {amount} for {order_id}"


annotate(charge)  # the MCP defaults: destructive, not idempotent


@tool
def sync_index(name: str, hold_s: float, ctx: ToolContext) -> str:
    """Rebuild an index (idempotent: at_least_once, with the cap)."""
    ledger().record("start", ctx=ctx, name=name)
    time.sleep(hold_s if ctx.attempt == 1 else 0)
    ledger().record("end", ctx=ctx, name=name)
    return f"indexed {name}"


annotate(sync_index, idempotent=True, destructive=False)


@tool(delivery="at_least_once")
def long_job(seconds: float, ctx: ToolContext) -> str:
    """Work for a while."""
    ledger().record("start", ctx=ctx)
    time.sleep(seconds)
    ledger().record("end", ctx=ctx)
    return "done"


@tool(requires_approval=True)
def wire(to: str, amount: int, ctx: ToolContext) -> str:
    """Wire money (a person approves)."""
    ledger().record("start", ctx=ctx, to=to)
    return f"wired {amount} to {to}"


annotate(wire, open_world=True)


REGISTRY = ToolRegistry([lookup, charge, sync_index, long_job, wire])


def make_app(url: str) -> Celery:
    app = redis_app("mcp_app", url)
    handler().bind(app)
    return app


def handler() -> ToolHandler:
    # lease_ttl_s: a loaded 2-core machine may starve a pool child for seconds
    return HANDLER


HANDLER = ToolHandler(REGISTRY, pools={"default": 2}, guard={"lease_ttl_s": 6, "wait_poll_s": 0.25})
app = make_app(os.environ[ENV]) if ENV in os.environ else None


# -- remote tools: the stub MCP server's (tests/contrib/mcp/stub_server.py) ----------------------
STUB_ENV = "AAA_MCP_STUB_URL"


def remote_handler(stub_url: str) -> ToolHandler:
    """The stub server's tools as guarded tools (its server trusted, its annotations believed)."""
    from aaa_celery.contrib.mcp import RemoteServer, remote_tool

    stub = RemoteServer("stub", stub_url, trusted=True, tries=8, timeout_s=60)
    remote = ToolRegistry([
        remote_tool(stub, "pay"),  # no annotations: the defaults, at_most_once
        remote_tool(stub, "balance", annotations={"readOnlyHint": True}),
    ])
    return ToolHandler(remote, pools={"default": 2}, guard={"lease_ttl_s": 6, "wait_poll_s": 0.25})


if app is not None and STUB_ENV in os.environ:
    remote_handler(os.environ[STUB_ENV]).bind(app)
