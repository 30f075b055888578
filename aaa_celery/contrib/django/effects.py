"""Effects applied once in a Django project's own database (see :mod:`aaa_celery.effects`).

With ``"aaa_celery.contrib.django"`` in ``INSTALLED_APPS`` and ``manage.py migrate`` run::

    from aaa_celery.contrib.django.effects import once

    @app.task(base=GuardedTask)
    def refund(order_id: str, ctx: ToolContext) -> dict:
        return once(ctx, lambda: mark_refunded(order_id))   # ORM writes inside fn

``fn`` runs inside ``transaction.atomic(using=using)``: its own transaction, or a savepoint
of yours if you called ``once`` inside an ``atomic`` block (the effect then commits with
your transaction). The promise and its limits are those of :func:`aaa_celery.effects.once`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction

from aaa_celery.context import ToolContext
from aaa_celery.effects import Scope, applied_once
from aaa_celery.fencing import StaleFence

__all__ = ["once"]

_T = TypeVar("_T")


class _DjangoRecords:
    """The effect records through the ORM, on the database ``using``."""

    def __init__(self, using: str) -> None:
        from .models import Effect, EffectFence

        self.using = using
        self.effects = Effect.objects.using(using)
        self.fences = EffectFence.objects.using(using)

    def _raise_fence(self, call_id: str, fence: int) -> bool:
        # the compare and the write in one UPDATE, which holds the row's lock to the end
        return bool(self.fences.filter(key=call_id, fence__lte=fence).update(fence=fence))

    def advance(self, call_id: str, fence: int) -> None:
        if self._raise_fence(call_id, fence):
            return
        try:
            with transaction.atomic(using=self.using):
                self.fences.create(key=call_id, fence=fence)
            return
        except IntegrityError:  # another attempt inserted the row first
            if self._raise_fence(call_id, fence):
                return
        highest = self.fences.filter(key=call_id).values_list("fence", flat=True).first()
        raise StaleFence(call_id, fence, highest)

    def recorded(self, scope: Scope) -> str | None:
        found = dict(self.effects.filter(key__in=[scope.key, scope.legacy]).values_list("key", "result"))
        text: str | None = found.get(scope.key, found.get(scope.legacy))
        return text

    def apply(self, scope: Scope, ctx: ToolContext, produce: Callable[[], str]) -> str:
        try:
            with transaction.atomic(using=self.using):
                text = produce()
                self.effects.create(key=scope.key, call_id=ctx.call_id, attempt=ctx.attempt, result=text,
                                    tenant=scope.tenant, tool=scope.tool)
            return text
        except IntegrityError:
            found = self.recorded(scope)
            if found is None:  # not our record's conflict: fn's own
                raise
            return found


def once(ctx: ToolContext, fn: Callable[[], _T], *, using: str | None = None, shared: str | None = None) -> _T:
    """Apply ``fn()`` at most once per tenant, tool and idempotency key, in one transaction with its record.

    Args:
        ctx: the running attempt's :class:`~aaa_celery.context.ToolContext`: its tenant, tool
            and idempotency key say where the record is kept.
        fn: the effect: it writes through the ORM (on ``using``) and returns a JSON value.
        using: the database alias (default: ``"default"``).
        shared: keep the record under this name instead of the tool's: tools that pass the
            same name share their records (within the tenant), as in :func:`aaa_celery.effects.once`.

    Returns:
        ``fn``'s value as JSON decodes it: from this run, or the one recorded by an earlier
        attempt or call of the same tenant and tool with the same idempotency key (``fn``
        does not run then). Another tenant's record is never returned.

    Raises:
        StaleFence: a newer attempt of this call has reached this database; nothing ran and
            the transaction is rolled back (yours too, unless you catch it inside it).
        ConfigError: ``ctx`` has no idempotency key (a direct call's context) or no tool.
    """
    db = using or DEFAULT_DB_ALIAS
    with transaction.atomic(using=db):
        return applied_once(_DjangoRecords(db), ctx, fn, shared)
