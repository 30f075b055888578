"""An operator's verdict on a call in doubt, where every reader looks for it.

``celery aaa resolve`` settles an ``OutcomeUnknown`` / ``ExecutionAbandoned`` call. The
store keeps the truth (the new result and its ``aaa.tool.resolved`` event, decided in
:func:`aaa_celery.lifecycle.plan_resolve`); callers of plain Celery read the result
backend, where the worker left the ``FAILURE(OutcomeUnknown)``. :func:`resolve_call`
writes both: the store first, then the app's result backend as the task itself would have
stored that result (``SUCCESS`` with the value decoded as a worker returns it, or
``FAILURE`` with the exception a later delivery of the call raises). A waiting
``AsyncResult.get()``, in any process, then gets the verdict.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from celery import Celery

from ..errors import ResultBackendNotWritten
from ..lifecycle import Outcome
from .codec import CODEC
from .control import raise_for
from .stores import app_store


def resolve_call(app: Celery, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                 value: Any = None) -> Outcome:
    """Settle ``call_id`` as ``verdict`` in the app's store, then in its result backend.

    Raises:
        NotResolvable: the store refused (no result yet, or a real one).
        StoreError: the store could not be reached (nothing was written).
        ResultBackendNotWritten: the store holds the verdict (the engine and later
            deliveries see it); the result backend still holds the old result.
    """
    outcome = app_store(app).resolve(call_id, verdict, note, by, value)
    try:
        copy_to_backend(app, call_id, outcome)
    except Exception as e:  # noqa: BLE001 - any backend's error means the same here
        raise ResultBackendNotWritten(
            f"{call_id}: resolved as {verdict} in the store, but Celery's result backend was not written "
            f"({type(e).__name__}: {e}); the engine and later deliveries see the verdict, a plain "
            "AsyncResult.get() still reads the old result"
        ) from e
    return outcome


def copy_to_backend(app: Celery, call_id: str, outcome: Outcome) -> None:
    """Store ``outcome`` in the app's result backend as the call's task would have."""
    backend = app.backend
    if outcome.ok:
        backend.mark_as_done(call_id, CODEC.decode(outcome.value))
    else:
        backend.mark_as_failure(call_id, cast(Exception, raise_for(outcome)))  # never a BaseException only
