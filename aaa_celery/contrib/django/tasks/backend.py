"""``GuardedBackend``: a ``django.tasks`` backend whose tasks run guarded on a Celery fleet."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, router, transaction
from django.utils import timezone

from ....config import validate_overrides
from ....errors import ConfigError
from ..._web import load
from . import _api, checks, outbox
from .results import task_result

#: ``@task`` keyword arguments this backend takes (Django 6.1 and the backport pass them on).
GUARD_FIELDS = ("delivery", "max_attempts", "idempotency_key", "guard")


if TYPE_CHECKING:
    _Task = _api.Task[Any, Any]
else:  # Django 6's Task is not generic at run time (the backport's and the stubs' are)
    _Task = _api.Task


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GuardedTaskDef(_Task):
    """A ``@task`` with the guard's options (``task_class`` of :class:`GuardedBackend`)::

        @task(delivery="at_most_once", max_attempts=1, guard={"lease_ttl_s": 30},
              idempotency_key=lambda a: f"refund:{a['order_id']}")
        def refund(order_id: str) -> dict: ...

    On Django 6.0, whose ``@task`` passes no further arguments on, put :func:`guarded`
    under ``@task`` instead.
    """

    delivery: str | None = None
    """``at_least_once`` (default: a lost attempt runs again) or ``at_most_once``."""
    max_attempts: int | None = None
    """Attempts before a lost call ends as ``ExecutionAbandoned`` (``guard.max_attempts``)."""
    idempotency_key: Callable[[dict[str, Any]], str] | None = None
    """The call's key from its arguments by name (default: the call id)."""
    guard: dict[str, Any] | None = None
    """Further ``GuardConfig`` fields (``lease_ttl_s``, ``heartbeat_s``, ...)."""


