"""The Celery app of the effects tests: a refund tool writing to the shop's orders table
through :func:`aaa_celery.effects.once` (SQLAlchemy) or its Django variant.

Environment:
- ``AAA_EFFECTS_BROKER``: the Redis broker, also the guard's store and the ledger.
- ``AAA_EFFECTS_DB``: the shop's SQLAlchemy URL (SQLite or PostgreSQL); without it the
  tool goes through Django (``tests.effects.django_settings``, ``AAA_EFFECTS_PG``).

The tool's hooks, by argument: ``kill_after_commit`` kills the tool's own process (kill -9)
right after attempt 1's transaction committed, before the guard's finish; ``pause_s``
sleeps that long before attempt 1's transaction (a test freezes the worker then). The
ledger gets ``start``, ``applied`` (fn ran), ``committed`` and ``rejected`` (StaleFence).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery import Celery

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.fencing import StaleFence
from aaa_celery.testing import Ledger

BROKER = os.environ.get("AAA_EFFECTS_BROKER", "redis://127.0.0.1:1/0")
DB = os.environ.get("AAA_EFFECTS_DB")

if not DB:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.effects.django_settings")
    import django

    django.setup()

app = Celery("effects_app", broker=BROKER, backend=BROKER)
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"],
    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
    aaa_store_url=BROKER, aaa_guard={"lease_ttl_s": 2.0, "wait_poll_s": 0.25},
    aaa_recovery_interval_s=1.0,
)

_ledger: Ledger | None = None
_engines: dict[int, Any] = {}  # by pid: a forked pool child opens its own


def record(event: str, ctx: ToolContext, **fields: Any) -> None:
    global _ledger
    if _ledger is None or _ledger._redis.connection_pool.pid != os.getpid():
        _ledger = Ledger(BROKER)
    _ledger.record(event, ctx=ctx, **fields)


def engine() -> Any:
    if os.getpid() not in _engines:
        import sqlalchemy as sa

        _engines[os.getpid()] = sa.create_engine(DB)
    return _engines[os.getpid()]


def refund_sqlalchemy(order_id: str, cents: int, ctx: ToolContext) -> dict[str, Any]:
    import sqlalchemy as sa

    from aaa_celery.effects import once

    def apply(conn: Any) -> dict[str, Any]:
        record("applied", ctx)
        conn.execute(sa.text("UPDATE orders SET refunded_cents = refunded_cents + :c, refunds = refunds + 1"
                             " WHERE id = :id"), {"c": cents, "id": order_id})
        total = conn.execute(sa.text("SELECT refunded_cents FROM orders WHERE id = :id"), {"id": order_id}).scalar()
        return {"order_id": order_id, "refunded_cents": total, "attempt": ctx.attempt}

    with engine().begin() as conn:
        return once(conn, ctx, apply)


def refund_django(order_id: str, cents: int, ctx: ToolContext) -> dict[str, Any]:
    from django.db.models import F

    from aaa_celery.contrib.django.effects import once
    from tests.effects.shop.models import Order

    def apply() -> dict[str, Any]:
        record("applied", ctx)
        Order.objects.filter(id=order_id).update(refunded_cents=F("refunded_cents") + cents, refunds=F("refunds") + 1)
        total = Order.objects.get(id=order_id).refunded_cents
        return {"order_id": order_id, "refunded_cents": total, "attempt": ctx.attempt}

    return once(ctx, apply)


# on_lost_lease=finish: a thawed stale attempt surely reaches its transaction (the database refuses it)
@app.task(base=GuardedTask, name="effects.refund", guard={"on_lost_lease": "finish"})
def refund(order_id: str, cents: int, ctx: ToolContext, kill_after_commit: bool = False,
           pause_s: float = 0.0) -> dict[str, Any]:
    record("start", ctx)
    if ctx.attempt == 1 and pause_s:
        time.sleep(pause_s)
    try:
        value = (refund_sqlalchemy if DB else refund_django)(order_id, cents, ctx)
    except StaleFence:
        record("rejected", ctx)
        raise
    record("committed", ctx, value=value)
    if ctx.attempt == 1 and kill_after_commit:
        os.kill(os.getpid(), signal.SIGKILL)  # committed, and the guard never hears of it
    return value
