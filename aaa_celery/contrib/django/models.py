"""The tables of :func:`aaa_celery.contrib.django.effects.once`, created by this app's migration.

They are the very tables :class:`aaa_celery.effects.EffectLog` defines for SQLAlchemy, so a
project that uses both reads one set of records.
"""

from __future__ import annotations

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
