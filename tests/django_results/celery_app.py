"""A Django shop's Celery app with django-celery-results (``result_backend="django-db"``) and
the guard's store in Django's PostgreSQL database (``celery -A tests.django_results.celery_app
worker``; Celery's Django fix-up sets Django up in the worker)."""

import os

from celery import Celery

from aaa_celery import GuardedTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_results.settings")

app = Celery("django_results", broker=os.environ.get("AAA_DR_BROKER", "redis://127.0.0.1:1/0"))
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"], worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True, result_backend="django-db", result_extended=True,
    task_track_started=True, aaa_store_url=os.environ.get("AAA_DR_STORE"), aaa_guard={"lease_ttl_s": 5.0},
)


@app.task(base=GuardedTask, name="dr.add")
def add(x: int) -> int:
    return x + 1


@app.task(name="dr.plain")
def plain(x: int) -> int:
    return x + 1
