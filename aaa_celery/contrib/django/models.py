"""This app's tables, created by its migrations: those of
:func:`aaa_celery.contrib.django.effects.once` (the very tables :class:`aaa_celery.effects.EffectLog`
defines for SQLAlchemy, so a project that uses both reads one set of records), and the outbox of
the ``django.tasks`` backend (:class:`TaskCall`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models


class Effect(models.Model):
    """An effect applied once: its result, recorded under the call's tenant, tool and
    idempotency key (``key`` is ``<tenant>:<tool>:<idempotency key>``, see
    :class:`aaa_celery.effects.Scope`)."""

    key: models.TextField[str, str] = models.TextField(primary_key=True)
    call_id: models.TextField[str, str] = models.TextField()
    attempt: models.IntegerField[int, int] = models.IntegerField()
    result: models.TextField[str, str] = models.TextField()  # JSON text
    tenant: models.TextField[str | None, str | None] = models.TextField(null=True)  # None: no tenant
    tool: models.TextField[str | None, str | None] = models.TextField(null=True)  # None: a 0.2.0 row not yet moved

    class Meta:
        db_table = "aaa_effects"


class EffectFence(models.Model):
    """The highest attempt of a call this database has seen (an effect's fence)."""

    key: models.TextField[str, str] = models.TextField(primary_key=True)  # the call id
    fence: models.BigIntegerField[int, int] = models.BigIntegerField()

    class Meta:
        db_table = "aaa_effect_fences"


class TaskCall(models.Model):
    """A ``django.tasks`` call as :class:`~aaa_celery.contrib.django.tasks.GuardedBackend`
    enqueued it: the outbox row, written in the app's own transaction, and what a
    ``TaskResult`` shows beside the guard's store (its task, arguments and ``enqueued_at``).

    Its status, attempts and result are the guard store's; ``error_path`` and
    ``error_traceback`` add the class path and traceback of the exception the store names.
    """

    id: models.CharField[str, str] = models.CharField(primary_key=True, max_length=64)  # the call id
    backend: models.CharField[str, str] = models.CharField(max_length=100)
    task_path: models.TextField[str, str] = models.TextField()
    args: models.JSONField[Any, Any] = models.JSONField(default=list)
    kwargs: models.JSONField[Any, Any] = models.JSONField(default=dict)
    queue_name: models.CharField[str, str] = models.CharField(max_length=200)
    priority: models.IntegerField[int, int] = models.IntegerField(default=0)
    run_after: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(null=True)
    enqueued_at: models.DateTimeField[datetime, datetime] = models.DateTimeField()
    #: None until the message is with the broker: the rows the fleet drains
    published_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(null=True)
    error_path: models.TextField[str, str] = models.TextField(default="", blank=True)
    error_traceback: models.TextField[str, str] = models.TextField(default="", blank=True)

    class Meta:
        db_table = "aaa_django_tasks"
        indexes = [models.Index(fields=["published_at", "enqueued_at"], name="aaa_django_tasks_unsent")]
