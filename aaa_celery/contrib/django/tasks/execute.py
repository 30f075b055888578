"""The worker's side: each ``@task`` function runs as a guarded Celery task named by the
task's module path, on the fleet, inside the guard's ``begin … finish``.

An attempt reads its ``TaskResult`` from the store (RUNNING, ``attempts`` = this attempt's
number), sends ``task_started``, calls the function (a coroutine function runs to its end
on the worker), and returns its value for the guard to record. ``task_finished`` goes out
once the store holds the call's result (:meth:`DjangoTaskRunner.after_return`), never before.
"""

from __future__ import annotations

import inspect
import json
import logging
import traceback
from typing import Any

from aaa_celery import GuardedTask

from ....context import ToolContext
from . import _api

log = logging.getLogger("aaa_celery.contrib.django.tasks")

#: The guard's refusals: a delivery that finds one has ended the call, as a finished attempt does.
_ENDINGS = ("OutcomeUnknown", "ExecutionAbandoned")
#: set on a delivery's request once it ran the task function
_RAN = "aaa_django_ran"


def _backend(alias: str) -> Any:
    return _api.task_backends[alias]


def _django_task(path: str) -> Any:
    from django.utils.module_loading import import_string

    return import_string(path)


def _json(value: Any) -> Any:
    """The value as JSON gives it back (Django's ``return_value`` is the decoded JSON)."""
    return json.loads(json.dumps(value))


class DjangoTaskRunner(GuardedTask):
    """The Celery task of one ``@task`` function (one class per function, made by
    :meth:`~aaa_celery.contrib.django.tasks.GuardedBackend.validate_task`)."""

    abstract = True
    #: ``module.qualname`` of the ``@task`` (the Task object at module level)
    django_task: str = ""
    #: the ``TASKS`` alias of its backend
    django_backend: str = "default"

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by the ``@task`` function's parameter names (for ``idempotency_key``)."""
        task = _django_task(self.django_task)
        params = list(inspect.signature(task.func).parameters.values())
        if task.takes_context:
            params = params[1:]
        signature = inspect.Signature(params)
        try:
            return dict(signature.bind_partial(*args, **kwargs).arguments)
        except TypeError:
            return dict(kwargs)

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        backend = _backend(self.django_backend)
        task = _django_task(self.django_task)
        result = backend.get_result(ctx.call_id)
        setattr(self.request, _RAN, True)  # noqa: B010 - a mark on this delivery's request
        _api.task_started.send(sender=type(backend), task_result=result)
        call_args = (_api.TaskContext(task_result=result), *args) if task.takes_context else args
        try:
            return _json(task.call(*call_args, **kwargs))
        except Exception as e:
            backend.record_error(ctx.call_id, f"{type(e).__module__}.{type(e).__qualname__}",
                                 "".join(traceback.format_exception(e)))
            raise

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Send ``task_finished`` once the store holds the call's result: after an attempt
        that ran the function, or a delivery the guard refused (the call ended unknown)."""
        super().after_return(status, retval, task_id, args, kwargs, einfo)
        refused = einfo is not None and type(einfo.exception).__name__ in _ENDINGS
        if not (getattr(self.request, _RAN, False) or refused):
            return
        try:
            backend = _backend(self.django_backend)
            result = backend.get_result(task_id)
        except Exception:  # a signal is no reason to fail a finished call
            log.exception("aaa: no task_finished for %s: its result could not be read", task_id)
            return
        if result.is_finished:
            _api.task_finished.send(sender=type(backend), task_result=result)
