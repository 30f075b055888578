"""``manage.py check`` for :class:`~aaa_celery.contrib.django.tasks.GuardedBackend` (Django's
system checks call ``backend.check()``). Each finding has an id:

- ``aaa_celery.E001``: no store (``aaa_store_url``, else a Redis broker).
- ``aaa_celery.W001``: the store cannot be reached now. A warning, so that ``migrate`` and
  ``runserver`` go on while its server is down (Django's own database checks, too, run only
  when asked); a worker waits for it.
- ``aaa_celery.E002``: a task with ``acks_late`` off (a dead worker's message is lost).
- ``aaa_celery.E003``: a task with ``reject_on_worker_lost`` off (the same, for a killed child).
- ``aaa_celery.E004``: a Redis ``visibility_timeout`` below a task's lease TTL (the broker
  redelivers a call while its holder still runs it).
- ``aaa_celery.E005``: a ``QUEUES`` name that no Celery queue of the app serves.
- ``aaa_celery.E006``: ``OPTIONS["APP"]`` missing or not importable.
- ``aaa_celery.E007``: ``"aaa_celery.contrib.django"`` not in ``INSTALLED_APPS`` (the outbox table).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.core import checks


def _error(n: int, msg: str, hint: str, backend: Any) -> checks.Error:
    return checks.Error(msg, hint=hint, obj=f"TASKS[{backend.alias!r}]", id=f"aaa_celery.E{n:03d}")


def _tasks(backend: Any) -> list[Any]:
    from .execute import DjangoTaskRunner

    # the registry as it is (app.tasks would finalize the app, and a worker checks while it starts)
    return [t for t in backend.app._tasks.values()
            if isinstance(t, DjangoTaskRunner) and t.django_backend == backend.alias]


def _store(backend: Any) -> list[checks.CheckMessage]:
    from ....errors import ConfigError

    try:
        backend.store().now()
    except ConfigError as e:
        return [_error(1, f"no guard store: {e}", "set the app's aaa_store_url (or use a Redis broker)", backend)]
    except Exception as e:
        return [checks.Warning(f"the guard's store cannot be reached: {type(e).__name__}: {e}",
                               hint="start its server (workers and enqueue need it)",
                               obj=f"TASKS[{backend.alias!r}]", id="aaa_celery.W001")]
    return []


def _acks(backend: Any, tasks: list[Any]) -> list[checks.CheckMessage]:
    found: list[checks.CheckMessage] = []
    for task in tasks:
        if not task.acks_late:
            found.append(_error(2, f"{task.name}: acks_late is off", "leave acks_late on (the guard sets it; "
                                "check task_annotations)", backend))
        if not task.reject_on_worker_lost:
            found.append(_error(3, f"{task.name}: reject_on_worker_lost is off", "leave reject_on_worker_lost "
                                "on (the guard sets it; check task_annotations)", backend))
    return found


def _visibility(backend: Any, tasks: list[Any]) -> list[checks.CheckMessage]:
    app = backend.app
    if urlsplit(str(app.conf.broker_url or "")).scheme.split("+")[0] not in ("redis", "rediss", "sentinel"):
        return []
    vt = float((app.conf.broker_transport_options or {}).get("visibility_timeout", 3600))
    longest = max((t.guard_config.lease_ttl_s for t in tasks), default=0.0)
    if vt >= longest:
        return []
    return [_error(4, f"the Redis broker's visibility_timeout ({vt:g} s) is below a lease TTL ({longest:g} s)",
                   "raise broker_transport_options['visibility_timeout'] above every lease_ttl_s", backend)]


def _queues(backend: Any) -> list[checks.CheckMessage]:
    conf = backend.app.conf
    served = {q.name for q in conf.task_queues} if conf.task_queues else {conf.task_default_queue}
    missing = sorted(q for q in backend.queues if q not in served)
    if not missing:
        return []
    return [_error(5, f"QUEUES {missing} are not queues of the Celery app (it has {sorted(served)})",
                   "add them to the app's task_queues and start workers with -Q naming them", backend)]


def check_backend(backend: Any) -> list[checks.CheckMessage]:
    """Every finding on ``backend``, in id order."""
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    found: list[checks.CheckMessage] = []
    if not apps.is_installed("aaa_celery.contrib.django"):
        found.append(_error(7, "the outbox's app is not installed",
                            "add 'aaa_celery.contrib.django' to INSTALLED_APPS and run manage.py migrate", backend))
    try:
        backend.app  # noqa: B018 - loads it
    except (ImproperlyConfigured, ImportError) as e:
        return [*found, _error(6, str(e), "set OPTIONS['APP'] to 'proj.celery:app'", backend)]
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")  # every app's tasks module, as Celery's autodiscovery imports them
    tasks = _tasks(backend)
    found[:0] = [*_store(backend), *_acks(backend, tasks), *_visibility(backend, tasks), *_queues(backend)]
    return found
