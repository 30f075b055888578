"""The app that ``celery -A tests.cli.cli_app aaa ...`` runs with in the CLI tests.

``AAA_CLI_BROKER`` is its broker (also its store unless ``AAA_CLI_STORE`` is set);
``AAA_CLI_BACKEND`` its result backend (none by default). Tests in this process may change
``app.conf`` before they invoke a command.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from aaa_celery import GuardedTask
from aaa_celery.policy import Concurrency

app = Celery("cli_app", broker=os.environ.get("AAA_CLI_BROKER", "redis://127.0.0.1:1/0"), set_as_current=False)
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"], worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True, aaa_guard={"lease_ttl_s": 10},
)
if os.environ.get("AAA_CLI_BACKEND"):
    app.conf.result_backend = os.environ["AAA_CLI_BACKEND"]
if os.environ.get("AAA_CLI_STORE"):
    app.conf.aaa_store_url = os.environ["AAA_CLI_STORE"]


@app.task(base=GuardedTask, name="refund", delivery="at_most_once")
def refund(order: str) -> dict:
    return {"refunded": order}


@app.task(base=GuardedTask, name="report", timeout_s=60)
def report(n: int) -> int:
    time.sleep(0.01)
    return n


@app.task(base=GuardedTask, name="sync", concurrency=Concurrency(key="shop", limit=2))
def sync(shop: int) -> int:
    return shop
