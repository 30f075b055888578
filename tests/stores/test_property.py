"""The stores against a model: random histories of a few calls, on every backend.

A hypothesis state machine drives random sequences of register, begin, renew,
finish (also late, from a superseded attempt), fenced, release, lost leases and
takeovers, clock advances, claim_recovery and expired over three calls (each with
its own config, and now and then a delivery under another) through three workers
(each with its own store, as separate processes would have; the memory store is
one shared instance), and replays each step on a reference model: :mod:`aaa_celery.lifecycle`'s plans, applied by hand to plain records, plus
the bookkeeping a store adds (registration time, recovery hold, the spec in force).
After every step it compares every reply (attempt numbers, holders, expiries,
outcomes) and every call's result and audit trail (ids, types, attempts, data, and
times where the clock is the test's).

Time, per backend, so the model stays exact:

- memory, sqlite, postgresql: the store's clock is injected; the model shares it.
  Random start, random advances, random TTLs, grace periods and recovery holds.
- redis, redis-cluster: the server's clock, which the model cannot know. Every
  duration is long (TTLs, holds and graces of 600 s or more, or a grace of 0), so
  no lease or hold lapses during an example, and the model runs on a frozen clock
  at 0; the times in replies and events are only checked to be there and ordered.
- A lost lease, as in production: a TTL lapse by the clock (memory, sqlite); the
  holder's session killed (postgresql); on Redis, whose TTL runs on the server's
  clock, the lease is released behind its holder's back, which leaves exactly the
  keys a lapse leaves (no lease key, the call lapsed in the running index).

Cost: ``AAA_STORE_PROPERTY_PROFILE`` picks a settings profile: ``ci`` (the default;
on a quiet machine about 2 s per backend, 10 s on postgresql), or ``deep`` for a
long run. Under ``CI=true`` hypothesis derandomizes (its ``ci`` profile), so a CI
run replays the same histories; locally each run draws new ones.
"""

from __future__ import annotations

import math

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.lifecycle import (
    Accepted,
    Busy,
    CallSpec,
    CallState,
    Claimed,
    Draft,
    Lease,
    Outcome,
    Stale,
    Writes,
    joined,
    lapsed,
    merge_spec,
    plan_begin,
    plan_fenced,
    plan_hand_on,
    plan_finish,
    plan_release,
    sweep_hint,
)
from aaa_celery.stores import Store, open_store
from aaa_celery.stores.memory import MemoryStore

from .conftest import lose_lease

# -- settings ----------------------------------------------------------------------------

_COMMON: dict[str, Any] = {
    "deadline": None,
    "database": None,  # nothing written into the checkout
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
}
settings.register_profile("store-property-ci", stateful_step_count=30, **_COMMON)
settings.register_profile("store-property-deep", stateful_step_count=60, **_COMMON)

#: Examples per backend and profile: about the same wall time on each backend.
EXAMPLES = {
    "ci": {"memory": 300, "sqlite": 80, "redis": 100, "redis-cluster": 60, "postgresql": 60},
    "deep": {"memory": 2000, "sqlite": 400, "redis": 400, "redis-cluster": 300, "postgresql": 250},
}


def _settings(backend: str) -> settings:
    profile = os.environ.get("AAA_STORE_PROPERTY_PROFILE", "ci")
    return settings(
        settings.get_profile(f"store-property-{profile}"), max_examples=EXAMPLES[profile][backend]
    )


# -- what the steps draw from ------------------------------------------------------------

WORKERS = ("w0", "w1", "w2")
CALLS = 3

#: A call's config: delivery, max_attempts, and lease TTL (seconds; on Redis always long).
CONFIGS = st.tuples(st.sampled_from(Delivery), st.integers(1, 3), st.floats(0.5, 60.0))
#: Which config a delivery runs under: its call's own (None), or now and then another one.
OTHER = st.none() | CONFIGS

OUTCOMES = [
    Outcome.success(1),
    Outcome.success({"rows": [], "n": 2**60, "ratio": 0.1}),  # JSON that cjson would not keep
    Outcome.success("a/b \u00e9"),
    Outcome.success(None),
    Outcome.failure("ToolError", "boom"),
]


def _specs(call_id: str) -> list[CallSpec]:
    """Deliveries of one call: with and without a request, under two names (the spec in
    force is the first seen, unless a later one brings the request it lacks)."""
    request = {"task": "tools.refund", "args": [], "kwargs": {"order": 7}, "queue": "tools"}
    return [
        CallSpec(call_id, "refund", f"key/{call_id}", request),
        CallSpec(call_id, "refund", f"key/{call_id}"),
        CallSpec(call_id, "refund_v2", f"key2/{call_id}"),
        CallSpec(call_id, "refund_v2", f"key2/{call_id}", {**request, "task": "tools.refund_v2"}),
    ]


