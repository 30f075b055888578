"""A refund tool and the fake payment provider its tests use (docs/testing-your-tools.md).

The tool refunds an order at a payment provider, passing ``ctx.idempotency_key`` so that
the provider applies one refund per key whatever happens to the worker. In tests the
provider is :class:`FakePSP`, which records every body run and every refund it is asked
for through :mod:`aaa_celery.testing.effects`, so the test sees what really happened.

Run its tests with the plugin::

    pytest -p aaa_celery.testing.pytest_plugin --aaa-app examples.testing.refund_app examples/testing
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.testing import effects

app = Celery("refund_app", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    result_backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/0"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    # the store: the broker's Redis unless AAA_STORE_URL names another
    aaa_store_url=os.environ.get("AAA_STORE_URL") or None,
    # short leases and sweeps, so that a test sees a takeover within seconds
    aaa_guard={"lease_ttl_s": float(os.environ.get("REFUND_LEASE_TTL_S", "2")), "wait_poll_s": 0.25},
    aaa_recovery_interval_s=1.0,
)


class FakePSP:
    """The payment provider in tests: one refund per idempotency key, as a real one does."""

    def refund(self, ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
        effects.started(ctx, order_id=order_id)
        time.sleep(float(os.environ.get("REFUND_PSP_DELAY_S", "2")))  # the provider's round trip
        new = effects.apply(ctx, order_id=order_id, amount=amount)
        return effects.returned(ctx, {"order_id": order_id, "amount": amount, "new": new})


psp = FakePSP()


@app.task(base=GuardedTask, name="shop.refund", idempotency_key=lambda a: f"refund:{a['order_id']}")
def refund(order_id: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order (at_least_once: safe to run again, the provider dedupes by key)."""
    return psp.refund(ctx, order_id, amount)


@app.task(base=GuardedTask, name="shop.refund_once", delivery="at_most_once",
          idempotency_key=lambda a: f"refund:{a['order_id']}")
def refund_once(order_id: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """The same refund for a provider without idempotency keys: never run twice."""
    return psp.refund(ctx, order_id, amount)
