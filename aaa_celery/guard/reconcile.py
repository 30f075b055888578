"""Reconciliation: before a lost at_most_once call is left ``OutcomeUnknown``, ask the called
system whether the effect happened.

A tool (``@tool(reconcile=fn)``) or a ``GuardedTask`` (``reconcile=fn``) may give a function
of the call's arguments and its ``ctx``; it looks the effect up by ``ctx.idempotency_key``
(the refund by its key, the e-mail by its message id) and answers:

* :class:`Happened` ``(value)``: the effect took place; the call is settled as completed
  with that value, and the caller gets it;
* :class:`NotHappened` ``(reason)``: it did not; the call fails cleanly
  (``EffectNotApplied``): the caller knows it is safe to try again;
* ``None``, or an exception: it cannot tell; the call stays ``OutcomeUnknown``. So does a
  step that runs past the task's ``timeout_s`` (:data:`RECONCILE_TIMEOUT_S` without one):
  it is interrupted as a body is.

The delivery that finds the call's last attempt lost, and records ``OutcomeUnknown`` (the
store's ``begin``), runs the function at once, and settles the call with the store's
compare-and-set ``settle`` only if its result is still that ``OutcomeUnknown``. Every
answer is audited as ``aaa.tool.reconciled`` (``data.found``: ``happened``,
``not_happened``, ``unknown`` or ``error``). If that delivery's worker dies before it
settles, the call stays ``OutcomeUnknown``, as without reconciliation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..lifecycle import RECONCILED, CallSpec, Draft, Outcome, event_id
from ..stores.base import GuardStore

log = logging.getLogger("aaa_celery.guard")

#: Seconds a reconcile step may run when its task has no ``timeout_s`` (it runs under the
#: task's ``timeout_s`` otherwise); past it, the call stays ``OutcomeUnknown``.
RECONCILE_TIMEOUT_S = 60.0
#: The error type of a call whose reconcile function said the effect did not happen.
NOT_APPLIED = "EffectNotApplied"


@dataclass(frozen=True)
class Happened:
    """The effect took place; ``value`` is what the call returns."""

    value: Any = None


@dataclass(frozen=True)
class NotHappened:
    """The effect did not take place; ``reason`` says how the function knows."""

    reason: str = ""


#: A reconcile step, bound to one call (its arguments) and called with the lost attempt's
#: number (for its ``ctx``): ``Happened``, ``NotHappened``, or None (cannot tell).
Reconcile = Callable[[int], "Happened | NotHappened | None"]


def reconciled_event(call: CallSpec, attempt: int, data: dict[str, Any]) -> Draft:
    return Draft(event_id(call.call_id, RECONCILED, attempt), RECONCILED, call.call_id, attempt,
                 {"call_id": call.call_id, "name": call.name, **data})


def reconcile_lost(store: GuardStore, call: CallSpec, unknown: Outcome, reconcile: Reconcile,
                   encode: Callable[[Any], Any]) -> Outcome:
    """Run ``reconcile`` for a call just refused as ``unknown`` (OutcomeUnknown); settle the
    call as its answer says, and return the call's result as the caller sees it."""
    try:
        answer = reconcile(unknown.attempt)
    except Exception as e:  # noqa: BLE001 - cannot tell: the call stays OutcomeUnknown
        log.warning("aaa: reconcile of %s failed: %r", call.call_id, e)
        answer, data = None, {"found": "error", "error": type(e).__name__, "message": str(e)}
    else:
        data = {"found": "unknown"}
    outcome = unknown
    if isinstance(answer, Happened):
        try:
            outcome = Outcome.success(encode(answer.value), unknown.attempt)
            data = {"found": "happened", "value": outcome.value}
        except (TypeError, ValueError) as e:
            data = {"found": "error", "error": "TypeError", "message": f"the reconciled value: {e}"}
    elif isinstance(answer, NotHappened):
        message = f"{call.name or call.call_id}: the effect did not happen (reconciled): {answer.reason}".rstrip(": ")
        outcome = Outcome.failure(NOT_APPLIED, message, unknown.attempt)
        data = {"found": "not_happened", "reason": answer.reason}
    elif answer is not None and "error" not in data:
        data = {"found": "error", "error": "TypeError",
                "message": f"reconcile returned {type(answer).__name__}, not Happened, NotHappened or None"}
    try:
        if store.settle(call.call_id, unknown, outcome, reconciled_event(call, unknown.attempt, data)):
            return outcome
        return store.result(call.call_id) or unknown
    except Exception as e:  # noqa: BLE001 - the store's trouble: report what is recorded
        log.warning("aaa: could not record the reconciliation of %s: %r", call.call_id, e)
        return unknown
