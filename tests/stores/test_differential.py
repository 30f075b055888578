"""The backends against each other: random histories of every store operation, run on
memory, SQLite, PostgreSQL and Redis side by side, compared after every step.

Where ``test_property.py`` checks each backend against a model of lifecycle's plans, this
test needs no model: each step runs on every backend, and the test compares the replies
and then the whole observable state of each backend with the memory store's:

- per call: its result, its audit trail (ids, types, attempts, data, times), its last
  checkpoint, and its row in ``calls()`` (spec in force, attempts, result, holder,
  resolved, first-seen time);
- recovery: ``expired()`` and ``claim_recovery`` answers (steps);
- budgets: every ``spend`` answer (a budget's total shows only through them);
- concurrency slots: every ``take_slot`` answer (reply, lapsed holders dropped, the other
  holders) and each key's ``slot_holders`` after every take and free;
- run records: each run's record (with its event count and holder), events, model turns,
  approval decisions, and ``list_runs`` over every tenant.

The operations: register, begin, renew, finish (also late, from a superseded attempt),
fenced, release, hand_on, lost leases, claim_recovery, expired, abandon, settle, resolve,
save_checkpoint, spend, take_slot, free_slot, purge, and the run records' put_run, append_run_events,
record_turn, decide_approval, lease_run, release_run, forget_run and purge_runs.

Two histories:

- ``injected clock``: memory, SQLite and PostgreSQL share one injected clock, which the
  steps move on, so recovery holds end, grace periods pass, budget windows roll over, run
  leases lapse and purge cutoffs fall between calls; times are compared exactly.
- ``with redis``: the same three and Redis, whose clock is its server's. Every duration is
  long (holds, graces, windows, run leases), the injected clock stands still, purge takes
  every finished call or none, and on Redis times are only checked to be in order.

Call leases never lapse by their TTL (it is long): a lost lease is released behind its
holder's back on every backend, which leaves what a lapse leaves (no live lease, no
result, no event), and the holder goes on as if it still held it.

Cost: ``AAA_STORE_PROPERTY_PROFILE=deep`` for a long run (``ci``, the default, is short);
derandomized under ``CI=true``, so CI replays the same histories.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import STORE_UNREACHABLE, NotResolvable
from aaa_celery.lifecycle import (
    Accepted, Busy, Claimed, Draft, Finished, Lease, Outcome, Refused, Stale, checkpoint_json,
)
from aaa_celery.stores import Store, open_store
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.runs import RunRecord

from ..conftest import in_ci
from .test_property import OUTCOMES, Clock, _specs

EXAMPLES = {"ci": {"clock": 25, "redis": 20}, "deep": {"clock": 400, "redis": 250}}


def _settings(group: str) -> settings:
    profile = os.environ.get("AAA_STORE_PROPERTY_PROFILE", "ci")
    return settings(max_examples=EXAMPLES[profile][group], stateful_step_count=40 if profile == "deep" else 25,
                    deadline=None, database=None, derandomize=in_ci(),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


CALLS = 3
WORKERS = ("w0", "w1", "w2")
#: Longer than any example: a lease never lapses by its TTL, a long hold never ends.
LONG = 100_000.0
TENANTS = ("acme", None)
IN_DOUBT = [Outcome.failure("OutcomeUnknown", "lost", 1), Outcome.failure("ExecutionAbandoned", "gave up", 1)]


@dataclass
class Backend:
    name: str
    store: Store
    exact_times: bool  # the test's clock (False: the server's)


# -- reading a backend's whole observable state -----------------------------------------


def _outcome(x: Outcome | None) -> Any:
    return None if x is None else (x.ok, x.value, x.error, x.message, x.attempt)


def snapshot(b: Backend, call_ids: list[str], run_keys: list[str], approvals: list[tuple[str, str]]) -> dict[str, Any]:
    """Everything a reader of ``b`` can see of this example's calls and runs."""
    s, t = b.store, b.exact_times
    state: dict[str, Any] = {}
    for cid in call_ids:
        events = s.events(cid)
        at = [e.at for e in events]
        state[cid] = {
            "result": _outcome(s.result(cid)),
            "events": [(e.id, e.type, e.attempt, e.data) for e in events],
            "at": at if t else at == sorted(at),
            "checkpoint": s.last_checkpoint(cid),
        }
    state["calls"] = {
        r.call_id: (r.spec, r.attempts, _outcome(r.result), r.holder, r.resolved, r.seen_at if t else None)
        for r in s.calls() if r.call_id in call_ids
    }
    for key in run_keys:
        run = s.get_run(key)
        state[key] = {
            "record": run,
            "events": s.run_events(key),
            "events after 1": s.run_events(key, after=1, limit=2),
            "turns": [s.recorded_turn(key, n) for n in (1, 2)],
            "decisions": [s.approval_decision(key, cid, d) for cid, d in approvals],
        }
    state["runs"] = [r.key for r in s.list_runs(all_tenants=True, limit=100) if r.key in run_keys]
    state["active runs"] = [r.key for r in s.list_runs(all_tenants=True, active=True, limit=100)
                            if r.key in run_keys]
    return state


