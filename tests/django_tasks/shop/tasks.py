"""The shop's ``django.tasks``, guarded. Each writes the ledger (Redis): ``start`` per attempt,
``effect`` when the refund is applied. ``hold_s`` sleeps in attempt 1 (a test kills the holder)."""

from __future__ import annotations

import os
import time
from typing import Any

from aaa_celery.contrib.django.tasks._api import TaskContext
from aaa_celery.testing import Ledger

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


def ledger() -> Ledger:
    return Ledger(os.environ.get("AAA_DT_BROKER", "redis://127.0.0.1:1/0"))


def _refund(context: TaskContext, order_id: str, hold_s: float) -> dict[str, Any]:
    call_id = context.task_result.id
    ledger().record("start", task_id=call_id, attempt=context.attempt)
    if context.attempt == 1 and hold_s:
        time.sleep(hold_s)
    ledger().record("effect", task_id=call_id, attempt=context.attempt, order_id=order_id)
    return {"order_id": order_id, "refunded": True, "attempt": context.attempt}


@task(takes_context=True)
def refund(context: TaskContext, order_id: str, hold_s: float = 0.0) -> dict[str, Any]:
    return _refund(context, order_id, hold_s)


@task(takes_context=True, delivery="at_most_once")
def refund_once(context: TaskContext, order_id: str, hold_s: float = 0.0) -> dict[str, Any]:
    return _refund(context, order_id, hold_s)


@task(takes_context=True)
def stamp(context: TaskContext) -> float:
    ledger().record("start", task_id=context.task_result.id, attempt=context.attempt)
    return time.time()


@task
async def ping(value: str) -> str:
    import asyncio

    await asyncio.sleep(0)
    return f"pong {value}"


@task
def fail(reason: str) -> None:
    raise LookupError(reason)
