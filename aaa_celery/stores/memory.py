"""The in-memory store: one process, for tests and the embedded engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..config import GuardConfig
from ..lifecycle import (BeginResult, CallSpec, RESOLVED, CallState, Checkpoint, Draft, Event, FinishResult, Lease,
                         Outcome, RecordKind, SlotPlan, Writes, awaits_recovery, held_by, lost_cause_event, joined,
                         lapsed, merge_spec, plan_begin, plan_checkpoint, plan_fenced, plan_finish, plan_hand_on,
                         plan_record, plan_resolve, plan_recovery_claim, plan_release, plan_renew, plan_settle,
                         plan_slot, plan_spend, purgeable)
from ._writes import CallWriter, apply
from .base import ResultCopy, Store, new_token
from .budgets import check_spend
from .ops import CallRecord
from .runs_memory import DEFAULT_RUN_RETENTION, MemoryRuns


@dataclass
class _Call:
    spec: CallSpec
    registered_at: float
    attempts: int = 0
    result: Outcome | None = None
    lease: Lease | None = None
    events: list[Event] = field(default_factory=list)
    recovery_until: float = 0.0
    #: Republishes since the last claim: counted while ``attempts`` is ``recovery_attempts``.
    recovery_tries: int = 0
    recovery_attempts: int = 0
    handed_on: int = 0
    handed: int = 0
    checkpoint: str | None = None

    def live(self, now: float) -> bool:
        return self.lease is not None and not lapsed(self.lease.expires_at, now)

    def held_by(self, token: str, now: float) -> bool:
        """Whether the lease with ``token`` is live and holds the call."""
        return held_by(self.lease.token if self.lease is not None else None, token, self.live(now))

    def state(self, now: float) -> CallState:
        token = self.lease.token if self.lease is not None else ""
        if not self.live(now):
            fenced = lost_cause_event(self.spec.call_id, self.attempts, self.result, False)
            cause = next((str(e.data.get("cause") or "") for e in self.events if e.id == fenced), "") if fenced else ""
            return CallState(self.attempts, self.result, handed_on=self.handed_on, handed=self.handed, token=token,
                             lost_cause=cause)
        assert self.lease is not None
        return CallState(self.attempts, self.result, True, self.lease.worker, self.lease.expires_at,
                         self.handed_on, self.handed, token)


@dataclass
class _Writer(CallWriter):
    """A call's record, written at ``now``."""

    call: _Call
    now: float

    def claim(self, lease: Lease) -> None:
        self.call.attempts = lease.attempt
        self.call.lease = lease
        self.call.recovery_until = 0.0

    def record(self, outcome: Outcome) -> None:
        self.call.result = outcome
        self.call.lease = None

    def append(self, event: Draft) -> None:
        if all(e.id != event.id for e in self.call.events):
            self.call.events.append(event.stamp(self.now))

    def let_go(self, token: str) -> None:
        if self.call.lease is not None and self.call.lease.token == token:
            self.call.lease = None

    def checkpoint(self, checkpoint: str) -> None:
        self.call.checkpoint = checkpoint

    def settle(self, outcome: Outcome) -> None:
        self.call.result = outcome

    def hand_on(self, lease: Lease) -> None:
        self.call.handed_on = lease.attempt
        self.call.handed += 1
        self.call.lease = None
        self.call.registered_at = self.now

    def renew(self, lease: Lease) -> None:
        assert self.call.lease is not None
        self.call.lease = replace(self.call.lease, expires_at=self.now + lease.ttl_s)


