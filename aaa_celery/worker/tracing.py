"""OpenTelemetry spans of the guard: one per attempt, under Celery's ``run/<task>`` span.

Optional (``pip install 'aaa_celery[tracing]'``) and off until the app sets
``aaa_tracing = True``. With opentelemetry-instrumentation-celery (``CeleryInstrumentor``),
each task execution has a ``run/<task>`` span; the guard adds a child span per attempt,
``aaa.attempt <task>``, current while the body runs (a tool's own spans nest under it),
with these attributes:

- ``aaa.call_id``, ``aaa.tool``, ``aaa.attempt`` (the fence), ``aaa.delivery``
  (``at_least_once`` / ``at_most_once``);
- ``aaa.outcome``: ``completed``, ``failed``, ``fenced``, ``stale_result``, ``retried``,
  ``refused`` (a delivery answered ``OutcomeUnknown`` / ``ExecutionAbandoned`` without
  running) or ``reconciled``; ``aaa.error`` for a failure (the span's status is then ERROR).

The spans are fed by the guard's audit events as the runner emits them (like the metrics),
so the guard core stays free of OpenTelemetry. A duplicate delivery dropped while another
worker holds the call runs no attempt and gets no span.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..lifecycle import COMPLETED, FAILED, FENCED, RECONCILED, RETRIED, STALE_RESULT, STARTED
from .conf import setting

log = logging.getLogger("aaa_celery.worker")

SETTING = "aaa_tracing"
_ENDINGS = {COMPLETED: "completed", FAILED: "failed", FENCED: "fenced", STALE_RESULT: "stale_result",
            RETRIED: "retried"}
_local = threading.local()


class AttemptSpans:
    """Opens and closes one delivery's attempt span from its audit events."""

    def __init__(self, task: Any, trace: Any, context: Any) -> None:
        self.task, self.trace, self.context = task, trace, context
        self.span: Any = None
        self.token: Any = None
        request = task.request
        self.attributes = {"aaa.call_id": str(getattr(request, "id", "") or ""), "aaa.tool": task.name,
                           "aaa.delivery": task.guard_config.delivery.value}

    def __call__(self, audit_type: str, attempt: int | None, fields: dict[str, Any]) -> None:
        if audit_type == STARTED:
            self.open(attempt)
        elif audit_type in _ENDINGS:
            outcome = _ENDINGS[audit_type]
            if self.span is None:  # answered without running: a refusal
                self.open(attempt)
                outcome = "refused"
            self.close(outcome, fields.get("error"))
        elif audit_type == RECONCILED:
            self.open(attempt)
            self.close("reconciled", fields.get("error") if not fields.get("ok") else None)

    def open(self, attempt: int | None) -> None:
        tracer = self.trace.get_tracer("aaa_celery")
        self.span = tracer.start_span(f"aaa.attempt {self.task.name}",
                                      attributes={**self.attributes, "aaa.attempt": int(attempt or 0)})
        self.token = self.context.attach(self.trace.set_span_in_context(self.span))
        _local.open = self

    def close(self, outcome: str, error: str | None = None) -> None:
        span, token, self.span, self.token = self.span, self.token, None, None
        if span is None:
            return
        span.set_attribute("aaa.outcome", outcome)
        if error:
            span.set_attribute("aaa.error", str(error))
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, str(error)))
        span.end()
        try:
            self.context.detach(token)
        except Exception:  # noqa: BLE001 - detached elsewhere (another context); the span is ended
            pass
        if getattr(_local, "open", None) is self:
            _local.open = None


def observer(task: Any) -> AttemptSpans | None:
    """The attempt spans of one delivery of ``task``, or None when tracing is off."""
    if not setting(task.app, SETTING):
        return None
    try:
        from opentelemetry import context, trace
    except ImportError:
        log.warning("aaa: aaa_tracing is on but opentelemetry-api is not installed: "
                    "pip install 'aaa_celery[tracing]'")
        return None
    return AttemptSpans(task, trace, context)


def close_open_span(**_: Any) -> None:
    """``task_postrun`` receiver: end an attempt span that no event ended (the delivery
    ended otherwise, e.g. handed back to the broker while the store was down)."""
    spans = getattr(_local, "open", None)
    if spans is not None:
        spans.close("handed_back")
