"""Map a Celery task's state onto the ``aaa.tool.*`` fact the model sees."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from celery import states

from ..errors import OUTCOME_UNKNOWN_MESSAGE
from ..lifecycle import COMPLETED, FAILED, Outcome


@dataclass(frozen=True)
class ToolFact:
    """The outcome of one tool call as the algorithm sees it."""

    call_id: str
    name: str
    ok: bool
    value: Any = None
    error: str | None = None
    message: str = ""

    @property
    def event_type(self) -> str:
        return COMPLETED if self.ok else FAILED

    @property
    def content(self) -> str:
        """Model-readable text: the value, or ``<ErrorType>: <message>``."""
        if self.ok:
            return self.value if isinstance(self.value, str) else json.dumps(self.value, default=str)
        return f"{self.error}: {self.message}"

    def event_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"call_id": self.call_id, "name": self.name}
        if self.ok:
            data["value"] = self.value
        else:
            data.update(error=self.error, message=self.message)
        return data


def fact_from_celery(call_id: str, name: str, state: str, result: Any) -> ToolFact | None:
    """The fact for a finished Celery task, or None while it is not finished."""
    if state == states.SUCCESS:
        return ToolFact(call_id, name, True, result)
    if state in states.PROPAGATE_STATES:
        if isinstance(result, BaseException):
            return failed(call_id, name, result)
        return ToolFact(call_id, name, False, error="ToolError", message=str(result))
    return None


def fact_from_record(call_id: str, name: str, celery_fact: ToolFact, recorded: Outcome | None,
                     begun: bool) -> ToolFact | None:
    """The fact for a call Celery reports failed, once the guard's store was asked (one truth:
    the store's record wins over a Celery state it contradicts). ``recorded`` is the call's
    recorded outcome (a ``lifecycle.Outcome``) or None; ``begun``: whether the store has seen
    an attempt of it. A call the store has begun and not finished is still pending (None):
    a FAILURE from outside the guard (a hard time limit, a lost worker) is not its outcome.
    A call the store never saw keeps Celery's fact (it failed before the guard ran it)."""
    if recorded is not None:
        if not recorded.ok:  # a record without a type or a text keeps Celery's
            recorded = replace(recorded, error=recorded.error or celery_fact.error or "ToolError",
                               message=recorded.message or celery_fact.message or "")
        return fact_from_outcome(call_id, name, recorded)
    return None if begun else celery_fact


def fact_from_outcome(call_id: str, name: str, outcome: Outcome) -> ToolFact:
    """The fact of a call whose result the store recorded (as the worker would have answered it)."""
    if outcome.ok:
        return ToolFact(call_id, name, True, outcome.value)
    message = model_message(outcome.error or "", outcome.message)
    return ToolFact(call_id, name, False, error=outcome.error, message=message)


def failed(call_id: str, name: str, error: BaseException) -> ToolFact:
    """The failed fact for ``error``: its type name and a model-readable message.

    An ``OutcomeUnknown`` always tells the model that the action may have
    happened and must be verified, not blindly retried.
    """
    kind = type(error).__name__
    return ToolFact(call_id, name, False, error=kind, message=model_message(kind, str(error)))


def model_message(kind: str, message: str) -> str:
    """What the model reads for a failure: an ``OutcomeUnknown`` always says to verify first."""
    if kind == "OutcomeUnknown" and "verify" not in message.lower():
        return f"{OUTCOME_UNKNOWN_MESSAGE} ({message})" if message else OUTCOME_UNKNOWN_MESSAGE
    return message
