"""The outbox: an ``enqueue`` is a row in the app's database, sent to the broker when the
app's transaction commits, and by the fleet when the process that wrote it died first.

Why an outbox rather than ``transaction.on_commit`` alone: a web process killed between
its commit and its publish loses an ``on_commit`` task, and the app believes it enqueued
it. The row commits with the app's own writes, so a rolled-back ``enqueue`` never runs
and a committed one is sent: by the committing process (``on_commit``, at once), or by a
worker of the fleet (:class:`OutboxStep`, after ``OUTBOX_GRACE_S``). A row sent twice
runs once: both copies carry the call id, and the guard lets one attempt hold a call.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any
from urllib.parse import urlsplit

from celery import bootsteps

log = logging.getLogger("aaa_celery.contrib.django.tasks")

#: Brokers whose priorities Celery uses, and whether a larger number runs sooner there.
#: Redis (``queue_order_strategy="priority"``, ``priority_steps``) runs 0 first; RabbitMQ
#: (a queue with ``x-max-priority``) runs 9 first. Other brokers ignore the priority.
PRIORITY_BROKERS = {"redis": False, "rediss": False, "sentinel": False, "amqp": True, "pyamqp": True,
                    "amqps": True}


def broker_priority(app: Any, priority: int) -> int | None:
    """Django's priority (-100..100, larger sooner) as the broker's 0..9, or None where the
    broker has no priorities."""
    scheme = urlsplit(str(app.conf.broker_url or "")).scheme.split("+")[0]
    if scheme not in PRIORITY_BROKERS:
        return None
    step = round((priority + 100) * 9 / 200)
    return step if PRIORITY_BROKERS[scheme] else 9 - step


def send(backend: Any, row: Any) -> None:
    """Publish ``row``'s call to its queue, under its call id (``run_after``: an ETA)."""
    from django.utils.module_loading import import_string

    task = import_string(row.task_path)
    celery_task = backend.celery_task(task)
    options: dict[str, Any] = {"task_id": row.id, "queue": row.queue_name}
    priority = broker_priority(backend.app, row.priority)
    if priority is not None and row.priority:
        options["priority"] = priority
    if row.run_after is not None:
        options["eta"] = row.run_after
    celery_task.apply_async(args=list(row.args), kwargs=dict(row.kwargs), **options)


def publish(backend: Any, call_id: str) -> None:
    """Send a committed row now (``on_commit``) and mark it sent. A failure is logged: the
    row stays unsent, and the fleet sends it."""
    from django.utils import timezone

    from ..models import TaskCall

    rows = TaskCall.objects.using(backend.database)
    try:
        row = rows.get(id=call_id)
        send(backend, row)
        rows.filter(id=call_id).update(published_at=timezone.now())
    except Exception:
        log.exception("aaa: could not send task %s now; the fleet sends it from the outbox", call_id)


def drain(backend: Any, grace_s: float, limit: int = 100) -> int:
    """Send the rows of ``backend`` left unsent for ``grace_s`` seconds (their writer died
    between its commit and its publish); returns how many. Rows another worker is sending
    are skipped (``SKIP LOCKED`` where the database has it)."""
    from django.db import transaction
    from django.utils import timezone

    from ..models import TaskCall

    db = backend.database
    before = timezone.now() - dt.timedelta(seconds=grace_s)
    sent = 0
    with transaction.atomic(using=db):
        rows = (TaskCall.objects.using(db).select_for_update(skip_locked=True)
                .filter(backend=backend.alias, published_at__isnull=True, enqueued_at__lt=before)
                .order_by("enqueued_at")[:limit])
        for row in rows:
            send(backend, row)
            TaskCall.objects.using(db).filter(id=row.id).update(published_at=timezone.now())
            sent += 1
    return sent


def guarded_backends() -> list[Any]:
    """This project's backends that keep an outbox (``GuardedBackend``'s ``outbox`` flag)."""
    from django.conf import settings

    from . import _api

    aliases = list(getattr(settings, "TASKS", {}) or {})
    return [b for b in (_api.task_backends[a] for a in aliases) if getattr(b, "outbox", False) is True]


class OutboxStep(bootsteps.StartStopStep):
    """A worker bootstep: a thread of the worker's main process that sends the outbox's
    forgotten rows every ``OUTBOX_INTERVAL_S`` (the fleet drains it: no daemon of its own)."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, worker: Any) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self.loop, name="aaa-django-outbox", daemon=True)
            self.thread.start()

    def loop(self) -> None:
        from django.db import connections

        interval = 5.0
        while not self.stopping.wait(interval):
            try:
                for backend in guarded_backends():
                    interval = float(backend.options.get("OUTBOX_INTERVAL_S", 5.0))
                    drain(backend, float(backend.options.get("OUTBOX_GRACE_S", 10.0)))
            except Exception:
                log.exception("aaa: the outbox sweep failed; it runs again in %s s", interval)
            finally:
                connections.close_all()  # this thread's own

    def stop(self, worker: Any) -> None:
        self.stopping.set()
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.join(timeout=10)


def attach(app: Any) -> None:
    """Have ``app``'s workers drain the outbox (idempotent)."""
    if OutboxStep not in app.steps["worker"]:
        app.steps["worker"].add(OutboxStep)
