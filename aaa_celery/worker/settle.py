"""Outcomes recorded from outside an attempt, in the worker: one store write each.

A revoked or expired call (``revoke.py``), a message the guard refuses (``messages.py``)
or a policy denies (``tools/rules.py``), and a hard time limit (``timelimit.py``) each end a
call that no attempt of this worker can finish: its outcome is recorded by
:meth:`~aaa_celery.stores.base.Store.record`, planned by
:func:`aaa_celery.lifecycle.plan_record`. No lease is taken or forged: ``first`` records
unless the call has a result, ``fenced`` also only while no later attempt has started.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import StoreError
from ..lifecycle import CallSpec, Outcome, RecordKind
from .stores import app_store

log = logging.getLogger("aaa_celery.worker")


def settle(app: Any, call: CallSpec, outcome: Outcome, kind: RecordKind = "first") -> bool:
    """Record ``outcome`` as the call's one result (see :meth:`Store.record`); True if
    recorded, False if the call keeps the result it has (or a later attempt runs it).
    Raises the store's errors (``StoreError``)."""
    return app_store(app).record(call, outcome, kind)


def settle_or_log(app: Any, call: CallSpec, outcome: Outcome, what: str, kind: RecordKind = "first") -> bool:
    """:func:`settle` where the broker's ack is Celery's: a store that fails here is logged,
    and recovery may bring the call back once. True if recorded."""
    try:
        return settle(app, call, outcome, kind)
    except StoreError as e:
        log.warning("aaa: could not record the %s of %s: %s", what, call.call_id, e)
        return False


def settle_refused(app: Any, task: Any, call_id: str, error: BaseException) -> bool:
    """Record ``error`` as the outcome of a call that never ran (a refused message, a
    policy's denial), in the store and in the result backend; False if the call already
    had an outcome (it keeps it). Raises the store's errors; a result backend's is only
    logged (the store holds the outcome, the backend is a copy)."""
    call = CallSpec(call_id, getattr(task, "audit_name", None) or task.name)  # names its events
    if not settle(app, call, Outcome.failure(type(error).__name__, str(error))):
        return False
    try:
        task.backend.mark_as_failure(call_id, error)
    except Exception as e:  # noqa: BLE001
        log.warning("aaa: could not store the result of the refused call %s: %r", call_id, e)
    return True
