"""Celery's control-flow exceptions under the guard.

A body may end its attempt the Celery way. What each means for the call:

* ``Retry`` (``self.retry()``, ``autoretry_for``), ``Reject(requeue=True)`` and the
  ``Ignore`` that ``Task.replace`` raises hand the call on: the attempt ends without a
  result (``aaa.tool.retried``) and the next delivery (the retry's message, the
  requeued one, the replacement) is the next attempt. It does not count toward
  ``max_attempts`` (a cap on lost attempts; ``max_retries`` bounds retries), and it runs
  under ``at_most_once`` too: that policy refuses to run a call again after an attempt
  was *lost* (nobody knows whether its effect happened), while a body that asks to be
  retried has reported that it is not done.
* ``Ignore`` and ``Reject(requeue=False)`` end the call without a value: that is
  recorded as its one outcome, and a later delivery raises the same again, so neither
  the broker nor recovery ever runs it once more.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Reject, Retry, TaskRevokedError

from ..guard import error_for
from ..lifecycle import Outcome

#: Set on a request whose body replaced itself (``Task.replace``).
REPLACED = "_aaa_replaced"


def control_for(request: Any) -> Any:
    """The guard's reading of the control-flow exceptions of one request's body."""

    def control(error: BaseException) -> str | None:
        if isinstance(error, Retry) or (isinstance(error, Reject) and error.requeue):  # type: ignore[attr-defined]
            return "hand_on"
        if isinstance(error, Ignore) and getattr(request, REPLACED, False):
            return "hand_on"
        return None

    return control


def raise_for(outcome: Outcome) -> BaseException:
    """The exception a recorded failure raises for a Celery delivery: a recorded
    ``Ignore``, ``Reject`` or revocation comes back as itself."""
    if outcome.error == "Ignore":
        return Ignore(outcome.message)
    if outcome.error == "Reject":
        return Reject(outcome.message, requeue=False)
    if outcome.error == "TaskRevokedError":
        return TaskRevokedError(outcome.message)
    return error_for(outcome)


def raise_for_task(task: Any, call_id: str) -> Any:
    """:func:`raise_for`, for a later delivery of a call whose body failed: the exception
    that failure left in Celery's result backend (its own type, as Celery rebuilds it), so
    errbacks and chords see what a plain Celery run would raise; else the recorded one."""

    def raise_(outcome: Outcome) -> BaseException:
        error = raise_for(outcome)
        if isinstance(error, Ignore | Reject | TaskRevokedError):
            return error
        try:
            meta = task.backend.get_task_meta(call_id)
        except Exception:  # noqa: BLE001 - the store's record stands; the backend only refines it
            return error
        stored = meta.get("result")
        if meta.get("status") == "FAILURE" and isinstance(stored, Exception) and type(stored).__name__ == outcome.error:
            return stored
        return error

    return raise_
