"""The guard's audit events as Celery events, for monitors such as Flower.

Sent only by workers started with ``-E`` (the recovery bootstep records that in the
app's ``aaa_task_events`` setting before the pool starts, so prefork children see
it). The store's audit trail is the record; these never raise.

Their type is ``aaa-tool-<kind>`` (group ``aaa``), never ``task-...``: Celery's event
state (``celery.events.state.State``, which Flower builds on) takes every ``task-*``
event for a state change of the task and copies its fields onto it, so an audit event
there would overwrite the task's state and its ``worker``. ``State`` ignores the
``aaa`` group (register ``state.handlers["aaa"]`` to see it); ``celery events --dump``
and event receivers get every one. Each carries the task id as ``uuid`` and its own
fields under an ``aaa_`` prefix: ``aaa_type``, ``aaa_tool``, ``aaa_attempt`` and, as
the case may be, ``aaa_worker``, ``aaa_error``, ``aaa_message``.
"""

from __future__ import annotations

import logging
from typing import Any

from . import metrics, tracing
from .conf import setting

log = logging.getLogger("aaa_celery.worker")

#: The app setting that says whether this worker sends task events.
TASK_EVENTS_SETTING = "aaa_task_events"


def celery_event_type(audit_type: str) -> str:
    """The Celery event type of an audit event: ``aaa.tool.started`` -> ``aaa-tool-started``."""
    return audit_type.replace(".", "-")


class TaskEvents:
    """Sends one task's audit events (a no-op on workers without ``-E``)."""

    def __init__(self, task: Any, tool: str) -> None:
        self.task, self.tool = task, tool
        self.enabled = bool(setting(task.app, TASK_EVENTS_SETTING))
        # Metrics (a worker with a metrics port) and attempt spans (aaa_tracing) see every event.
        self.observers = [o for o in (metrics.observer(task), tracing.observer(task)) if o is not None]

    def __call__(self, audit_type: str, attempt: int | None, **fields: Any) -> None:
        for observe in self.observers:
            try:
                observe(audit_type, attempt, fields)
            except Exception as e:  # noqa: BLE001 - monitoring never fails a call
                log.warning("aaa: could not observe %s: %r", audit_type, e)
        if not self.enabled:
            return
        try:
            self.task.send_event(celery_event_type(audit_type), retry=False, aaa_type=audit_type,
                                 aaa_tool=self.tool, aaa_attempt=attempt,
                                 **{f"aaa_{k}": v for k, v in fields.items()})
        except Exception as e:  # noqa: BLE001
            log.warning("aaa: could not send the %s task event: %s", audit_type, e)
