"""The pure state machine of one tool call: no I/O, no Celery.

Every store reads a call's state, asks these functions what to do, and applies
the answer atomically. The Redis store mirrors them in Lua (it must decide in
one round trip); the conformance suite proves that every store decides alike.

    NEW --begin--> RUNNING(n) --finish(n)--> COMPLETED | FAILED
                     | lease lapses / holder dies
                     +-- at_least_once, n < max --> RUNNING(n+1)
                     +-- at_least_once, n = max --> FAILED(ExecutionAbandoned)
                     +-- at_most_once ------------> FAILED(OutcomeUnknown)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .config import Delivery, GuardConfig
from .errors import ABANDONED_MESSAGE, OUTCOME_UNKNOWN_MESSAGE

STARTED = "aaa.tool.started"
COMPLETED = "aaa.tool.completed"
FAILED = "aaa.tool.failed"
FENCED = "aaa.tool.fenced"
STALE_RESULT = "aaa.tool.stale_result"


@dataclass(frozen=True)
class CallSpec:
    """What the store keeps about a call, enough to run it again.

    ``request`` holds how to republish the call (task name, args, kwargs,
    queue); recovery sends it again under the same task id.
    """

    call_id: str
    name: str = ""
    idempotency_key: str = ""
    request: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> CallSpec:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Outcome:
    """The one recorded result of a call: a value, or an error type and message."""

    ok: bool
    value: Any = None
    error: str | None = None
    message: str = ""
    attempt: int = 0

    @classmethod
    def success(cls, value: Any, attempt: int = 0) -> Outcome:
        return cls(ok=True, value=value, attempt=attempt)

    @classmethod
    def failure(cls, error: str, message: str, attempt: int = 0) -> Outcome:
        return cls(ok=False, error=error, message=message, attempt=attempt)

    @property
    def event_type(self) -> str:
        return COMPLETED if self.ok else FAILED

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Outcome:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Event:
    """One entry of a call's audit trail."""

    id: str
    type: str
    call_id: str
    attempt: int
    data: dict[str, Any]
    at: float

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Event:
        return cls(**json.loads(raw))


def event_id(call_id: str, kind: str, attempt: int) -> str:
    """The stable id of an audit event: ``<call>:attempt:<n>`` for a start."""
    if kind == STARTED:
        return f"{call_id}:attempt:{attempt}"
    if kind in (COMPLETED, FAILED):
        return f"{call_id}:result"
    suffix = "fenced" if kind == FENCED else "stale"
    return f"{call_id}:attempt:{attempt}:{suffix}"


def started_data(call: CallSpec, attempt: int, worker: str) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "name": call.name,
        "attempt": attempt,
        "worker": worker,
        "idempotency_key": call.idempotency_key,
    }


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a call. ``fence`` is the attempt number."""

    call_id: str
    attempt: int
    worker: str
    token: str
    ttl_s: float
    expires_at: float | None = None

    @property
    def fence(self) -> int:
        return self.attempt


def fenced_data(lease: Lease) -> dict[str, Any]:
    return {"call_id": lease.call_id, "attempt": lease.attempt, "worker": lease.worker}


def stamped(outcome: Outcome, attempt: int) -> Outcome:
    if outcome.attempt == attempt:
        return outcome
    return replace(outcome, attempt=attempt)


def result_data(call: CallSpec, outcome: Outcome) -> dict[str, Any]:
    data = {"call_id": call.call_id, "name": call.name, "attempt": outcome.attempt}
    if outcome.ok:
        data["value"] = outcome.value
    else:
        data["error"] = outcome.error
        data["message"] = outcome.message
    return data


@dataclass(frozen=True)
class Claimed:
    lease: Lease

    @property
    def attempt(self) -> int:
        return self.lease.attempt


@dataclass(frozen=True)
class Busy:
    holder: str
    expires_at: float | None


@dataclass(frozen=True)
class Finished:
    result: Outcome


@dataclass(frozen=True)
class Refused:
    """The call may not run again; ``result`` is the failure now recorded for it."""

    result: Outcome


BeginResult = Claimed | Busy | Finished | Refused


@dataclass(frozen=True)
class Accepted:
    result: Outcome


@dataclass(frozen=True)
class Stale:
    """The result was not applied; ``current`` is the call's recorded result, if any."""

    current: Outcome | None


FinishResult = Accepted | Stale


@dataclass(frozen=True)
class CallState:
    """What ``begin``/``finish`` need to know of a call, read atomically by a store."""

    attempts: int = 0
    result: Outcome | None = None
    holder_live: bool = False


@dataclass(frozen=True)
class BeginDecision:
    kind: Literal["claim", "busy", "finished", "refuse"]
    attempt: int = 0
    refusal: Outcome | None = None


def decide_begin(state: CallState, config: GuardConfig) -> BeginDecision:
    """Decide what a delivery of a call does: run it, wait, or answer without running."""
    if state.result is not None:
        return BeginDecision("finished")
    if state.holder_live:
        return BeginDecision("busy")
    if state.attempts == 0:
        return BeginDecision("claim", attempt=1)
    if config.delivery is Delivery.AT_MOST_ONCE:
        return BeginDecision(
            "refuse", refusal=Outcome.failure("OutcomeUnknown", OUTCOME_UNKNOWN_MESSAGE, state.attempts)
        )
    if state.attempts >= config.max_attempts:
        return BeginDecision(
            "refuse",
            refusal=Outcome.failure(
                "ExecutionAbandoned",
                ABANDONED_MESSAGE.format(attempts=state.attempts),
                state.attempts,
            ),
        )
    return BeginDecision("claim", attempt=state.attempts + 1)


def decide_finish(
    state: CallState, outcome: Outcome, config: GuardConfig
) -> Literal["accept", "again", "stale"]:
    """Decide whether ``outcome`` (stamped with its attempt) becomes the call's one result.

    ``again`` means this very outcome is already recorded (a retried ``finish``
    whose first write landed): nothing is written twice, and it counts as accepted.
    """
    attempt = outcome.attempt
    if state.result is not None:
        return "again" if state.result.to_json() == outcome.to_json() else "stale"
    if config.fence_results and state.attempts > attempt:
        return "stale"
    return "accept"
