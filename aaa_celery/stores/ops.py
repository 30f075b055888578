"""What operators ask of a store, beside the guard's own verbs: the calls of a time window
(the store's time index, not a key scan), settling a call in doubt, and retention.

The decisions are pure; each backend only makes them atomic:

* :meth:`Store.calls <aaa_celery.stores.base.Store.calls>` yields a :class:`CallRecord`
  per call first seen in a window, newest first, read through the store's index of calls
  by the time it first saw them (Redis: one sorted set per shard; SQL: ``registered_at``);
  :func:`call_state` names its state and :func:`matches` filters it.
* :meth:`Store.resolve <aaa_celery.stores.base.Store.resolve>` replaces an
  ``OutcomeUnknown`` / ``ExecutionAbandoned`` result by an operator's verdict, with the
  ``aaa.tool.resolved`` audit event saying who and why (:func:`aaa_celery.lifecycle.plan_resolve`); any other
  result is real and is never overwritten (:class:`~aaa_celery.errors.NotResolvable`).
* :meth:`Store.purge <aaa_celery.stores.base.Store.purge>` deletes finished calls first
  seen before a time; calls without a result are never purged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lifecycle import CallSpec, Outcome
from ..protocol import tenant_of

#: The states ``aaa calls --state`` filters on.
STATES = ("running", "pending", "completed", "failed", "unknown", "abandoned", "revoked", "resolved")

_STATE_OF_ERROR = {"OutcomeUnknown": "unknown", "ExecutionAbandoned": "abandoned", "TaskRevokedError": "revoked"}


@dataclass(frozen=True)
class CallRecord:
    """One call as the index shows it.

    ``seen_at`` is when the store last saw the call anew, on the store's clock: its
    registration or first delivery, or the last hand-on, if a retry handed it on
    (:func:`~aaa_celery.lifecycle.purgeable`). ``holder`` is the worker holding a live lease, else None.
    """

    call_id: str
    spec: CallSpec
    seen_at: float
    attempts: int = 0
    result: Outcome | None = None
    holder: str | None = None
    resolved: bool = False


def call_state(record: CallRecord) -> str:
    """``running`` (a live lease), ``pending`` (no result and no live lease: not claimed
    yet, or lost and waiting for recovery), ``completed``, ``failed``, ``unknown``
    (OutcomeUnknown), ``abandoned`` (ExecutionAbandoned), ``revoked``, or ``resolved``
    (settled by an operator)."""
    if record.result is None:
        return "running" if record.holder else "pending"
    if record.resolved:
        return "resolved"
    if record.result.ok:
        return "completed"
    return _STATE_OF_ERROR.get(record.result.error or "", "failed")


def matches(record: CallRecord, state: str | None = None, tool: str | None = None,
            tenant: str | None = None) -> bool:
    """Whether ``record`` passes ``aaa calls``' filters (None: any)."""
    if state is not None and call_state(record) != state:
        return False
    if tool is not None and tool not in (record.spec.name, record.spec.request.get("task")):
        return False
    return tenant is None or tenant_of(record.call_id) == tenant