def _reply(x: Any) -> Any:
    """A reply as every backend gives it: without tokens, lease expiries or store times."""
    if isinstance(x, Claimed):
        return ("claimed", x.lease.attempt, x.lease.worker, x.lease.ttl_s)
    if isinstance(x, Busy):
        return ("busy", x.holder)
    if isinstance(x, Finished | Refused | Accepted):
        return (type(x).__name__, _outcome(x.result))
    if isinstance(x, Stale):
        return ("Stale", _outcome(x.current))
    if isinstance(x, Outcome):
        return _outcome(x)
    return x


# -- the machine ----------------------------------------------------------------------------


class Backends(RuleBasedStateMachine):
    """Set by the test: the backends (memory first), the shared injected clock, and whether
    Redis is among them (then every duration is long and the clock stands still)."""

    backends: list[Backend]
    clock: Clock
    with_redis: bool
    reset: Callable[[], None]

    def __init__(self) -> None:
        super().__init__()
        self.reset()
        run = uuid.uuid4().hex[:8]
        self.call_ids = [f"d-{run}-{n}" for n in range(CALLS)] + [f"d-{run}-never"]
        self.held: list[dict[str, Lease]] = []  # one lease per backend, by backend name
        self.homes: list[tuple[Delivery, int]] = []
        self.runs: list[RunRecord] = []
        self.approvals: list[tuple[str, str]] = []

    def each(self, op: Callable[[Store], Any]) -> list[Any]:
        """Run ``op`` on every backend; return the replies, compared with the memory store's."""
        replies = []
        for b in self.backends:
            try:
                replies.append(_reply(op(b.store)))
            except NotResolvable as e:
                replies.append(("NotResolvable", str(e)))
        for b, got in zip(self.backends[1:], replies[1:], strict=True):
            assert got == replies[0], (b.name, got, replies[0])
        return replies

    def each_lease(self, pick: int, op: Callable[[Store, Lease], Any]) -> list[Any]:
        held = self.held[pick % len(self.held)]
        return self.each(lambda s: op(s, held[self.name_of(s)]))

    def name_of(self, store: Store) -> str:
        return next(b.name for b in self.backends if b.store is store)

    def duration(self, short: float) -> float:
        return LONG if self.with_redis else short

    def config(self, delivery: Delivery, max_attempts: int, fence: bool = True) -> GuardConfig:
        return GuardConfig(delivery=delivery, max_attempts=max_attempts, lease_ttl_s=LONG, fence_results=fence)

    # Calls.

    @initialize(homes=st.lists(st.tuples(st.sampled_from(Delivery), st.integers(1, 3)), min_size=CALLS,
                               max_size=CALLS), start=st.floats(1.2e9, 1.9e9))
    def first(self, homes: list[tuple[Delivery, int]], start: float) -> None:
        self.clock.t = start
        self.homes = homes
        self.begin(0, 0, 0, None)

    @rule(call=st.integers(0, CALLS - 1), variant=st.integers(0, 3))
    def register(self, call: int, variant: int) -> None:
        spec = _specs(self.call_ids[call])[variant]
        self.each(lambda s: s.register(spec))

    @rule(call=st.integers(0, CALLS - 1), variant=st.integers(0, 3), worker=st.integers(0, 2),
          other=st.none() | st.tuples(st.sampled_from(Delivery), st.integers(1, 3)))
    def begin(self, call: int, variant: int, worker: int, other: tuple[Delivery, int] | None) -> None:
        spec, cfg = _specs(self.call_ids[call])[variant], self.config(*(other or self.homes[call]))
        leases: dict[str, Lease] = {}

        def begin(s: Store) -> Any:
            got = s.begin(spec, WORKERS[worker], cfg)
            if isinstance(got, Claimed):
                leases[self.name_of(s)] = got.lease
            return got

        self.each(begin)
        if leases:
            self.held.append(leases)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6))
    def renew(self, pick: int) -> None:
        self.each_lease(pick, lambda s, lease: s.renew(lease))

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), outcome=st.sampled_from(OUTCOMES), fence=st.booleans())
    def finish(self, pick: int, outcome: Outcome, fence: bool) -> None:
        cfg = self.config(Delivery.AT_LEAST_ONCE, 3, fence)
        self.each_lease(pick, lambda s, lease: s.finish(lease, outcome, cfg))

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), how=st.sampled_from(["release", "fenced", "fenced-cause", "hand_on", "lose"]))
    def let_go(self, pick: int, how: str) -> None:
        """The holder gives the lease up (release, fenced, hand_on), or loses it behind its
        back (``lose``: released by another party, as a lapse leaves it; the holder keeps
        its lease object and may still use it)."""
        if how == "fenced":
            self.each_lease(pick, lambda s, lease: s.fenced(lease))
        elif how == "fenced-cause":
            self.each_lease(pick, lambda s, lease: s.fenced(lease, STORE_UNREACHABLE))
        elif how == "hand_on":
            self.each_lease(pick, lambda s, lease: s.hand_on(lease))
        else:
            self.each_lease(pick, lambda s, lease: s.release(lease))

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 10**6), page=st.integers(0, 9))
    def checkpoint(self, pick: int, page: int) -> None:
        held = self.held[pick % len(self.held)]
        attempt = next(iter(held.values())).attempt
        self.each_lease(pick, lambda s, lease: s.save_checkpoint(lease, checkpoint_json(attempt, {"page": page})))

    @precondition(lambda self: not self.with_redis)
    @rule(dt=st.sampled_from([0.0, 0.3, 1.0, 7.0, 40.0, 700.0]))
    def advance(self, dt: float) -> None:
        self.clock.t += dt

    # Recovery.

    @rule(call=st.integers(0, CALLS), worker=st.integers(0, 2), hold=st.sampled_from([0.5, 10.0, 100.0]))
    def claim_recovery(self, call: int, worker: int, hold: float) -> None:
        cid, hold = self.call_ids[call], self.duration(hold)
        self.each(lambda s: s.claim_recovery(cid, WORKERS[worker], hold))

    @rule(grace=st.sampled_from([0.0, 0.5, 5.0, 50.0, 600.0]))
    def expired(self, grace: float) -> None:
        grace = grace and self.duration(grace)
        self.each(lambda s: sorted((c.call_id, c.name, c.idempotency_key, str(c.request))
                                   for c in s.expired(unclaimed_grace_s=grace) if c.call_id in self.call_ids))

    @rule(call=st.integers(0, CALLS), attempt=st.integers(0, 3))
    def abandon(self, call: int, attempt: int) -> None:
        spec = _specs(self.call_ids[call])[0]
        outcome = Outcome.failure("ExecutionAbandoned", "recovery gave up", attempt)
        self.each(lambda s: s.abandon(spec, outcome))

    # Operators' verbs.

    @rule(call=st.integers(0, CALLS), expected=st.sampled_from(OUTCOMES + IN_DOUBT), n=st.integers(0, 2))
    def settle(self, call: int, expected: Outcome, n: int) -> None:
        cid = self.call_ids[call]
        current = self.backends[0].store.result(cid)
        if current is not None and n:  # mostly the result in force, as the guard's reconciliation
            expected = current
        event = Draft(f"{cid}:reconciled", "aaa.tool.reconciled", cid, expected.attempt, {"found": n})
        self.each(lambda s: s.settle(cid, expected, Outcome.success({"n": n}, expected.attempt), event))

    @rule(call=st.integers(0, CALLS), verdict=st.sampled_from(["completed", "failed"]))
    def resolve(self, call: int, verdict: Any) -> None:
        cid = self.call_ids[call]
        self.each(lambda s: s.resolve(cid, verdict, "checked by hand", "ops", {"ok": True}))

    @rule(back=st.sampled_from([None, 0.0, 1.0, 50.0]))
    def purge(self, back: float | None) -> None:
        """Purge the finished calls first seen before a cutoff: none (``None``), every one
        (``0``: a moment after now), or (injected clock) those older than ``back`` seconds."""
        if back is None:
            self.each(lambda s: s.purge(0.0))
        elif back == 0.0 or self.with_redis:
            self.each(lambda s: s.purge(s.now() + 1.0))
        else:
            self.each(lambda s: s.purge(s.now() - back))

    # Budgets.

    @rule(budget=st.integers(0, 1), token=st.integers(0, 3), amount=st.sampled_from([0.0, 1.0, 2.5]),
          limit=st.sampled_from([0.0, 3.0, 10.0]))
    def spend(self, budget: int, token: int, amount: float, limit: float) -> None:
        window = 1e9 if budget or self.with_redis else 10.0
        key = f"{self.call_ids[0]}:budget:{budget}"
        self.each(lambda s: s.spend(key, f"t{token}", amount, limit, window))

    # Concurrency slots.

    @rule(key=st.integers(0, 1), call=st.integers(0, 3), limit=st.integers(1, 2), ttl=st.sampled_from([0.5, 5.0]))
    def take_slot(self, key: int, call: int, limit: int, ttl: float) -> None:
        slots = f"{self.call_ids[0]}:slot:{key}"
        ttl = self.duration(ttl)
        self.each(lambda s: (lambda p: (p.reply, p.drop, p.holders))(s.take_slot(slots, f"c{call}", limit, ttl)))
        self.each(lambda s: s.slot_holders(slots))

    @rule(key=st.integers(0, 1), call=st.integers(0, 3))
    def free_slot(self, key: int, call: int) -> None:
        slots = f"{self.call_ids[0]}:slot:{key}"
        self.each(lambda s: s.free_slot(slots, f"c{call}"))
        self.each(lambda s: s.slot_holders(slots))

    # Run records.

    @rule(n=st.integers(0, 2), tenant=st.sampled_from(TENANTS), status=st.sampled_from(
        ["running", "waiting", "completed", "failed"]), dt=st.integers(0, 3), approval=st.booleans())
    def put_run(self, n: int, tenant: str | None, status: str, dt: int, approval: bool) -> None:
        """Write a run's record (a new one, or a later version of one already written)."""
        if n < len(self.runs):
            run = self.runs[n]
            run.status, run.updated_at, run.resumed = status, run.updated_at + dt, run.resumed + 1
        else:
            start = 1_000_000.0 + 10 * len(self.runs) + dt
            run = RunRecord(f"run-{self.call_ids[0]}-{len(self.runs)}", tenant, "ToolLoop", {"n": n}, status,
                            start, start)
            self.runs.append(run)
        if approval:
            cid = f"{run.key}:1.0.c"
            run.approvals[cid] = {"state": "open", "digest": "d" * 64}
            if (cid, "d" * 64) not in self.approvals:
                self.approvals.append((cid, "d" * 64))
        if status in ("completed", "failed"):
            run.outcome = {"status": status, "value": None, "error": None}
        record = copy.deepcopy(run)  # a store may keep the object it was given
        self.each(lambda s: s.put_run(record))

    def run_key(self, n: int) -> str:
        return self.runs[n % len(self.runs)].key if self.runs else "acme:run-unknown"

    @rule(n=st.integers(0, 2), first=st.integers(1, 4), count=st.integers(1, 2))
    def append_run_events(self, n: int, first: int, count: int) -> None:
        key = self.run_key(n)
        events = [{"seq": seq, "type": "aaa.run.step", "data": {"n": seq}} for seq in range(first, first + count)]
        self.each(lambda s: s.append_run_events(key, events))

    @rule(n=st.integers(0, 2), turn=st.integers(1, 2), text=st.sampled_from(["a", "b"]))
    def record_turn(self, n: int, turn: int, text: str) -> None:
        key = self.run_key(n)
        self.each(lambda s: s.record_turn(key, turn, {"text": text}))

    @rule(n=st.integers(0, 2), grant=st.booleans())
    def decide(self, n: int, grant: bool) -> None:
        key = self.run_key(n)
        cid, digest = f"{key}:1.0.c", "d" * 64
        if (cid, digest) not in self.approvals:
            self.approvals.append((cid, digest))
        self.each(lambda s: s.decide_approval(key, cid, digest, {"granted": grant, "by": "ops"}))

    @rule(n=st.integers(0, 2), holder=st.sampled_from(WORKERS), ttl=st.sampled_from([5.0, 60.0]),
          how=st.sampled_from(["lease", "release", "forget"]))
    def run_lease(self, n: int, holder: str, ttl: float, how: str) -> None:
        key = self.run_key(n)
        if how == "lease":
            self.each(lambda s: s.lease_run(key, holder, self.duration(ttl)))
        elif how == "release":
            self.each(lambda s: s.release_run(key, holder))
        else:
            self.each(lambda s: s.forget_run(key))

    @rule(before=st.sampled_from([0.0, 1_000_005.0, 1_000_025.0, 2e6]))
    def purge_runs(self, before: float) -> None:
        self.each(lambda s: s.purge_runs(before))

    # After every step: every backend shows what the memory store shows.

    @invariant()
    def backends_agree(self) -> None:
        keys = [r.key for r in self.runs]
        want = snapshot(self.backends[0], self.call_ids, keys, self.approvals)
        for b in self.backends[1:]:
            got = snapshot(b, self.call_ids, keys, self.approvals)
            if not b.exact_times:
                got = _without_times(got)
                expected = _without_times(want)
            else:
                expected = want
            for part in expected:
                assert got[part] == expected[part], (b.name, part, got[part], expected[part])

    def teardown(self) -> None:
        for held in self.held:  # no session or connection outlives the example
            for b in self.backends:
                if b.name in held:
                    b.store.release(held[b.name])


