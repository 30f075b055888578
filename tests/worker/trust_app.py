"""The Celery app of the trust tests (serializers, malformed messages, policy rules),
run in real ``celery worker`` processes. Configured from environment variables:

- ``AAA_TRUST_BROKER``: broker URL (required); also the result backend and the store.
- ``AAA_TRUST_STORE``: the store's URL (``aaa_store_url``), when not the broker's.
- ``AAA_TRUST_ACCEPT``: ``accept_content``, comma separated (default ``json``).
- ``AAA_TRUST_BUDGET``: the refund budget per customer and day (default 5), a
  ``Budget`` rule of the refund tool's ``GuardPolicy``.

Every body appends ``start`` to the ledger (on the broker's Redis) when it runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from celery import Celery
from kombu import Queue

from aaa_celery import GuardedTask, GuardPolicy, ToolContext
from aaa_celery.policy import Budget, Where
from aaa_celery.tools import ToolHandler, ToolRegistry, tool
from tests.fleet_apps import FLEET_CONF, ProcessLedger


def make_app(env: Mapping[str, str]) -> Celery:
    broker = env["AAA_TRUST_BROKER"]
    app = Celery("trust_app", broker=broker, backend=broker)
    app.conf.update(
        {**FLEET_CONF, "accept_content": (env.get("AAA_TRUST_ACCEPT") or "json").split(",")},
        aaa_guard={"lease_ttl_s": 5, "wait_poll_s": 0.25},
        aaa_recovery_interval_s=1,
    )
    if env.get("AAA_TRUST_STORE"):
        app.conf.aaa_store_url = env["AAA_TRUST_STORE"]
    app.conf.task_queues = [Queue("celery", routing_key="celery"), Queue("aaa.default", routing_key="aaa.default")]
    record = ProcessLedger(broker).record

    @app.task(base=GuardedTask, name="trust.ping", shared=False)  # no other app of the process gets it
    def ping(x: int, ctx: ToolContext) -> int:
        record("start", ctx)
        return x + 1

    @tool
    def echo(text: str, ctx: ToolContext) -> str:
        """Echo the text."""
        record("start", ctx)
        return text

    @tool
    def refund(customer_id: str, amount: int, ctx: ToolContext) -> str:
        """Refund a customer (slowly, so that calls overlap)."""
        record("start", ctx, customer_id=customer_id, amount=amount)
        time.sleep(0.3)
        return f"refunded {amount} to {customer_id}"

    policy = GuardPolicy(rules=[
        Where(tools="refund", check="amount <= 500"),
        Budget(tools="refund", amount="amount", limit=float(env.get("AAA_TRUST_BUDGET") or 5), by="customer_id",
               name="refunds per customer and day"),
    ])
    ToolHandler(ToolRegistry([echo, refund]), guards=policy).bind(app)
    return app


app = make_app(os.environ) if "AAA_TRUST_BROKER" in os.environ else None