class MemoryStore(MemoryRuns, Store):
    """A store in a dict, guarded by one lock. ``clock`` can be injected for tests;
    ``run_retention`` bounds how many finished runs it keeps (:mod:`.runs_memory`)."""

    kind = "memory"

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.time,
                 run_retention: int = DEFAULT_RUN_RETENTION) -> None:
        self.url = url
        self.run_retention = run_retention
        self._clock = clock
        self._lock = threading.RLock()
        self._calls: dict[str, _Call] = {}
        self._budgets: dict[str, tuple[int, float, set[str]]] = {}  # key -> window, total, tokens
        self._slots: dict[str, dict[str, float]] = {}  # key -> holder call id -> slot expiry

    def now(self) -> float:
        return self._clock()

    def _call(self, spec: CallSpec) -> _Call:
        call = self._calls.get(spec.call_id)
        if call is None:
            call = self._calls[spec.call_id] = _Call(spec, self.now())
        call.spec = merge_spec(call.spec, spec)
        return call

    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        with self._lock:
            now = self.now()
            rec = self._call(call)
            writes = plan_begin(rec.state(now), rec.spec, worker, config, token or new_token(), now)
            begun: BeginResult = apply(writes, _Writer(rec, now))
            return begun

    def _known(self, call_id: str, plan: Callable[[_Call, float], Writes], unknown: Any = None) -> Any:
        """Apply ``plan(call, now)`` to a known call and return its reply; ``unknown`` if the call is not known."""
        with self._lock:
            rec, now = self._calls.get(call_id), self.now()
            return unknown if rec is None else apply(plan(rec, now), _Writer(rec, now))

    def renew(self, lease: Lease) -> bool:
        return bool(self._known(lease.call_id, lambda rec, now: plan_renew(lease, rec.held_by(lease.token, now)), False))

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig,
               copy: ResultCopy | None = None) -> FinishResult:
        with self._lock:
            now = self.now()
            rec = self._call(CallSpec(lease.call_id))
            writes = plan_finish(rec.state(now), rec.spec, lease, outcome, config)
            finished: FinishResult = apply(writes, _Writer(rec, now))
            return finished

    def release(self, lease: Lease) -> None:
        self._known(lease.call_id, lambda rec, now: plan_release(lease))

    def fenced(self, lease: Lease, cause: str | None = None) -> None:
        self._known(lease.call_id, lambda rec, now: plan_fenced(lease, cause))

    def hand_on(self, lease: Lease) -> None:
        self._known(lease.call_id, lambda rec, now: plan_hand_on(lease, rec.held_by(lease.token, now)))

    def save_checkpoint(self, lease: Lease, checkpoint: str) -> bool:
        with self._lock:
            rec, now = self._calls.get(lease.call_id), self.now()
            writes = plan_checkpoint(lease, rec is not None and rec.held_by(lease.token, now), checkpoint)
            if rec is None:
                return False
            kept: bool = apply(writes, _Writer(rec, now))
            return kept

    def last_checkpoint(self, call_id: str) -> Checkpoint | None:
        with self._lock:
            rec = self._calls.get(call_id)
            return Checkpoint.from_json(rec.checkpoint) if rec is not None and rec.checkpoint else None

    def events(self, call_id: str) -> list[Event]:
        with self._lock:
            rec = self._calls.get(call_id)
            return joined(list(rec.events), rec.result) if rec else []

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
                if awaits_recovery(rec.attempts, rec.handed_on, rec.registered_at, now, unclaimed_grace_s,
                                   rec.result, rec.live(now)):
                    out.append(rec.spec)
            return out

    def claim_recovery(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int:
        with self._lock:
            rec = self._calls.get(call_id)
            now = self.now()
            if rec is None:
                claim = plan_recovery_claim(None, None, 0.0, now, hold_s, max_hold_s)
            else:
                claim = plan_recovery_claim(CallState(rec.attempts, rec.result, rec.live(now)),
                                            (rec.recovery_attempts, rec.recovery_tries), rec.recovery_until,
                                            now, hold_s, max_hold_s)
            if rec is None or claim is None:
                return 0
            (rec.recovery_tries, rec.recovery_until), rec.recovery_attempts = claim, rec.attempts
            return rec.recovery_tries

    def record(self, call: CallSpec, outcome: Outcome, kind: RecordKind = "first") -> bool:
        with self._lock:
            rec = self._calls.get(call.call_id) if kind == "abandon" else self._call(call)
            if rec is None:
                return False
            now = self.now()
            recorded: bool = apply(plan_record(kind, rec.state(now), rec.spec, outcome), _Writer(rec, now))
            return recorded

    # -- Operators' verbs (stores/ops.py) ----------------------------------------------

    def calls(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]:
        with self._lock:
            now = self.now()
            found = [
                CallRecord(rec.spec.call_id, rec.spec, rec.registered_at, rec.attempts, rec.result,
                           rec.lease.worker if rec.live(now) and rec.lease else None,
                           any(e.type == RESOLVED for e in rec.events))
                for rec in self._calls.values()
                if (since is None or rec.registered_at >= since) and (until is None or rec.registered_at <= until)
            ]
        yield from sorted(found, key=lambda r: (r.seen_at, r.call_id), reverse=True)

    def resolve(self, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                value: Any = None) -> Outcome:
        with self._lock:
            rec = self._calls.get(call_id)
            writes = plan_resolve(rec.spec if rec else CallSpec(call_id), rec.result if rec else None,
                                  verdict, note, by, value)
            assert rec is not None
            outcome: Outcome = apply(writes, _Writer(rec, self.now()))
            return outcome

    def settle(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool:
        return bool(self._known(call_id, lambda rec, now: plan_settle(rec.result, expected, outcome, event), False))

    def purge(self, before: float) -> int:
        with self._lock:
            # A call's one record holds every kind lifecycle.PURGED names.
            old = [k for k, rec in self._calls.items() if purgeable(rec.result, rec.registered_at, before)]
            for k in old:
                del self._calls[k]
            return len(old)

    # -- Budgets (stores/budgets.py) ----------------------------------------------------

    def spend(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool:
        check_spend(key, token, amount, limit, window_s)
        with self._lock:
            stored = self._budgets.get(key)
            found, total, tokens = (None, 0.0, set()) if stored is None else stored
            plan = plan_spend(found, total, token in tokens, amount, limit, window_s, self.now())
            if plan.restart:
                total, tokens = 0.0, set()
            if plan.count is not None:
                total += plan.count
                tokens.add(token)
            self._budgets[key] = (plan.window, total, tokens)
            return plan.reply

    # -- Concurrency slots (base.Slots) ---------------------------------------------------

    def take_slot(self, key: str, call_id: str, limit: int, ttl_s: float) -> SlotPlan:
        with self._lock:
            holders = self._slots.setdefault(key, {})
            plan = plan_slot(holders, call_id, limit, ttl_s, self.now())
            for gone in plan.drop:
                del holders[gone]
            if plan.put is not None:
                holders[call_id] = plan.put
            if not holders:
                del self._slots[key]
            return plan

    def free_slot(self, key: str, call_id: str) -> None:
        with self._lock:
            holders = self._slots.get(key, {})
            holders.pop(call_id, None)
            if not holders:
                self._slots.pop(key, None)

    def slot_holders(self, key: str) -> list[str]:
        with self._lock:
            now = self.now()
            return sorted(c for c, expires in self._slots.get(key, {}).items() if not lapsed(expires, now))
