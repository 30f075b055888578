"""The Celery app of the example's fleet (used when ``AAA_REDIS_URL`` is set).

Run one worker per pool, from this directory::

    AAA_REDIS_URL=redis://127.0.0.1:6379/0 celery -A worker worker -Q aaa.default -c 8
"""

from __future__ import annotations

import os

from celery import Celery

from agent_tools import handler

url = os.environ.get("AAA_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("flask_example", broker=url, backend=url)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    # the guard's store: the same Redis, or AAA_STORE_URL (examples/fleet.sh: PostgreSQL)
    aaa_store_url=os.environ.get("AAA_STORE_URL") or url,
)
handler.bind(app)