def _without_times(state: dict[str, Any]) -> dict[str, Any]:
    out = dict(state)
    for cid, part in state.items():
        if isinstance(part, dict) and "at" in part:
            out[cid] = {**part, "at": part["at"] is True or part["at"] == sorted(part["at"])}
    out["calls"] = {cid: row[:-1] for cid, row in state["calls"].items()}
    return out


# -- the test ---------------------------------------------------------------------------------


def _clear(store: Store) -> None:
    """Delete every record of a SQL or Redis store (a clean start for each example)."""
    engine = getattr(store, "engine", None)
    if engine is not None:
        from aaa_celery.stores.sql import metadata

        with engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())
    else:
        store._redis.flushdb()  # type: ignore[attr-defined]


@pytest.fixture
def sql_backends(postgres_url: str, tmp_path: Any) -> Iterator[tuple[Clock, list[Backend]]]:
    clock = Clock()
    stores = [open_store(f"sqlite:///{tmp_path / 'aaa.sqlite3'}", clock=clock), open_store(postgres_url, clock=clock)]
    try:
        yield clock, [Backend("memory", MemoryStore(clock=clock), True), Backend("sqlite", stores[0], True),
                      Backend("postgresql", stores[1], True)]
    finally:
        for s in stores:
            s.close()


def _run(clock: Clock, backends: list[Backend], with_redis: bool) -> None:
    def reset() -> None:
        backends[0].store = MemoryStore(clock=clock)
        for b in backends[1:]:
            _clear(b.store)

    machine = type("Backends_" + ("redis" if with_redis else "clock"), (Backends,),
                   {"backends": backends, "clock": clock, "with_redis": with_redis, "reset": staticmethod(reset)})
    run_state_machine_as_test(machine, settings=_settings("redis" if with_redis else "clock"))


@pytest.mark.timeout(3600)
@pytest.mark.postgres
def test_backends_agree_on_an_injected_clock(sql_backends: tuple[Clock, list[Backend]]) -> None:
    _run(*sql_backends, with_redis=False)


@pytest.mark.timeout(3600)
@pytest.mark.postgres
@pytest.mark.redis
def test_backends_agree_with_redis(sql_backends: tuple[Clock, list[Backend]], redis_url: str) -> None:
    clock, backends = sql_backends
    redis_store = open_store(redis_url)
    try:
        _run(clock, [*backends, Backend("redis", redis_store, False)], with_redis=True)
    finally:
        redis_store.close()
