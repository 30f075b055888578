"""A ``TaskResult`` read from the guard's store: the one table from the guard's words to Django's.

| the store says                               | ``status``   | also                                   |
|----------------------------------------------|--------------|----------------------------------------|
| no attempt started                           | READY        |                                        |
| attempt *n* started, no result               | RUNNING      | ``worker_ids``: one per started attempt |
| a success                                    | SUCCESSFUL   | ``return_value``                       |
| a failure (the task's exception)             | FAILED       | ``TaskError`` with its class path      |
| ``OutcomeUnknown`` / ``ExecutionAbandoned``  | FAILED       | ``TaskError("aaa_celery.errors.…")``   |

``worker_ids`` holds the worker of each numbered attempt (``aaa.tool.started``), so
``TaskResult.attempts`` is the guard's attempt count. A call an operator settles with
``celery aaa resolve`` reads as its verdict from then on. Django has no status for a call
whose attempt was lost and waits for recovery: it stays RUNNING until the next attempt.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone

from ....errors import AAACeleryError
from ....lifecycle import STARTED, Event, Outcome
from . import _api


class Row(Protocol):
    """What a result needs of the enqueue record (the outbox row)."""

    id: str
    backend: str
    args: Any
    kwargs: Any
    enqueued_at: dt.datetime
    error_path: str
    error_traceback: str


def when(at: float | None) -> dt.datetime | None:
    """A store time (seconds since the epoch) as Django keeps times (aware under ``USE_TZ``)."""
    if at is None:
        return None
    moment = dt.datetime.fromtimestamp(at, tz=dt.timezone.utc)
    return moment if settings.USE_TZ else timezone.make_naive(moment)


def class_path(error: str) -> str:
    """The importable path of an exception the store names by class: the guard's own
    (``aaa_celery.errors.OutcomeUnknown``), a builtin, else the bare name."""
    import aaa_celery.errors as errors

    found = getattr(errors, error, None)
    if isinstance(found, type) and issubclass(found, AAACeleryError):
        return f"{found.__module__}.{found.__qualname__}"
    if isinstance(getattr(builtins, error, None), type):
        return f"builtins.{error}"
    return error


def task_error(outcome: Outcome, row: Row) -> Any:
    """The ``TaskError`` of a failure: the class path and traceback the attempt recorded
    on the row when they are of the exception the store names, else the store's name and message."""
    path = class_path(outcome.error or "Exception")
    if row.error_path and row.error_path.rsplit(".", 1)[-1] == outcome.error:
        return _api.TaskError(exception_class_path=row.error_path, traceback=row.error_traceback)
    return _api.TaskError(exception_class_path=path, traceback=f"{outcome.error}: {outcome.message}")


def task_result(task: Any, row: Row, events: Sequence[Event], outcome: Outcome | None) -> Any:
    """The ``TaskResult`` of a call: ``task`` the ``@task``, ``row`` its enqueue record,
    ``events`` and ``outcome`` its audit trail and result as the store keeps them."""
    starts = [e for e in events if e.type == STARTED]
    finished = next((e for e in reversed(events) if e.id.endswith((":result", ":resolved"))), None)
    status = _api.TaskResultStatus
    if outcome is not None:
        state = status.SUCCESSFUL if outcome.ok else status.FAILED
    else:
        state = status.RUNNING if starts else status.READY
    result: Any = _api.TaskResult(
        task=task,
        id=row.id,
        status=state,
        enqueued_at=row.enqueued_at,
        started_at=when(starts[0].at) if starts else None,
        finished_at=when(finished.at if finished else None) if outcome is not None else None,
        last_attempted_at=when(starts[-1].at) if starts else None,
        args=list(row.args),
        kwargs=dict(row.kwargs),
        backend=row.backend,
        errors=[task_error(outcome, row)] if outcome is not None and not outcome.ok else [],
        worker_ids=[str(e.data.get("worker", "")) for e in starts],
    )
    if outcome is not None and outcome.ok:
        object.__setattr__(result, "_return_value", outcome.value)
    return result
