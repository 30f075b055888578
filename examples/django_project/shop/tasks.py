"""The shop's background work as ``django.tasks``, run guarded on the Celery fleet
(``TASKS`` in settings.py names ``GuardedBackend``)::

    result = refund.enqueue("A-100", 500)      # in a view; inside an atomic() block it is sent on commit
    refund.get_result(result.id).status        # READY, RUNNING, SUCCESSFUL or FAILED, read from the store

A refund must never be paid twice: ``at_most_once`` makes a worker that dies mid-refund end
the call as FAILED (``aaa_celery.errors.OutcomeUnknown``) instead of running it again, for a
person to settle with ``celery aaa resolve``. ``@guarded`` carries the guard's options on every
Django version; on Django 6.1 (and the backport) ``@task(delivery=...)`` takes them as well.
"""

from __future__ import annotations

from aaa_celery.contrib.django.tasks import guarded

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task
@guarded(delivery="at_most_once", idempotency_key=lambda a: f"refund:{a['order_id']}")
def refund(order_id: str, cents: int) -> dict[str, object]:
    """Pay ``cents`` back on ``order_id`` (the payment provider's call goes here), once."""
    return {"order_id": order_id, "refunded_cents": cents}
