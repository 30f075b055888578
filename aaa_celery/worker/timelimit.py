"""A hard ``time_limit`` ends a guarded call, in the store as in Celery: one truth.

In plain Celery a hard time limit is final: the worker's main process kills the pool
child, writes ``FAILURE(TimeLimitExceeded)`` to the result backend and acks the message
(``Request.on_failure``, then ``on_timeout``); the task is not retried. The killed attempt cannot tell the
store, so without this its lease would lapse and recovery would run the call again (or
record ``OutcomeUnknown``), replacing the FAILURE the caller already saw.

:class:`GuardedRequest` (``GuardedTask.Request``) records that same failure in the store
first, from the main process (before Celery's own write), as the call's one result: an outside record
(``Store.record``, kind ``fenced``) that ends the timed-out attempt (first writer wins, the lease is freed, recovery never starts
another attempt). The attempt is the last one started by the killed child (its worker
name carries the child's pid); if a later attempt started elsewhere, or the store
cannot be reached, nothing is recorded and recovery does what it does for a lost worker.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from celery.exceptions import TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request

from ..config import GuardConfig
from ..errors import StoreError
from ..lifecycle import COMPLETED, FAILED, STARTED, CallSpec, Outcome, stamped
from .settle import settle_or_log
from .stores import app_store

log = logging.getLogger("aaa_celery.worker")

TIME_LIMIT_ERROR = "TimeLimitExceeded"


def time_limit_outcome(timeout: Any) -> Outcome:
    """The outcome recorded for a call killed by its hard time limit (Celery's exception name)."""
    return Outcome.failure(TIME_LIMIT_ERROR, f"hard time limit ({timeout}s) exceeded")


def timed_out_attempt(app: Any, call_id: str, hostname: str, pid: int | None) -> int | None:
    """The attempt the killed pool child ``pid`` of worker ``hostname`` was running: the
    call's last started attempt, if that child started it (else None)."""
    if not pid:
        return None
    events = app_store(app).events(call_id)
    started = [e for e in events if e.type == STARTED]
    if not started or any(e.type in (COMPLETED, FAILED) for e in events):
        return None  # the body raised TimeLimitExceeded itself, and its attempt recorded it
    last = max(started, key=lambda e: e.attempt)
    return last.attempt if str(last.data.get("worker", "")).startswith(f"{hostname}/{pid}/") else None


def record_time_limit(task: Any, call_id: str, hostname: str, pid: int | None, timeout: Any) -> bool:
    """Record a guarded call's hard time limit as its one result; True if recorded."""
    config = getattr(task, "guard_config", None)
    if not isinstance(config, GuardConfig) or not config.enabled or not call_id:
        return False
    try:
        attempt = timed_out_attempt(task.app, call_id, hostname, pid)
    except StoreError as e:
        log.warning("aaa: could not record the hard time limit of %s: %s", call_id, e)
        return False
    if attempt is None:
        log.info("aaa: hard time limit of %s not recorded: no open attempt of child %s", call_id, pid)
        return False
    outcome = stamped(time_limit_outcome(timeout), attempt)  # ends that attempt, never a later one
    return settle_or_log(task.app, CallSpec(call_id), outcome, "hard time limit", "fenced")


class GuardedRequest(Request):
    """Celery's request, whose hard time limit is also recorded in the guard's store.

    billiard reports a hard time limit to the main process as the job's failure with
    ``TimeLimitExceeded`` (``Request.on_failure``: FAILURE stored, message acked), then
    calls ``on_timeout``. The store is written first, so a caller who sees the FAILURE
    finds the store agreeing.
    """

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
        if isinstance(exc, TimeLimitExceeded) and not worker_state.should_terminate:  # Celery records nothing then
            try:
                # celery-types says str; Celery sets the pool child's int pid
                pid = cast(int | None, self.worker_pid)
                record_time_limit(self.task, self.id, self.hostname, pid, exc.args[0] if exc.args else "?")
            except Exception:  # never break the worker's main process
                log.exception("aaa: could not record the hard time limit of %s", self.id)
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
