"""The Celery app of the page-less Django project (``celery -A tests.django_plain.celery_app``)."""

import os

from celery import Celery

from aaa_celery import GuardedTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_plain.settings")

app = Celery("django_plain")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(base=GuardedTask, name="plain.refund", delivery="at_most_once", shared=False)
def refund(order: str) -> dict:
    return {"refunded": order}


@app.task(base=GuardedTask, name="plain.lookup", shared=False)
async def lookup(order: str) -> dict:
    import asyncio

    await asyncio.sleep(0.01)
    return {"order": order, "status": "shipped"}
