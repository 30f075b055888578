"""The pure state machine of one tool call: no I/O, no Celery.

Every store reads a call's state, asks these functions what to do, and applies
the answer atomically. ``plan_begin``/``plan_finish``/``plan_fenced``/``plan_release``/``plan_hand_on``/``plan_record``
(and ``plan_checkpoint``/``plan_renew``/``plan_settle``) return the decision as :class:`Writes`: the reply and every payload to write (the
lease, the one result, the audit event with its id and data). The memory and SQL
stores apply them through one shared step (``stores/_writes.py``); the Redis store
gets the same payloads from these functions as script arguments, and its Lua only
mirrors the decision (it must decide in one round trip). The other rules a store
applies are here too: when a lease has :func:`lapsed`, what a purge deletes
(:data:`PURGED`, :func:`purgeable`) and a budget's spend (:func:`plan_spend`). The conformance suite and
the property test (``tests/stores``) prove that every store decides alike.

    NEW --begin--> RUNNING(n) --finish(n)--> COMPLETED | FAILED
                     | lease lapses / holder dies
                     +-- at_least_once, n < max --> RUNNING(n+1)
                     +-- at_least_once, n = max --> FAILED(ExecutionAbandoned)
                     +-- at_most_once ------------> FAILED(OutcomeUnknown)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .config import Delivery, GuardConfig
from .errors import (
    ABANDONED_MESSAGE,
    NotResolvable,
    OUTCOME_UNKNOWN_MESSAGE,
    OUTCOME_UNKNOWN_STORE_MESSAGE,
    POISON_CALL,
    STORE_UNREACHABLE,
    WORKER_LOST,
)

STARTED = "aaa.tool.started"
COMPLETED = "aaa.tool.completed"
FAILED = "aaa.tool.failed"
FENCED = "aaa.tool.fenced"
STALE_RESULT = "aaa.tool.stale_result"
RETRIED = "aaa.tool.retried"
#: A lost call's reconcile step settled it (``guard/reconcile.py``), id ``<call>:reconciled``.
RECONCILED = "aaa.tool.reconciled"
#: An operator resolved a call in doubt (``celery aaa resolve``), id ``<call>:resolved``.
RESOLVED = "aaa.tool.resolved"

# The engine's run events (aaa_celery.runtime): a run's own trail, beside its calls' trails.
TOOL_REQUESTED = "aaa.tool.requested"
RUN_STARTED = "aaa.run.started"
RUN_RESUMED = "aaa.run.resumed"
RUN_COMPLETED = "aaa.run.completed"
RUN_FAILED = "aaa.run.failed"
RUN_CANCELLED = "aaa.run.cancelled"
LLM_COMPLETED = "aaa.llm.completed"
LLM_REPLAYED = "aaa.llm.replayed"
LLM_UNRECORDED = "aaa.llm.unrecorded"
APPROVAL_REQUESTED = "aaa.approval.requested"
APPROVAL_GRANTED = "aaa.approval.granted"
APPROVAL_DENIED = "aaa.approval.denied"
APPROVAL_EXPIRED = "aaa.approval.expired"

#: ``json.dumps(obj, separators=(",", ":"))``, the form of every record and event the stores
#: keep, without building a new encoder for each call (the same text: the same options).
compact_json = json.JSONEncoder(separators=(",", ":")).encode


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
        return compact_json(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> CallSpec:
        return cls(**json.loads(raw))


def spec_rank(spec: CallSpec) -> int:
    """How well a spec says how to send the call again: 0 not at all, 1 a request that a
    worker rebuilt from what it received, 2 the whole message as the app sent it."""
    if "message" in spec.request:
        return 2
    return 1 if spec.request else 0


@dataclass(frozen=True)
class LateSpec(CallSpec):
    """A spec registered late (:func:`registered_late`); stored as the :class:`CallSpec` it is."""


def registered_late(spec: CallSpec) -> CallSpec:
    """``spec`` to register late: by the publisher once the store is back from the trouble that
    failed the registration at publish time. Meanwhile the call may have been sent anew (a
    retry, a wait for a concurrency slot), so it replaces no message as sent (:func:`replaces_below`)."""
    return LateSpec(**spec.__dict__)


def replaces_below(incoming: CallSpec) -> int:
    """``incoming`` replaces a stored spec whose :func:`spec_rank` is below this: one that says
    worse how to send the call again; a message as sent replaces any (a retry sends the call
    anew, with its own eta), unless it is registered late (:func:`registered_late`): the
    message stored is then the newer one."""
    rank = spec_rank(incoming)
    return 3 if rank == 2 and not isinstance(incoming, LateSpec) else rank


def merge_spec(stored: CallSpec | None, incoming: CallSpec) -> CallSpec:
    """The spec a store keeps for a call once ``incoming`` arrives: the first one it saw,
    unless ``incoming`` replaces it (:func:`replaces_below`)."""
    kept = incoming if stored is None or spec_rank(stored) < replaces_below(incoming) else stored
    return CallSpec(**kept.__dict__) if isinstance(kept, LateSpec) else kept


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
        return compact_json(self.__dict__)

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
        return compact_json(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Event:
        return cls(**json.loads(raw))


def event_id(call_id: str, kind: str, attempt: int) -> str:
    """The stable id of an audit event: ``<call>:attempt:<n>`` for a start, ``<call>:result``
    for the result, ``<call>:reconciled`` / ``<call>:resolved`` for a settlement (one a call)."""
    if kind == STARTED:
        return f"{call_id}:attempt:{attempt}"
    if kind in (COMPLETED, FAILED):
        return f"{call_id}:result"
    if kind in (RECONCILED, RESOLVED):
        return f"{call_id}:{kind.rsplit('.', 1)[1]}"
    suffix = {FENCED: "fenced", RETRIED: "retried"}.get(kind, "stale")
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


def lapsed(expires_at: float | None, now: float) -> bool:
    """Whether a TTL lease that runs out at ``expires_at`` has lapsed at ``now`` (seconds, on
    one clock): from ``expires_at`` on, so a lease is live only strictly before it. ``None``
    (no expiry recorded) is no TTL lease at all: lapsed.

    The one rule of every store and of the holder, each on its own clock:

    - memory and SQLite read it here; SQL's ``WHERE`` clauses use its image
      ``stores/sql/queries.live_at`` / ``lapsed_at`` (``expires > now`` / its negation);
    - Redis lets the server expire the lease key: a key lives while its clock has not
      passed the key's expiry, so the key is set to expire 1 ms (the server clock's step)
      before ``expires_at`` (``lua/_lib.lua``'s ``lease_until``), and the recovery index
      lists a call as lapsed from its score ``expires_at`` on;
    - the holder counts its lease lapsed ``ttl_s`` after the last renewal the store proved,
      on its monotonic clock (``guard/watchdog.py``);
    - a lease bound to a session (PostgreSQL) has no expiry: it lapses only with its
      session, which the store asks of the session's lock, never by this rule. Its row
      keeps a hint, :func:`sweep_hint`, that the holder's renewals move on: the recovery
      sweep asks the lock only of calls whose hint has lapsed by this rule (the same SQL
      image), so a live holder's call is not read at all, and a frozen holder past its
      hint is still live (its lock says so).

    ``tests/lifecycle/test_lapsed.py`` runs one table of cases against every form.
    """
    return expires_at is None or now >= expires_at


def sweep_hint(lease: Lease, now: float) -> float:
    """What a store writes as the expiry of ``lease`` claimed or renewed at ``now``: its expiry
    (a TTL lease), or, for a lease bound to a session (no expiry), ``now + ttl_s``: only a hint
    of when the recovery sweep should first ask whether its session still holds it. A holder
    that renews moves it on; one whose session died leaves it, and the sweep finds the call
    once the hint has :func:`lapsed`, within one ``ttl_s``."""
    return lease.expires_at if lease.expires_at is not None else now + lease.ttl_s


#: What a SQL store writes as the expiry of a call that has its result: never (it never
#: :func:`lapsed`). Finished rows are kept until ``aaa purge``, and a row with no expiry reads
#: as lapsed: without this every recovery sweep would read every finished call, a cost that
#: grows the longer a fleet runs. A lease that was given up without a result keeps no expiry
#: (the sweep must find it at once), and neither does a row that an older release finished
#: (read, then skipped for its result, as before).
FINISHED_HINT = math.inf


def lease_left(expires_at: float | None, now: float) -> float:
    """Seconds a TTL lease has left at ``now``: 0 once it has :func:`lapsed`."""
    return 0.0 if expires_at is None or lapsed(expires_at, now) else expires_at - now


def fenced_data(lease: Lease, cause: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"call_id": lease.call_id, "attempt": lease.attempt, "worker": lease.worker}
    if cause:
        data["cause"] = cause
    return data


def stamped(outcome: Outcome, attempt: int) -> Outcome:
    if outcome.attempt == attempt:
        return outcome
    return replace(outcome, attempt=attempt)


def result_data(call: CallSpec, outcome: Outcome, *, value: bool = True) -> dict[str, Any]:
    """An outcome's event data; ``value=False`` leaves a success's value out (it is kept
    once, in the call's result, and :func:`joined` shows it in the event again)."""
    data = {"call_id": call.call_id, "name": call.name, "attempt": outcome.attempt}
    if outcome.ok:
        if value:
            data["value"] = outcome.value
    else:
        data["error"] = outcome.error
        data["message"] = outcome.message
    return data


# -- Audit events, as lifecycle writes them --------------------------------------------


@dataclass(frozen=True)
class Draft:
    """An audit event before a store writes it: all of :class:`Event` but ``at``, the
    time the store stamps on it with its own clock (Redis: the server's)."""

    id: str
    type: str
    call_id: str
    attempt: int
    data: dict[str, Any]

    def to_json(self) -> str:
        return compact_json(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Draft:
        return cls(**json.loads(raw))

    def stamp(self, at: float) -> Event:
        return Event(self.id, self.type, self.call_id, self.attempt, self.data, at)


def _draft(call_id: str, kind: str, attempt: int, data: dict[str, Any]) -> Draft:
    return Draft(event_id(call_id, kind, attempt), kind, call_id, attempt, data)


def started_event(call: CallSpec, attempt: int, worker: str) -> Draft:
    """``aaa.tool.started`` of attempt ``attempt`` (id ``<call>:attempt:<n>``)."""
    return _draft(call.call_id, STARTED, attempt, started_data(call, attempt, worker))


def result_event(call: CallSpec, outcome: Outcome) -> Draft:
    """``aaa.tool.completed`` / ``aaa.tool.failed``: the call's one result (id ``<call>:result``).

    A success's value is not in the event as stored: a store keeps a (possibly large)
    value once, in the call's result, and ``Store.events`` joins it in (:func:`joined`)."""
    return _draft(call.call_id, outcome.event_type, outcome.attempt, result_data(call, outcome, value=False))


def joined(events: list[Event], result: Outcome | None) -> list[Event]:
    """A call's trail as readers see it: its ``aaa.tool.completed`` event with the value of
    the recorded result, which the store keeps once (see :func:`result_event`)."""
    if result is None or not result.ok:
        return events
    return [replace(e, data={**e.data, "value": result.value})
            if e.type == COMPLETED and e.id == f"{e.call_id}:result" and "value" not in e.data else e
            for e in events]


def stale_event(call: CallSpec, outcome: Outcome) -> Draft:
    """``aaa.tool.stale_result``: a result that was not applied, kept for audit."""
    return _draft(call.call_id, STALE_RESULT, outcome.attempt, result_data(call, outcome))


def fenced_event(lease: Lease, cause: str | None = None) -> Draft:
    """``aaa.tool.fenced``: an attempt that lost its lease and was cancelled; ``cause`` says
    why, when its holder knows (``store_unreachable``: no renewal could prove the lease)."""
    return _draft(lease.call_id, FENCED, lease.attempt, fenced_data(lease, cause))


def retried_event(lease: Lease) -> Draft:
    """``aaa.tool.retried``: an attempt that handed the call on to its next delivery."""
    return _draft(lease.call_id, RETRIED, lease.attempt, fenced_data(lease))


# -- Checkpoints ----------------------------------------------------------------------

#: The largest checkpoint a tool may save, as encoded JSON (bytes).
MAX_CHECKPOINT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Checkpoint:
    """A tool's saved progress: ``data`` (JSON), saved by attempt ``attempt``."""

    attempt: int
    data: Any

    def to_json(self) -> str:
        return compact_json(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Checkpoint:
        return cls(**json.loads(raw))


def checkpoint_json(attempt: int, data: Any) -> str:
    """The stored form of a checkpoint; ``ValueError`` if ``data`` is not JSON or too large."""
    try:
        raw = Checkpoint(attempt, data).to_json()
    except (TypeError, ValueError) as e:
        raise ValueError(f"a checkpoint must be JSON data: {e}") from e
    if len(raw.encode("utf-8")) > MAX_CHECKPOINT_BYTES:
        raise ValueError(
            f"a checkpoint is at most {MAX_CHECKPOINT_BYTES} bytes of JSON, this one is "
            f"{len(raw.encode('utf-8'))}: keep large state in your own storage and checkpoint its key"
        )
    return raw


# -- Replies ---------------------------------------------------------------------------


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


# -- Decisions -------------------------------------------------------------------------


@dataclass(frozen=True)
class CallState:
    """What ``begin``/``finish`` need to know of a call, read atomically by a store.

    ``holder`` and ``expires_at`` describe the live lease (``holder_live``): the
    worker that holds it and when it lapses (None for a lease bound to a session).
    ``handed_on`` is the attempt that last handed the call on to its next delivery
    (a retry its body asked for), 0 if none did; ``handed`` is how many attempts did.
    ``token`` is the token of the call's last claim while its holder has not let it go
    (live or lapsed), "" if none: a retried ``begin`` with that token is recognized.
    ``lost_cause`` is the ``cause`` the last attempt's holder recorded with its
    ``aaa.tool.fenced`` event, "" if none (read only for a call whose lease lapsed).
    """

    attempts: int = 0
    result: Outcome | None = None
    holder_live: bool = False
    holder: str = ""
    expires_at: float | None = None
    handed_on: int = 0
    handed: int = 0
    token: str = ""
    lost_cause: str = ""


def same_claim(stored: str, token: str | None) -> bool:
    """Whether the lease token ``stored`` was given out by a ``begin`` that used ``token``.

    A session-bound store prefixes the token with its session (``<session>.<token>``), and a
    retried ``begin`` runs on a new session, so only the part after the last dot counts."""
    return bool(stored) and bool(token) and stored.rpartition(".")[2] == str(token).rpartition(".")[2]


@dataclass(frozen=True)
class BeginDecision:
    kind: Literal["claim", "busy", "finished", "refuse"]
    attempt: int = 0
    refusal: Outcome | None = None


def attempt_cap(config: GuardConfig) -> int:
    """The attempt count from which a call whose last attempt was lost is refused:
    ``max_attempts``, or 1 under at_most_once (any lost attempt ends the call)."""
    return 1 if config.delivery is Delivery.AT_MOST_ONCE else config.max_attempts


def loss_cause(config: GuardConfig, lost: int, recorded: str = "") -> str:
    """Why the call's last attempt was lost: what its holder recorded, else a lost worker;
    under at_least_once, several lost attempts in a row are a poison call."""
    if recorded:
        return recorded
    if config.delivery is not Delivery.AT_MOST_ONCE and lost > 1:
        return POISON_CALL
    return WORKER_LOST


def refusal(attempts: int, config: GuardConfig, lost: int | None = None, cause: str = "") -> Outcome:
    """The failure recorded for a call refused after ``attempts`` attempts, ``lost`` of
    them lost (all, by default): ``OutcomeUnknown`` under at_most_once, else
    ``ExecutionAbandoned``. Its message ends with ``(cause: <loss>)`` (see
    :func:`loss_cause`; ``cause``: what the last attempt's holder recorded, if anything)."""
    lost = attempts if lost is None else lost
    why = loss_cause(config, lost, cause)
    if config.delivery is Delivery.AT_MOST_ONCE:
        text = OUTCOME_UNKNOWN_STORE_MESSAGE if why == STORE_UNREACHABLE else OUTCOME_UNKNOWN_MESSAGE
        return Outcome.failure("OutcomeUnknown", f"{text} (cause: {why})", attempts)
    return Outcome.failure("ExecutionAbandoned", f"{ABANDONED_MESSAGE.format(attempts=lost)} (cause: {why})",
                           attempts)


def decide_begin(state: CallState, config: GuardConfig, token: str | None = None) -> BeginDecision:
    """Decide what a delivery of a call does: run it, wait, or answer without running.

    ``begin`` is idempotent: a ``begin`` retried with the ``token`` of a claim whose reply
    was lost (the write landed, the answer did not) claims that same attempt again, live
    or lapsed. It is never refused as busy, and no attempt is wasted or counted as lost:
    that attempt's body never ran, since its worker never heard it had the claim.

    The caps count *lost* attempts (crashes, stalls). An attempt that handed the call on
    (a retry its body asked for) was not lost: its owner reported that it is not done. So
    the next delivery is the next attempt, under at_most_once too, and it does not count
    toward ``max_attempts`` (Celery's own ``max_retries`` bounds retries).
    """
    if state.result is not None:
        return BeginDecision("finished")
    if state.attempts > 0 and same_claim(state.token, token):
        return BeginDecision("claim", attempt=state.attempts)
    if state.holder_live:
        return BeginDecision("busy")
    last_handed_on = state.attempts > 0 and state.handed_on == state.attempts
    lost = state.attempts - state.handed
    if state.attempts > 0 and not last_handed_on and lost >= attempt_cap(config):
        return BeginDecision("refuse", refusal=refusal(state.attempts, config, lost, state.lost_cause))
    return BeginDecision("claim", attempt=state.attempts + 1)


def same_outcome(recorded: Outcome | None, expected: Outcome) -> bool:
    """Whether ``recorded`` is the very record ``expected``: the same JSON, the form every
    store keeps (Python's ``==`` would take ``True`` for ``1`` and ``1.0`` for ``1``)."""
    return recorded is not None and recorded.to_json() == expected.to_json()


def decide_finish(
    state: CallState, outcome: Outcome, config: GuardConfig
) -> Literal["accept", "again", "stale"]:
    """Decide whether ``outcome`` (stamped with its attempt) becomes the call's one result.

    ``again`` means this very outcome is already recorded (a retried ``finish``
    whose first write landed): nothing is written twice, and it counts as accepted.
    """
    attempt = outcome.attempt
    if state.result is not None:
        return "again" if same_outcome(state.result, outcome) else "stale"
    if config.fence_results and state.attempts > attempt:
        return "stale"
    return "accept"


# -- Decisions as writes -----------------------------------------------------------------


@dataclass(frozen=True)
class Writes:
    """A decision as a store applies it, in one atomic step, then answers ``reply``.

    Each field is one write; the store applies those that are set, in this order:

    - ``claim``: the attempt counter becomes ``claim.attempt`` and ``claim`` becomes the
      call's lease; any recovery hold ends (a later crash may be recovered at once).
    - ``record``: the call's one result. It frees the call's lease, whoever holds it,
      and takes the call out of recovery.
    - ``event``: append this audit event, stamped with the store's clock, unless an
      event with its id exists.
    - ``let_go``: free the lease if the lease with this token still holds the call.
    - ``hand_on``: this lease, live, holds the call: its attempt hands the call on
      (``handed_on`` becomes that attempt, ``handed`` counts one more) and the lease is freed. The call then waits for
      its next delivery as a newly registered call does: recovery brings it back only
      once the unclaimed grace has passed since the hand-on.
    - ``checkpoint``: keep this (a :class:`Checkpoint`'s JSON) as the call's last checkpoint.
    - ``settle``: replace the call's recorded result with this one (:func:`plan_settle`,
      :func:`plan_resolve`); the lease and the recovery index are as they were.
    - ``renew``: this lease, live, holds the call: it lapses ``renew.ttl_s`` after the
      store's now (a SQL row keeps that as its sweep hint, :func:`sweep_hint`).
    """

    reply: BeginResult | FinishResult | Outcome | bool | None = None
    claim: Lease | None = None
    record: Outcome | None = None
    event: Draft | None = None
    let_go: str | None = None
    hand_on: Lease | None = None
    checkpoint: str | None = None
    settle: Outcome | None = None
    renew: Lease | None = None


def plan_begin(
    state: CallState, call: CallSpec, worker: str, config: GuardConfig, token: str, now: float | None
) -> Writes:
    """A delivery of ``call`` (the spec the store keeps) to ``worker``, as writes.

    A claim's lease gets ``token``, and lapses ``config.lease_ttl_s`` after ``now``
    (``now`` None: the lease is bound to a session and has no expiry). A ``token`` that
    made the call's last claim claims that attempt again (see :func:`decide_begin`).
    """
    decision = decide_begin(state, config, token)
    if decision.kind == "finished":
        assert state.result is not None
        return Writes(Finished(state.result))
    if decision.kind == "busy":
        return Writes(Busy(state.holder, state.expires_at))
    if decision.kind == "refuse":
        assert decision.refusal is not None
        failure = decision.refusal
        return Writes(Refused(failure), record=failure, event=result_event(call, failure))
    ttl_s = config.lease_ttl_s
    lease = Lease(call.call_id, decision.attempt, worker, token, ttl_s, None if now is None else now + ttl_s)
    return Writes(Claimed(lease), claim=lease, event=started_event(call, decision.attempt, worker))


def plan_finish(state: CallState, call: CallSpec, lease: Lease, outcome: Outcome, config: GuardConfig) -> Writes:
    """``lease``'s attempt reporting ``outcome`` for ``call`` (the spec the store keeps), as writes."""
    outcome = stamped(outcome, lease.attempt)
    verdict = decide_finish(state, outcome, config)
    if verdict == "accept":
        return Writes(Accepted(outcome), record=outcome, event=result_event(call, outcome))
    if verdict == "again":
        return Writes(Accepted(outcome))
    return Writes(Stale(state.result), event=stale_event(call, outcome), let_go=lease.token)


def plan_fenced(lease: Lease, cause: str | None = None) -> Writes:
    """``lease``'s attempt lost its lease and was cancelled: audit it (with ``cause``, if
    known), and let the lease go."""
    return Writes(event=fenced_event(lease, cause), let_go=lease.token)


def plan_hand_on(lease: Lease, holds: bool) -> Writes:
    """``lease``'s attempt ends without a result and hands the call on to its next delivery;
    ``holds``: whether that lease is live and still holds the call (else it is audited only:
    an attempt that lost its lease cannot hand the call on)."""
    return Writes(event=retried_event(lease), hand_on=lease if holds else None)


def checked_checkpoint(lease: Lease, checkpoint: str) -> str:
    """The checkpoint a store keeps when ``lease``'s attempt saves ``checkpoint`` (the JSON of
    :func:`checkpoint_json`): its data, stamped with the lease's attempt.

    Raises:
        ValueError: ``checkpoint`` is not a checkpoint's JSON, or is over :data:`MAX_CHECKPOINT_BYTES`.
    """
    try:
        saved = Checkpoint.from_json(checkpoint)
    except (TypeError, ValueError) as e:
        raise ValueError(f"a checkpoint is the JSON of lifecycle.checkpoint_json, not {checkpoint[:80]!r}") from e
    return checkpoint_json(lease.attempt, saved.data)


def plan_checkpoint(lease: Lease, holds: bool, checkpoint: str) -> Writes:
    """``lease``'s attempt saves ``checkpoint``, as writes: kept as the call's last checkpoint
    (:func:`checked_checkpoint`, which raises ``ValueError`` for one no store keeps) only while
    that lease is live and holds the call (``holds``); the reply says whether it was kept.
    (Redis plans for a lease that holds, and ``lua/lease.lua`` applies the plan only while it does.)"""
    kept = checked_checkpoint(lease, checkpoint)
    return Writes(True, checkpoint=kept) if holds else Writes(False)


def plan_renew(lease: Lease, holds: bool) -> Writes:
    """``lease``'s holder renews it, as writes: only while that lease is live and holds the
    call (``holds``), it then lapses ``lease.ttl_s`` from the store's now; the reply says
    whether. (A lease bound to a session has no expiry to move: PostgreSQL asks its session
    whether it still holds the lock, and moves the row's sweep hint on in the same statement.)"""
    return Writes(True, renew=lease) if holds else Writes(False)


def plan_release(lease: Lease) -> Writes:
    """``lease``'s holder gives the lease back without a result (the attempt counts as lost)."""
    return Writes(let_go=lease.token)


#: How an outcome recorded from outside an attempt (:func:`plan_record`) is checked:
#:
#: - ``first``: first writer wins (a revoked or expired call, a refused message, a policy's
#:   denial, a call the store cannot write): recorded unless the call has a result.
#: - ``fenced``: also only while no attempt later than ``outcome.attempt`` has started (a
#:   hard time limit ends the attempt the worker killed, never a later one).
#: - ``abandon``: recovery gives up on a call it knows: only while no live lease holds it
#:   and its attempt count is still ``outcome.attempt`` (``Store.abandon``).
RecordKind = Literal["first", "fenced", "abandon"]
RECORD_KINDS: tuple[RecordKind, ...] = ("first", "fenced", "abandon")


def record_allowed(kind: RecordKind, state: CallState, outcome: Outcome) -> bool:
    """Whether ``outcome`` may become the call's one result, recorded from outside an
    attempt as ``kind`` says (see :data:`RecordKind`); no lease is taken or needed."""
    if state.result is not None:
        return False
    if kind == "fenced":
        return state.attempts <= outcome.attempt
    if kind == "abandon":
        return not state.holder_live and state.attempts == outcome.attempt
    return True


def plan_record(kind: RecordKind, state: CallState, call: CallSpec, outcome: Outcome) -> Writes:
    """An outcome recorded from outside an attempt, as writes: the call's one result with its
    event (the result frees the lease, whoever holds it), else nothing; the reply says which.

    Every such path (a revocation, a refused or denied message, a hard time limit, a call the
    store cannot write, recovery giving up) is this one plan (``Store.record``); an operator's
    resolution and a reconcile step replace a result instead (``Store.settle``).
    """
    if kind not in RECORD_KINDS:
        raise ValueError(f"record kind must be one of {RECORD_KINDS}, not {kind!r}")
    if not record_allowed(kind, state, outcome):
        return Writes(False)
    return Writes(True, record=outcome, event=result_event(call, outcome))


def held_by(lease_token: str | None, token: str, live: bool) -> bool:
    """Whether the lease with ``token`` holds the call whose lease has ``lease_token``
    (None: none) and is ``live`` or not: it is the call's lease, and live. (SQL's
    ``lease_holds`` and ``lua/_lib.lua``'s ``holds`` ask the same, a lapsed Redis lease's key
    being gone.)"""
    return live and bool(lease_token) and lease_token == token


def fresh_event(event: Draft, state: CallState) -> bool:
    """Whether a call in ``state`` proves that no event with ``event``'s id is in its trail
    (a store may then append it without reading the trail): an attempt's started event is
    written only by its claim, and the result event only with the result."""
    if event.type == STARTED:
        return event.attempt > state.attempts
    return event.type in (COMPLETED, FAILED) and state.result is None


def lost_cause_event(call_id: str, attempts: int, result: Outcome | None, holder_live: bool) -> str | None:
    """The id of the event that may say why the call's last attempt was lost
    (``CallState.lost_cause``: its holder's ``aaa.tool.fenced``): only a call claimed before,
    without a result, whose lease is not live has one to look up; None for any other.
    (``lua/begin.lua`` reads it for the same calls.)"""
    if holder_live or attempts == 0 or result is not None:
        return None
    return event_id(call_id, FENCED, attempts)


def awaits_recovery(attempts: int, handed_on: int, seen_at: float, now: float, grace_s: float,
                    result: Outcome | None = None, holder_live: bool = False) -> bool:
    """Whether recovery brings back a call (``Store.expired``): one that has no ``result``
    and no live lease (``holder_live``) whose last attempt was lost (claimed, and it did not hand the call
    on), or nobody claimed the call within ``grace_s`` of when it was seen (registered, or
    handed on). SQL evaluates it in ``select_unfinished``'s ``WHERE``; Redis keeps it as its
    two indexes: ``running`` (claimed, scored by lease expiry; a hand-on leaves it) and
    ``unclaimed`` (scored by when the call was seen). Both read the second half as a range,
    ``seen_at <= now - grace_s``, as it is written here."""
    if result is not None or holder_live:
        return False
    lost = attempts > 0 and handed_on != attempts
    return lost or seen_at <= now - grace_s


def recovery_hold(tries: int, hold_s: float, max_hold_s: float | None) -> float:
    """How long the ``tries``-th republish of a call holds it: ``hold_s``, doubled for each
    earlier republish since its last claim, at most ``max_hold_s``."""
    longest = hold_s if max_hold_s is None else max(hold_s, max_hold_s)
    return float(min(longest, hold_s * 2 ** (tries - 1)))


def plan_recovery_claim(state: CallState | None, counted: tuple[int, int] | None, held_until: float, now: float,
                        hold_s: float, max_hold_s: float | None) -> tuple[int, float] | None:
    """A sweep's claim of the right to republish a call (``Store.claim_recovery``), whose
    state is ``state`` (None: a call the store does not know): None for a call recovery does
    not bring back (unknown, finished, or held by a live lease) and while an earlier
    republish holds it (until ``held_until``), else ``(tries, until)``. ``counted`` is the
    call's republish count so far with the attempt count it was counted at: a claim (a new
    attempt) restarts it, so ``tries`` is 1 again; ``until`` backs off with
    :func:`recovery_hold`. (A store may plan for a lease it has not looked at yet, as not
    live, and plan again if it is: ``lua/claim_recovery.lua`` applies a plan only in the
    state it was made for.)"""
    if state is None or state.result is not None or state.holder_live or held_until > now:
        return None
    tries = counted[1] + 1 if counted is not None and counted[0] == state.attempts else 1
    return tries, now + recovery_hold(tries, hold_s, max_hold_s)


#: What a purge deletes of a call: every record a store keeps of it (``Store.purge``), the
#: call's own record last.
PURGED = ("result", "events", "checkpoint", "recovery", "call")


def purgeable(result: Outcome | None, seen_at: float, before: float) -> bool:
    """Whether a purge with cutoff ``before`` deletes a call (every record of it that
    :data:`PURGED` names): only a call with its result, seen before the cutoff. A call is
    seen when it is registered (or first delivered), and again when an attempt hands it on
    to its next delivery (it then waits as a newly registered call): ``CallRecord.seen_at``.
    (SQL's ``select_finished_before`` evaluates it server-side; Redis plans by
    :func:`plan_purge`.)"""
    return result is not None and seen_at < before


def plan_purge(known: bool, result: Outcome | None, seen_at: float | None, before: float) -> Literal["call", "entry"] | None:
    """What a purge with cutoff ``before`` deletes of a call the store may not know
    (``known``) but lists as seen at ``seen_at`` (None: not listed), both on one clock:
    every record of it (``call``) if :func:`purgeable`; only its listing (``entry``) for a
    call whose records are gone already (a store whose finished records expire: Redis) and
    that was seen before the cutoff; else nothing (None). ``lua/purge.lua`` applies the plan
    in the state it was made for."""
    if seen_at is None or seen_at >= before:
        return None
    if not known:
        return "entry"
    return "call" if purgeable(result, seen_at, before) else None


# -- Budgets ----------------------------------------------------------------------------

#: Slack for float sums in a budget (0.1 + 0.2 spent against a limit of 0.3 is within it).
EPSILON = 1e-9


def window_of(now: float, window_s: float) -> int:
    """The number of the budget window that ``now`` (store clock, seconds) falls in: time is cut
    in fixed windows of ``window_s`` seconds from the clock's epoch (86400 s: a UTC day)."""
    return math.floor(now / window_s)


def admits(total: float, amount: float, limit: float) -> bool:
    """Whether ``amount`` more fits in a window that has ``total`` spent."""
    return total + amount <= limit + EPSILON * max(1.0, abs(limit))


@dataclass(frozen=True)
class Spend:
    """A spend against a budget as a store applies it, in one atomic step, then answers ``reply``.

    ``window`` is the budget's window from now on; ``restart``: empty the budget first (total 0,
    no token counted), as a new window starts; ``count``: add this amount to the total and count
    the token (None: nothing is counted)."""

    reply: bool
    window: int
    restart: bool = False
    count: float | None = None


def plan_spend(found: int | None, total: float, counted: bool, amount: float, limit: float,
               window_s: float, now: float) -> Spend:
    """Spend ``amount`` of a budget whose stored state is window ``found`` (None: none yet)
    with ``total`` spent, ``counted`` saying whether this spend's token was counted in it:

    - a budget starts empty in every window;
    - a token counts at most once per window: spending with it again answers True and adds
      nothing (a redelivered call never spends twice);
    - an amount is counted only if the window's total with it stays within ``limit``
      (:func:`admits`); else the answer is False.

    (``stores/budgets.py`` checks the arguments; ``lua/spend.lua`` applies the plan if the
    budget is still as read, and asks again if it is not.)"""
    window = window_of(now, window_s)
    restart = found != window
    if restart:
        total, counted = 0.0, False
    if counted:
        return Spend(True, window, restart)
    if not admits(total, amount, limit):
        return Spend(False, window, restart)
    return Spend(True, window, restart, float(amount))


def plan_settle(recorded: Outcome | None, expected: Outcome, outcome: Outcome, event: Draft) -> Writes:
    """A compare-and-set of a call's result (``Store.settle``, the guard's reconciliation of a
    lost call), as writes: ``outcome`` replaces the recorded result, with ``event``, only if
    that result is still ``expected`` (:func:`same_outcome`); the reply says whether.
    (``lua/resolve.lua`` compares the stored JSON with ``expected``'s, in the step that writes.)"""
    if not same_outcome(recorded, expected):
        return Writes(False)
    return Writes(True, settle=outcome, event=event)


#: Recorded failures that only say the outcome is in doubt: an operator may settle them.
IN_DOUBT = ("OutcomeUnknown", "ExecutionAbandoned")


def plan_resolve(call: CallSpec, current: Outcome | None, verdict: Literal["completed", "failed"],
                 note: str, by: str, value: Any = None) -> Writes:
    """An operator's verdict on a call in doubt, as writes: the result that settles it as
    ``verdict`` (also the reply), with its audit event, replacing ``current``.

    Raises:
        NotResolvable: the call has no result yet (it may still run: wait, or let the
            guard decide), or a real one (never overwritten).
    """
    if current is None:
        raise NotResolvable(f"{call.call_id}: no recorded outcome yet (running or waiting for recovery); "
                            "only OutcomeUnknown or ExecutionAbandoned calls can be resolved",
                            call_id=call.call_id)
    if current.ok or current.error not in IN_DOUBT:
        what = "completed" if current.ok else f"failed with {current.error}"
        raise NotResolvable(f"{call.call_id}: already {what}; a real result is never overwritten",
                            call_id=call.call_id, current=current)
    if verdict == "completed":
        outcome = Outcome.success(value, current.attempt)
    else:
        outcome = Outcome.failure("ToolError", f"resolved as failed by {by}: {note}", current.attempt)
    data = {"call_id": call.call_id, "name": call.name, "as": verdict, "note": note, "by": by,
            "was": {"error": current.error, "message": current.message}}
    if verdict == "completed":
        data["value"] = value
    event = Draft(event_id(call.call_id, RESOLVED, current.attempt), RESOLVED, call.call_id, current.attempt, data)
    return Writes(outcome, settle=outcome, event=event)


# -- Concurrency slots --------------------------------------------------------------------

#: Seconds a concurrency slot outlives its holder's last renewal, past the lease TTL: a holder
#: takes its slot just before it claims its lease and renews the lease just before the slot,
#: so the slot never lapses before the lease it stands for.
SLOT_GRACE_S = 1.0

@dataclass(frozen=True)
class Slot:
    """One of the ``limit`` slots of ``key`` that a call must hold to run (``policy.Concurrency``).

    ``key`` is already scoped (a digest of the rule, the tool, the tenant and the key's values:
    ``policy.Concurrency.slot_key``); ``rule`` names the rule in denials and audit events.
    ``on_busy``: what a call does when every slot is held: hand its message back for later
    (``wait``), end with a recorded ``CallSkipped`` (``skip``), or with ``PolicyDenied``
    (``reject``)."""

    key: str
    limit: int
    on_busy: Literal["wait", "skip", "reject"] = "wait"
    rule: str = "Concurrency"


@dataclass(frozen=True)
class SlotPlan:
    """A take (or a renewal) of a slot as a store applies it, in one atomic step.

    ``reply``: ``taken`` (the call is a new holder), ``held`` (it held a slot already: its
    expiry moves on), ``full`` (every slot is held by a live holder; nothing is written).
    ``drop``: holders whose slot lapsed, to delete. ``put``: the call's slot expiry to write
    (store clock; None: nothing). ``holders``: the other live holders, by call id."""

    reply: Literal["taken", "held", "full"]
    drop: tuple[str, ...] = ()
    put: float | None = None
    holders: tuple[str, ...] = ()


def plan_slot(holders: dict[str, float], call_id: str, limit: int, ttl_s: float, now: float) -> SlotPlan:
    """May ``call_id`` hold one of the ``limit`` slots of a key whose holders are ``holders``
    (call id -> slot expiry, store clock)? The one rule of every store:

    - a holder whose slot has :func:`lapsed` holds nothing (its holder died or froze past its
      TTL and a grace; it is dropped);
    - a call that holds a slot keeps it: taking again (any delivery of it) or renewing moves
      its expiry on, whatever the limit now is (one call never competes with itself; its
      lease decides which delivery runs);
    - else the call takes a slot only if fewer than ``limit`` live holders have one.

    A slot lapses :data:`SLOT_GRACE_S` after the lease TTL from its last take or renewal."""
    live = {c for c, expires in holders.items() if not lapsed(expires, now)}
    drop = tuple(sorted(c for c in holders if c not in live))
    others = tuple(sorted(live - {call_id}))
    until = now + ttl_s + SLOT_GRACE_S
    if call_id in live:
        return SlotPlan("held", drop, until, others)
    if len(others) >= limit:
        return SlotPlan("full", drop, None, others)
    return SlotPlan("taken", drop, until, others)


def busy_outcome(name: str, slot: Slot, holders: tuple[str, ...]) -> Outcome:
    """The one result of a call that found every slot of its key held, under ``skip``
    (``CallSkipped``) or ``reject`` (``PolicyDenied``): it names the rule and the holders."""
    shown = ", ".join(holders[:5]) + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
    what, error = ("skipped", "CallSkipped") if slot.on_busy == "skip" else ("denied", "PolicyDenied")
    return Outcome.failure(error, f"{name}: {what} by the guard policy's rule {slot.rule!r}: "
                                  f"{slot.limit} call(s) with its key run already ({shown})")
