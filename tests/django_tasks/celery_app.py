"""The fleet's Celery app (``celery -A tests.django_tasks.celery_app worker``), as a Django
project writes it: settings from Django, task modules found by ``autodiscover_tasks``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_tasks.settings")
BROKER = os.environ.get("AAA_DT_BROKER", "redis://127.0.0.1:1/0")

app = Celery("django_tasks_fleet", broker=BROKER)
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"], task_default_queue="default",
    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
    aaa_store_url=os.environ.get("AAA_DT_STORE") or BROKER,
    aaa_guard={"lease_ttl_s": 2.0, "wait_poll_s": 0.25}, aaa_recovery_interval_s=1.0,
)
app.autodiscover_tasks(["tests.django_tasks.shop"])