def guarded(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The guard's options for a ``@task`` on Django 6.0 (put it under ``@task``)::

        @task
        @guarded(delivery="at_most_once")
        def refund(order_id: str) -> dict: ...

    The options are those of :class:`GuardedTaskDef`, checked when the module is imported.
    """
    unknown = sorted(set(options) - set(GUARD_FIELDS))
    if unknown:
        raise ConfigError(f"guarded(): unknown options {unknown}; known: {list(GUARD_FIELDS)}")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.aaa_guard = options  # type: ignore[attr-defined]
        return fn

    return mark


def guard_options(task: Any) -> dict[str, Any]:
    """A task's guard options as Celery task options, validated (``ConfigError`` names the field)."""
    given = {name: getattr(task, name, None) for name in GUARD_FIELDS}
    for name, value in (getattr(task.func, "aaa_guard", None) or {}).items():
        if given.get(name) is None:
            given[name] = value
    guard = dict(validate_overrides(given["guard"]))
    if given["max_attempts"] is not None:
        guard.update(validate_overrides({"max_attempts": given["max_attempts"]}))
    options: dict[str, Any] = {"guard": guard}
    if given["delivery"] is not None:
        options["delivery"] = given["delivery"]
    if given["idempotency_key"] is not None:
        if not callable(given["idempotency_key"]):
            raise ConfigError("idempotency_key: must be a function of the task's arguments by name")
        options["idempotency_key"] = staticmethod(given["idempotency_key"])
    return options


class GuardedBackend(_api.BaseTaskBackend):
    """Runs each ``@task`` as a guarded Celery task on the fleet (``celery -A proj worker``).

    ``OPTIONS``:

    - ``APP`` (required): the fleet's Celery app or its path, ``"proj.celery:app"``.
    - ``DATABASE``: the alias of the outbox's database (default: the router's for the
      outbox model, usually ``"default"``).
    - ``OUTBOX_GRACE_S`` (10): how long an unsent row waits before the fleet sends it.
    - ``OUTBOX_INTERVAL_S`` (5): how often each worker looks for such rows.
    """

    task_class = GuardedTaskDef
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    #: its enqueues are rows that the fleet's workers drain (:mod:`.outbox`)
    outbox = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - {"APP", "DATABASE", "OUTBOX_GRACE_S", "OUTBOX_INTERVAL_S"})
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: unknown keys {unknown}; "
                                       "known: APP, DATABASE, OUTBOX_GRACE_S, OUTBOX_INTERVAL_S")
        self._app: Any = None

    # -- the Celery side ----------------------------------------------------------------------
    @property
    def app(self) -> Any:
        """The fleet's Celery app (``OPTIONS["APP"]``)."""
        if self._app is None:
            if not self.options.get("APP"):
                raise ImproperlyConfigured(f"TASKS[{self.alias!r}]['OPTIONS']['APP']: name the fleet's Celery "
                                           "app, e.g. 'proj.celery:app'")
            self._app = load(self.options["APP"])
            outbox.attach(self._app)
        return self._app

    @property
    def database(self) -> str:
        from ..models import TaskCall

        return str(self.options.get("DATABASE") or router.db_for_write(TaskCall) or DEFAULT_DB_ALIAS)

    def store(self) -> Any:
        """The guard's store of the app in this process: the very one its tasks use."""
        from ....worker.stores import app_store

        return app_store(self.app)

    def celery_task(self, task: Any) -> Any:
        """The guarded Celery task of ``task`` (made on first use, named by its module path)."""
        from .execute import DjangoTaskRunner

        name = task.module_path

        def run(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - DjangoTaskRunner.body runs the task
            raise NotImplementedError

        run.__module__, run.__qualname__ = task.func.__module__, task.func.__qualname__
        # lazy=False: registered now, without finalizing the app; a name it has returns its task
        return self.app.task(run, base=DjangoTaskRunner, name=name, shared=False, lazy=False,
                             django_task=name, django_backend=self.alias, **guard_options(task))

    # -- django.tasks' contract ------------------------------------------------------------------
    def validate_task(self, task: Any) -> None:
        """Django's checks, then the guard's options (``ConfigError`` names the field); makes the
        task's Celery task, so the fleet's workers know it once they import the module."""
        super().validate_task(task)
        try:
            self.celery_task(task)
        except ConfigError as e:
            raise _api.InvalidTask(f"{task.module_path}: {e}") from e

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Write the call's outbox row (in the app's transaction, if one is open) and send it
        when that commits: ``task_enqueued`` and a READY result whose id is the call id."""
        from ..models import TaskCall

        self.validate_task(task)
        row = TaskCall(id=str(uuid.uuid4()), backend=self.alias, task_path=task.module_path,
                       args=list(args), kwargs=dict(kwargs), queue_name=task.queue_name,
                       priority=task.priority, run_after=task.run_after, enqueued_at=timezone.now())
        db = self.database
        row.save(using=db, force_insert=True)
        result = task_result(task, row, [], None)
        _api.task_enqueued.send(sender=type(self), task_result=result)
        transaction.on_commit(lambda: outbox.publish(self, row.id), using=db)  # at once without a transaction
        return result

    def get_result(self, result_id: str) -> Any:
        """The call's ``TaskResult`` as the guard's store has it (``TaskResultDoesNotExist``
        for an id this backend never enqueued)."""
        from django.utils.module_loading import import_string

        from ..models import TaskCall

        row = TaskCall.objects.using(self.database).filter(id=result_id).first()
        if row is None:
            raise _api.TaskResultDoesNotExist(result_id)
        store = self.store()
        outcome = store.result(result_id)
        return task_result(import_string(row.task_path), row, store.events(result_id), outcome)

    def record_error(self, call_id: str, path: str, text: str) -> None:
        """Keep the class path and traceback of an attempt's exception (the store keeps its name)."""
        from ..models import TaskCall

        TaskCall.objects.using(self.database).filter(id=call_id).update(error_path=path, error_traceback=text)

    def check(self, **kwargs: Any) -> list[Any]:
        return checks.check_backend(self)
