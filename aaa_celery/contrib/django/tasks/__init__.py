"""``django.tasks`` (Django 6.0+, or the ``django-tasks`` backport before Django 6) on a guarded
Celery fleet: every ``@task`` runs leased, numbered and fenced, and its ``TaskResult`` is read
from the guard's store (docs/django-tasks.md)::

    INSTALLED_APPS = [..., "django_tasks",            # the backport only (Django < 6)
                      "aaa_celery.contrib.django"]     # the outbox table: manage.py migrate
    TASKS = {"default": {
        "BACKEND": "aaa_celery.contrib.django.tasks.GuardedBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"APP": "proj.celery:app"},
    }}

    @task(delivery="at_most_once")               # Django 6.1 and the backport
    def refund(order_id: str) -> dict: ...

    result = refund.enqueue("A-100")             # READY; result.id is the guard's call id
    refund.get_result(result.id).attempts        # the guard's numbered attempts
"""

from __future__ import annotations

from .backend import GuardedBackend, GuardedTaskDef, guarded

__all__ = ["GuardedBackend", "GuardedTaskDef", "guarded"]