class Clock:
    """The injected clock of memory, sqlite and postgresql stores."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


# -- the model ---------------------------------------------------------------------------


@dataclass
class ModelLease:
    token: str
    worker: str
    attempt: int
    expires_at: float | None
    lost: bool = False  # its session died, or (Redis) it was released behind its back
    #: A session lease's sweep hint (lifecycle.sweep_hint): a lost one is listed by the sweep
    #: only once it lapsed (on the server's clock: not within an example)
    hint: float = math.inf


@dataclass
class ModelCall:
    spec: CallSpec
    registered_at: float
    attempts: int = 0
    result: Outcome | None = None
    lease: ModelLease | None = None
    events: list[tuple[Draft, float]] = field(default_factory=list)
    recovery_until: float = 0.0
    recovery_tries: int = 0  # republishes since attempts was recovery_attempts
    recovery_attempts: int = 0
    handed_on: int = 0
    handed: int = 0


@dataclass
class Held:
    """A lease a worker got from ``begin``: the store's Lease, and the worker's index."""

    lease: Lease
    owner: int


# -- the machine -------------------------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """One example: three workers and three calls on the backend of the test."""

    #: Set by the test: the workers' stores, the shared clock (None: the server's), and
    #: the backend's name.
    stores: list[Store]
    clock: Clock | None
    backend: str

    def __init__(self) -> None:
        super().__init__()
        self.run = uuid.uuid4().hex[:10]
        self.call_ids = [f"p-{self.run}-{n}" for n in range(CALLS)]
        self.unknown_id = f"p-{self.run}-never"
        self.calls: dict[str, ModelCall] = {}
        self.held: list[Held] = []
        self.ttl_leases = self.stores[0].ttl_leases
        self.server_clock = self.clock is None
        self.homes: list[tuple[Delivery, int, float]] = []

    # The model's clock: the store's, or frozen at 0 on the server's clock (every duration long).

    def now(self) -> float:
        return 0.0 if self.clock is None else self.clock.t

    def live(self, lease: ModelLease | None) -> bool:
        if lease is None or lease.lost:
            return False
        return lease.expires_at is None or lease.expires_at > self.now()

    def state(self, call: ModelCall) -> CallState:
        lease = call.lease
        if lease is None or not self.live(lease):
            return CallState(call.attempts, call.result, handed_on=call.handed_on, handed=call.handed)
        return CallState(call.attempts, call.result, True, lease.worker, lease.expires_at, call.handed_on,
                         call.handed)

    def see(self, spec: CallSpec) -> ModelCall:
        """The call's record, created at first sight, with the spec in force."""
        call = self.calls.get(spec.call_id)
        if call is None:
            call = self.calls[spec.call_id] = ModelCall(spec, self.now())
        call.spec = merge_spec(call.spec, spec)
        return call

    def apply(self, call: ModelCall, writes: Writes, token: str = "") -> None:
        """Lifecycle's writes, applied to the model by hand (see lifecycle.Writes)."""
        if writes.claim is not None:
            lease = writes.claim
            call.attempts = lease.attempt
            call.lease = ModelLease(token, lease.worker, lease.attempt, lease.expires_at,
                                    hint=math.inf if self.server_clock else sweep_hint(lease, self.now()))
            call.recovery_until = 0.0
        if writes.record is not None:
            call.result = writes.record
            call.lease = None
        if writes.event is not None and all(e.id != writes.event.id for e, _ in call.events):
            call.events.append((writes.event, self.now()))
        if writes.let_go is not None and call.lease is not None and call.lease.token == writes.let_go:
            call.lease = None
        if writes.hand_on is not None:
            call.handed_on = writes.hand_on.attempt
            call.handed += 1
            call.lease = None
            call.registered_at = self.now()

    # Drawing.

    def config(self, delivery: Delivery, max_attempts: int, ttl: float, fence: bool = True) -> GuardConfig:
        ttl = 3600.0 if self.server_clock else ttl
        return GuardConfig(delivery=delivery, max_attempts=max_attempts, lease_ttl_s=ttl, fence_results=fence)

    def lease_store(self, held: Held, pick: int) -> Store:
        """The store a lease operation goes through: its holder's on postgresql (only the
        holder's session can free its lock), any worker's elsewhere."""
        return self.stores[held.owner if not self.ttl_leases else pick % len(self.stores)]

    def expiry(self, got: float | None, want: float | None) -> None:
        if self.server_clock:
            assert got is not None
        else:
            assert got == want

    # Rules.

    @initialize(
        start=st.floats(1e6, 2e9), homes=st.lists(CONFIGS, min_size=CALLS, max_size=CALLS),
        variant=st.integers(0, 3),
    )
    def first_delivery(self, start: float, homes: list[tuple[Delivery, int, float]], variant: int) -> None:
        """The clock starts anywhere, each call gets its config, and worker 0 begins call 0."""
        if self.clock is not None:
            self.clock.t = start
        self.homes = homes
        self.begin(0, variant, 0, None)

    @rule(call=st.integers(0, CALLS - 1), variant=st.integers(0, 3), worker=st.integers(0, 2))
    def register(self, call: int, variant: int, worker: int) -> None:
        spec = _specs(self.call_ids[call])[variant]
        self.stores[worker].register(spec)
        self.see(spec)

    @rule(call=st.integers(0, CALLS - 1), variant=st.integers(0, 3), worker=st.integers(0, 2), other=OTHER)
    def begin(self, call: int, variant: int, worker: int, other: tuple[Delivery, int, float] | None) -> None:
        """A delivery of a call (a first one, or a duplicate, or a redelivery)."""
        spec, name = _specs(self.call_ids[call])[variant], WORKERS[worker]
        cfg = self.config(*(other or self.homes[call]))
        got = self.stores[worker].begin(spec, name, cfg)

        rec = self.see(spec)
        writes = plan_begin(self.state(rec), rec.spec, name, cfg, "", None if not self.ttl_leases else self.now())
        want = writes.reply
        assert type(got) is type(want), (got, want)
        if isinstance(want, Claimed):
            assert isinstance(got, Claimed)
            lease, model = got.lease, want.lease
            assert (lease.call_id, lease.attempt, lease.worker, lease.ttl_s) == (
                model.call_id, model.attempt, model.worker, model.ttl_s)
            assert lease.token and all(h.lease.token != lease.token for h in self.held)
            if self.ttl_leases:
                self.expiry(lease.expires_at, model.expires_at)
            else:
                assert lease.expires_at is None
            self.held.append(Held(lease, worker))
            self.apply(rec, writes, lease.token)
            return
        if isinstance(want, Busy):
            assert isinstance(got, Busy)
            assert got.holder == want.holder
            if self.ttl_leases:
                self.expiry(got.expires_at, want.expires_at)
            else:
                assert got.expires_at is None
        else:
            assert got == want
        self.apply(rec, writes)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), by=st.integers(0, 2))
    def renew(self, pick: int, by: int) -> None:
        held = self.held[pick % len(self.held)]
        got = self.stores[by].renew(held.lease)
        rec = self.calls[held.lease.call_id]
        want = rec.lease is not None and rec.lease.token == held.lease.token and self.live(rec.lease)
        assert got is want
        if want and self.ttl_leases:
            assert rec.lease is not None
            rec.lease.expires_at = self.now() + held.lease.ttl_s
        elif want and by == held.owner and not self.server_clock:  # the holder's renewal moves the hint
            assert rec.lease is not None
            rec.lease.hint = sweep_hint(held.lease, self.now())

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), by=st.integers(0, 2), outcome=st.sampled_from(OUTCOMES),
          fence=st.booleans())
    def finish(self, pick: int, by: int, outcome: Outcome, fence: bool) -> None:
        self.finish_lease(self.held[pick % len(self.held)], by, outcome, fence)

    def superseded(self) -> list[Held]:
        """Leases whose call a later attempt took over, and that has no result yet."""
        calls = self.calls
        return [h for h in self.held
                if calls[h.lease.call_id].result is None and calls[h.lease.call_id].attempts > h.lease.attempt]

    @precondition(lambda self: self.superseded())
    @rule(pick=st.integers(0, 10**6), by=st.integers(0, 2), outcome=st.sampled_from(OUTCOMES),
          fence=st.booleans())
    def late_finish(self, pick: int, by: int, outcome: Outcome, fence: bool) -> None:
        """A zombie: an attempt that lost its lease reports after another attempt took over."""
        superseded = self.superseded()
        self.finish_lease(superseded[pick % len(superseded)], by, outcome, fence)

    def finish_lease(self, held: Held, by: int, outcome: Outcome, fence: bool) -> None:
        cfg = self.config(Delivery.AT_LEAST_ONCE, 3, 30.0, fence)
        got = self.lease_store(held, by).finish(held.lease, outcome, cfg)
        rec = self.calls[held.lease.call_id]
        writes = plan_finish(self.state(rec), rec.spec, held.lease, outcome, cfg)
        assert isinstance(writes.reply, Accepted | Stale)
        assert got == writes.reply
        self.apply(rec, writes)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), by=st.integers(0, 2), fenced=st.booleans())
    def let_go(self, pick: int, by: int, fenced: bool) -> None:
        """The holder gives a lease up without a result: ``fenced`` (cancelled after it
        lost the lease) or ``release``."""
        held = self.held[pick % len(self.held)]
        store = self.lease_store(held, by)
        if fenced:
            store.fenced(held.lease)
        else:
            store.release(held.lease)
        writes = plan_fenced(held.lease) if fenced else plan_release(held.lease)
        self.apply(self.calls[held.lease.call_id], writes)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), by=st.integers(0, 2))
    def hand_on(self, pick: int, by: int) -> None:
        """The holder's body asks to be retried: the attempt hands the call on."""
        held = self.held[pick % len(self.held)]
        rec = self.calls[held.lease.call_id]
        holds = rec.lease is not None and rec.lease.token == held.lease.token and self.live(rec.lease)
        self.lease_store(held, by).hand_on(held.lease)
        self.apply(rec, plan_hand_on(held.lease, holds))

    def holding(self) -> list[Held]:
        """The leases that hold their call now."""
        out = []
        for held in self.held:
            lease = self.calls[held.lease.call_id].lease
            if lease is not None and lease.token == held.lease.token and self.live(lease):
                out.append(held)
        return out

    @precondition(lambda self: self.holding())
    @rule(pick=st.integers(0, 10**6), after=st.floats(0.0, 5.0))
    def lose(self, pick: int, after: float) -> None:
        """A holder dies or freezes: its lease lapses without it letting go."""
        holding = self.holding()
        self.lose_lease(holding[pick % len(holding)], after)

    @precondition(lambda self: self.holding())
    @rule(pick=st.integers(0, 10**6), after=st.floats(0.0, 5.0), variant=st.integers(0, 3),
          worker=st.integers(0, 2), other=OTHER)
    def takeover(self, pick: int, after: float, variant: int, worker: int,
                 other: tuple[Delivery, int, float] | None) -> None:
        """A holder dies, and its call comes back (redelivered or recovered) to a worker."""
        holding = self.holding()
        held = holding[pick % len(holding)]
        self.lose_lease(held, after)
        self.begin(self.call_ids.index(held.lease.call_id), variant, worker, other)

    def lose_lease(self, held: Held, after: float) -> None:
        lease = self.calls[held.lease.call_id].lease
        assert lease is not None
        if self.clock is not None and self.ttl_leases:
            assert lease.expires_at is not None
            self.clock.t = max(self.clock.t, lease.expires_at) + after  # lapses at expires_at
        elif self.ttl_leases:
            self.stores[held.owner].release(held.lease)  # Redis: what a lapse leaves behind
            lease.lost = True
        else:
            lose_lease(self.stores[held.owner], held.lease)  # postgresql: its session dies
            # One session holds every lease of a store (4dfc08d): they all lapse with it.
            for other in self.holding():
                if other.owner == held.owner:
                    ours = self.calls[other.lease.call_id].lease
                    assert ours is not None
                    ours.lost = True
            lease.lost = True

    @precondition(lambda self: self.clock is not None)
    @rule(dt=st.floats(0.0, 30.0))
    def advance(self, dt: float) -> None:
        assert self.clock is not None
        self.clock.t += dt

    @rule(
        claim=st.booleans(), call=st.integers(0, CALLS), worker=st.integers(0, 2),
        hold=st.floats(0.5, 100.0), grace=st.sampled_from([0.0, 0.5, 5.0, 50.0, 600.0]),
    )
    def recover(self, claim: bool, call: int, worker: int, hold: float, grace: float) -> None:
        """A recovery sweep: list the calls to bring back, or claim the right to republish one."""
        if claim:
            self.claim_recovery(self.stores[worker], (*self.call_ids, self.unknown_id)[call], hold)
        else:
            self.expired(self.stores[worker], grace)

    def claim_recovery(self, store: Store, call_id: str, hold: float) -> None:
        hold = 3600.0 if self.server_clock else hold
        got = store.claim_recovery(call_id, "sweeper", hold)
        rec = self.calls.get(call_id)
        # Never while the call has its result or a live lease (checked with the claim).
        want = (rec is not None and rec.result is None and not self.live(rec.lease)
                and not rec.recovery_until > self.now())
        if rec is not None and want:
            rec.recovery_tries = rec.recovery_tries + 1 if rec.recovery_attempts == rec.attempts else 1
            rec.recovery_attempts = rec.attempts
            rec.recovery_until = self.now() + hold  # no max_hold_s: every hold is ``hold``
            assert got == rec.recovery_tries
        else:
            assert got == 0

    def expired(self, store: Store, grace: float) -> None:
        grace = 3600.0 if self.server_clock and grace else grace
        found = {s.call_id: s for s in store.expired(unclaimed_grace_s=grace)}
        got = {cid: spec for cid, spec in found.items() if cid.startswith(f"p-{self.run}-")}
        want = {
            cid: rec.spec for cid, rec in self.calls.items()
            if rec.result is None and not self.live(rec.lease)
            and ((rec.attempts > 0 and rec.handed_on != rec.attempts) or rec.registered_at <= self.now() - grace)
            # a session lease its holder lost: once its sweep hint lapsed (lifecycle.sweep_hint)
            and (self.ttl_leases or rec.lease is None or lapsed(rec.lease.hint, self.now()))
        }
        assert got == want

    # After every step: each call's result and audit trail, read by any worker.

    @invariant()
    def results_and_trails_match(self) -> None:
        reader = self.stores[-1]
        for call_id in (*self.call_ids, self.unknown_id):
            rec = self.calls.get(call_id)
            assert reader.result(call_id) == (rec.result if rec else None)
            events = reader.events(call_id)
            want = rec.events if rec else []
            # as a reader sees them: the completed event with the result's value (kept once)
            seen = joined([d.stamp(at) for d, at in want], rec.result if rec else None)
            assert [(e.id, e.type, e.call_id, e.attempt, e.data) for e in events] == [
                (d.id, d.type, d.call_id, d.attempt, d.data) for d in seen
            ]
            if self.server_clock:
                assert [e.at for e in events] == sorted(e.at for e in events)
            else:
                assert [e.at for e in events] == [at for _, at in want]

    def teardown(self) -> None:
        # Give back every lease still held, so no session or connection outlives the example.
        for held in self.held:
            self.stores[held.owner].release(held.lease)


