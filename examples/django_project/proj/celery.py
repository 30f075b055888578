"""The project's Celery app (the usual Celery-with-Django layout).

Workers, one per pool, from ``examples/django_project``::

    AAA_REDIS_URL=redis://127.0.0.1:6379/0 celery -A proj worker -Q aaa.default,default -c 8
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def bind_tools(sender: Celery, **_: object) -> None:
    """Register the shop's tools as guarded tasks ``aaa.tool.<name>`` on queues ``aaa.<pool>``."""
    from shop.tools import handler

    handler.bind(sender)
