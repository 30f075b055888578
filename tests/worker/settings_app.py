"""A guarded app for the settings checks at worker start (``celery -A tests.worker.settings_app``).

``AAA_SETTINGS_BROKER`` is the broker; ``AAA_SETTINGS_CONF`` a JSON object of more settings
(``{"aaa_store_ulr": ...}``, ``{"aaa_store_url": "memory://"}``).
"""

from __future__ import annotations

import json
import os

from celery import Celery

from aaa_celery import GuardedTask

app = Celery("settings_app", broker=os.environ.get("AAA_SETTINGS_BROKER", "redis://127.0.0.1:1/0"))
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"], worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True, **json.loads(os.environ.get("AAA_SETTINGS_CONF") or "{}"),
)


@app.task(base=GuardedTask, name="settings.ping", shared=False)
def ping(x: int) -> int:
    return x