# -- the test ----------------------------------------------------------------------------


def _open(backend: str, url: str, clock: Clock) -> tuple[list[Store], Clock | None]:
    if backend == "memory":
        return [MemoryStore(url, clock=clock)] * len(WORKERS), clock
    if backend.startswith("redis"):
        return [open_store(url) for _ in WORKERS], None
    return [open_store(url, clock=clock) for _ in WORKERS], clock


def test_random_histories_match_the_lifecycle_model(backend: str, store_url: str) -> None:
    stores, clock = _open(backend, store_url, Clock())
    machine = type(f"StoreMachine_{backend.replace('-', '_')}", (StoreMachine,),
                   {"stores": stores, "clock": clock, "backend": backend})
    try:
        run_state_machine_as_test(machine, settings=_settings(backend))
    finally:
        for store in {id(s): s for s in stores}.values():
            store.close()



@pytest.mark.postgres
@pytest.mark.parametrize("step", ["renew", "recover", "recover past the sweep hint"])
def test_the_model_loses_every_lease_of_a_terminated_session(postgres_url: str, step: str) -> None:
    """The history hypothesis found on a PostgreSQL store after 4dfc08d (one lease session per
    store): worker 0 holds calls 0 and 1, its session is terminated to lose call 1's lease, and
    the store (rightly) lost call 0's lease too, which the model still took for held."""
    stores, clock = _open("postgresql", postgres_url, Clock())
    machine = type("StoreMachine_postgresql", (StoreMachine,),
                   {"stores": stores, "clock": clock, "backend": "postgresql"})()
    try:
        machine.first_delivery(start=1e6, homes=[(Delivery.AT_LEAST_ONCE, 1, 1.0)] * CALLS, variant=0)
        machine.begin(call=1, variant=0, worker=0, other=None)
        machine.lose(pick=0, after=0.0)
        machine.results_and_trails_match()
        if step == "renew":
            machine.renew(pick=1, by=0)
        else:
            if step == "recover past the sweep hint":  # the sweep lists both lost calls then
                machine.advance(dt=2.0)
            machine.recover(claim=False, call=0, worker=0, hold=1.0, grace=0.0)
        machine.teardown()
    finally:
        for store in stores:
            store.close()
