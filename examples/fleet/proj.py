"""A worker fleet for guarded tools: one Celery app, run by any number of workers.

Start Redis, two workers and a client (see README.md in this folder)::

    export BROKER_URL=redis://127.0.0.1:6379/0
    celery -A examples.fleet.proj worker -n w1@%h -c 2
    celery -A examples.fleet.proj worker -n w2@%h -c 2
    python -m examples.fleet.proj            # sends calls and prints their results

``kill -9`` a worker while a call runs: another worker runs attempt 2 within about
``lease_ttl_s`` plus the recovery interval (``refund`` reports ``OutcomeUnknown``).
"""

from __future__ import annotations

import os
import sys
import time

from celery import Celery
from kombu import Queue

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.tools import ToolHandler, ToolRegistry, tool

app = Celery("proj", broker=os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    result_backend=os.environ.get("RESULT_BACKEND") or app.conf.broker_url,
    # JSON only: bind() refuses an app that accepts pickle.
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    # A worker holds no message it cannot start (long tools).
    worker_prefetch_multiplier=1,
    # The guard's store: defaults to the broker's Redis; required for other brokers.
    aaa_store_url=os.environ.get("AAA_STORE_URL") or None,
    # Defaults for every guarded task; tools and tasks override them.
    aaa_guard={"lease_ttl_s": 10, "max_attempts": 3},
    # Each queue bound by its own name, so a message goes to one queue only.
    task_queues=[Queue("celery", routing_key="celery"), Queue("aaa.default", routing_key="aaa.default")],
)


@tool(idempotency_key=lambda a: f"report:{a['day']}")
def build_report(day: str, ctx: ToolContext) -> str:
    """Build a day's report (idempotent: safe to re-run as attempt 2)."""
    time.sleep(5)
    return f"report {day} built by attempt {ctx.attempt} (key {ctx.idempotency_key})"


@tool(delivery="at_most_once", idempotency_key=lambda a: f"refund:{a['order_id']}")
def refund(order_id: str, ctx: ToolContext) -> str:
    """Refund an order: never run twice; a lost attempt becomes OutcomeUnknown."""
    time.sleep(5)
    return f"refunded {order_id}"


# Tools become tasks aaa.tool.<name> on queue aaa.<pool>.
ToolHandler(ToolRegistry([build_report, refund])).bind(app)


# Any plain Celery task can be guarded too.
@app.task(base=GuardedTask, name="proj.resize", guard={"lease_ttl_s": 6})
def resize(image: str, ctx: ToolContext) -> str:
    time.sleep(3)
    return f"{image} resized (attempt {ctx.attempt})"


def main() -> None:
    calls = [
        app.tasks["aaa.tool.build_report"].delay(arguments={"day": "2024-06-01"}),
        app.tasks["aaa.tool.refund"].delay(arguments={"order_id": "A-100"}),
        resize.delay("cat.png"),
    ]
    for call in calls:
        try:
            print(call.id, "->", call.get(timeout=120))
        except Exception as e:  # noqa: BLE001 - OutcomeUnknown, ExecutionAbandoned, ToolError
            print(call.id, "->", type(e).__name__, e)
    sys.exit(0)


if __name__ == "__main__":
    main()
