"""The in-memory store: one process, for tests and the embedded engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..config import GuardConfig
from ..lifecycle import (
    FENCED,
    STALE_RESULT,
    STARTED,
    Accepted,
    BeginResult,
    Busy,
    CallSpec,
    CallState,
    Claimed,
    Event,
    Finished,
    FinishResult,
    Lease,
    Outcome,
    Refused,
    Stale,
    decide_begin,
    decide_finish,
    event_id,
    fenced_data,
    result_data,
    stamped,
    started_data,
)
from .base import Store, new_token


@dataclass
class _Call:
    spec: CallSpec
    registered_at: float
    attempts: int = 0
    result: Outcome | None = None
    lease: Lease | None = None
    events: list[Event] = field(default_factory=list)
    recovery_until: float = 0.0


class MemoryStore(Store):
    """A store in a dict, guarded by one lock. ``clock`` can be injected for tests."""

    kind = "memory"

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self._clock = clock
        self._lock = threading.RLock()
        self._calls: dict[str, _Call] = {}

    def now(self) -> float:
        return self._clock()

    def _call(self, spec: CallSpec) -> _Call:
        call = self._calls.get(spec.call_id)
        if call is None:
            call = self._calls[spec.call_id] = _Call(spec, self.now())
        elif spec.request and not call.spec.request:
            call.spec = spec
        return call

    def _live(self, call: _Call, now: float) -> bool:
        return call.lease is not None and (call.lease.expires_at or 0) > now

    def _state(self, call: _Call, now: float) -> CallState:
        return CallState(call.attempts, call.result, self._live(call, now))

    def _event(self, call: _Call, kind: str, attempt: int, data: dict) -> None:
        eid = event_id(call.spec.call_id, kind, attempt)
        if any(e.id == eid for e in call.events):
            return
        call.events.append(Event(eid, kind, call.spec.call_id, attempt, data, self.now()))

    def _record(self, call: _Call, outcome: Outcome) -> None:
        call.result = outcome
        call.lease = None
        self._event(call, outcome.event_type, outcome.attempt, result_data(call.spec, outcome))

    def begin(self, call: CallSpec, worker: str, config: GuardConfig) -> BeginResult:
        with self._lock:
            now = self.now()
            rec = self._call(call)
            decision = decide_begin(self._state(rec, now), config)
            if decision.kind == "finished":
                assert rec.result is not None
                return Finished(rec.result)
            if decision.kind == "busy":
                assert rec.lease is not None
                return Busy(rec.lease.worker, rec.lease.expires_at)
            if decision.kind == "refuse":
                assert decision.refusal is not None
                self._record(rec, decision.refusal)
                return Refused(decision.refusal)
            rec.attempts = decision.attempt
            rec.recovery_until = 0.0  # claimed: a later crash may be recovered at once
            rec.lease = Lease(
                call.call_id, decision.attempt, worker, new_token(), config.lease_ttl_s,
                now + config.lease_ttl_s,
            )
            self._event(rec, STARTED, decision.attempt, started_data(rec.spec, decision.attempt, worker))
            return Claimed(rec.lease)

    def _holds(self, lease: Lease) -> _Call | None:
        rec = self._calls.get(lease.call_id)
        if rec is None or rec.lease is None or rec.lease.token != lease.token:
            return None
        return rec

    def renew(self, lease: Lease) -> bool:
        with self._lock:
            now = self.now()
            rec = self._holds(lease)
            if rec is None or rec.lease is None or not self._live(rec, now):
                return False
            rec.lease = replace(rec.lease, expires_at=now + lease.ttl_s)
            return True

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig) -> FinishResult:
        outcome = stamped(outcome, lease.attempt)
        with self._lock:
            rec = self._calls.get(lease.call_id)
            if rec is None:
                rec = self._call(CallSpec(lease.call_id))
            verdict = decide_finish(self._state(rec, self.now()), outcome, config)
            if verdict == "accept":
                self._record(rec, outcome)
                return Accepted(outcome)
            if verdict == "again":
                return Accepted(outcome)
            self._event(rec, STALE_RESULT, lease.attempt, result_data(rec.spec, outcome))
            if self._holds(lease):
                rec.lease = None
            return Stale(rec.result)

    def release(self, lease: Lease) -> None:
        with self._lock:
            rec = self._holds(lease)
            if rec is not None:
                rec.lease = None

    def fenced(self, lease: Lease) -> None:
        with self._lock:
            rec = self._calls.get(lease.call_id)
            if rec is None:
                return
            self._event(rec, FENCED, lease.attempt, fenced_data(lease))
            if self._holds(lease):
                rec.lease = None

    def events(self, call_id: str) -> list[Event]:
        with self._lock:
            rec = self._calls.get(call_id)
            return list(rec.events) if rec else []

    def result(self, call_id: str) -> Outcome | None:
        with self._lock:
            rec = self._calls.get(call_id)
            return rec.result if rec else None

    def register(self, call: CallSpec) -> None:
        with self._lock:
            self._call(call)

    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        with self._lock:
            now = self.now() if now is None else now
            out = []
            for rec in self._calls.values():
                if rec.result is not None or self._live(rec, now):
                    continue
                if rec.attempts > 0 or rec.registered_at + unclaimed_grace_s <= now:
                    out.append(rec.spec)
            return out

    def claim_recovery(self, call_id: str, worker: str, hold_s: float) -> bool:
        with self._lock:
            rec = self._calls.get(call_id)
            now = self.now()
            if rec is None or rec.recovery_until > now:
                return False
            rec.recovery_until = now + hold_s
            return True

