"""A fleet app whose at_most_once tools have a ``reconcile`` step (tests/worker/test_reconcile.py).

``AAA_FLEET_BROKER`` is the broker, the store and the effect ledger. Each body records its
effect in the ledger (the "called system") under its idempotency key, then works on for a
while, so a test can kill its worker after the effect.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.guard import Happened, NotHappened
from aaa_celery.testing import Ledger
from aaa_celery.tools import ToolHandler, ToolRegistry, tool

broker = os.environ.get("AAA_FLEET_BROKER", "redis://127.0.0.1:1/0")
app = Celery("reconcile_app", broker=broker, backend=broker, set_as_current=False)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
                aaa_guard={"lease_ttl_s": 2.0, "wait_poll_s": 0.25}, aaa_recovery_interval_s=1.0)
_ledger: list[Ledger] = []


def ledger() -> Ledger:
    if not _ledger or _ledger[0]._redis.connection_pool.pid != os.getpid():
        _ledger[:] = [Ledger(broker)]
    return _ledger[0]


def pay(amount: int, ctx: ToolContext) -> dict[str, Any]:
    ledger().record("start", ctx=ctx)
    ledger().record("effect", ctx=ctx, key=ctx.idempotency_key, amount=amount)  # the payment is made
    time.sleep(30)  # ... and the worker is killed before it reports
    return {"paid": amount}


def look_up(arguments: dict[str, Any], ctx: ToolContext) -> Any:
    """Ask the payment system by idempotency key."""
    made = [e for e in ledger().entries(ctx.call_id, "effect") if e.get("key") == ctx.idempotency_key]
    if made:
        return Happened({"paid": made[0]["amount"], "reconciled": True})
    return NotHappened("no payment with that key")


def cannot_tell(arguments: dict[str, Any], ctx: ToolContext) -> Any:
    return None


app.task(base=GuardedTask, name="rec.pay_found", delivery="at_most_once", reconcile=look_up)(pay)
app.task(base=GuardedTask, name="rec.pay_unknown", delivery="at_most_once", reconcile=cannot_tell)(pay)


@tool(delivery="at_most_once", reconcile=look_up)
def refund(amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund an amount (a tool with a reconcile step)."""
    return pay(amount, ctx)


ToolHandler(ToolRegistry([refund]), guard={"lease_ttl_s": 2.0, "wait_poll_s": 0.25}).bind(app)
