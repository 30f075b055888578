"""The conformance suite of ``RecoveryIndex`` (stores/base.py), on every backend: which calls
to bring back (``expired``), the right to bring one back once (``claim_recovery``, with its
backoff), and giving up on one (``abandon``)."""

from __future__ import annotations

import itertools
import threading
import time
import uuid

from aaa_celery.lifecycle import FAILED, Finished, Outcome

from .test_conformance import SHORT_TTL_S, claim, config, new_call, trail


def wait_out_sweep_hint(store, cfg) -> None:
    """On a session store (PostgreSQL) a lost lease's row keeps the sweep hint its holder last
    wrote (``lifecycle.sweep_hint``), and the sweep asks the lock only once it has lapsed:
    wait one lease TTL (a TTL store's ``lose_lease`` waited already)."""
    if not store.ttl_leases:
        time.sleep(cfg.lease_ttl_s + 0.05)


def test_expired_lists_exactly_the_lapsed_and_the_long_unclaimed_calls(store_factory, lose_lease):
    # Given one call of each kind
    a, b, c = store_factory(), store_factory(), store_factory()
    lapsed, released, live, done, registered = (new_call() for _ in range(5))
    short = config(lease_ttl_s=SHORT_TTL_S)
    lose_lease(a, claim(a, lapsed, "worker-a", short).lease)  # lost first: see lose_lease
    wait_out_sweep_hint(a, short)
    b.release(claim(b, released, "worker-b", config()).lease)
    claim(c, live, "worker-c", config())
    c.finish(claim(c, done, "worker-c", config()).lease, Outcome.success(1), config())
    b.register(registered)
    b.register(lapsed)  # registering a known call changes nothing

    # When recovery (on a worker whose session is intact) looks within the unclaimed grace
    found = {s.call_id: s for s in c.expired(unclaimed_grace_s=3600)}

    # Then it finds the lapsed and the released calls, with their requests
    assert set(found) == {lapsed.call_id, released.call_id}
    assert found[lapsed.call_id].request == lapsed.request
    assert found[lapsed.call_id].name == lapsed.name
    # And past the grace, also the registered call nobody claimed
    time.sleep(0.05)
    later = {s.call_id for s in b.expired(unclaimed_grace_s=0.01)}
    assert later == {lapsed.call_id, released.call_id, registered.call_id}


def test_claim_recovery_is_won_by_exactly_one_caller(store_factory):
    # Given a lapsed call and 8 recovery loops, each with its own store
    call = new_call()
    stores = [store_factory() for _ in range(8)]
    stores[0].register(call)
    barrier = threading.Barrier(len(stores))
    wins: list[bool] = [False] * len(stores)

    # When they all try to claim the right to republish it at once
    def race(i: int) -> None:
        barrier.wait()
        wins[i] = stores[i].claim_recovery(call.call_id, f"worker-{i}", 30.0)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    # Then exactly one wins, and nobody else can while its hold lasts
    assert sum(wins) == 1
    assert stores[1].claim_recovery(call.call_id, "worker-late", 30.0) == 0


def test_a_claim_ends_the_recovery_hold_so_a_second_crash_is_recovered_at_once(store_factory, lose_lease):
    # Given a call that recovery republished (its hold is 30 s) and a worker then claimed
    store = store_factory()
    call = new_call()
    store.register(call)
    assert store.claim_recovery(call.call_id, "sweeper", 30.0)
    cfg = config(lease_ttl_s=SHORT_TTL_S)  # lose_lease waits one TTL on TTL stores
    lease = claim(store, call, "worker-a", cfg).lease

    # When that attempt is lost too
    lose_lease(store, lease)
    wait_out_sweep_hint(store, cfg)

    # Then the next sweep may republish it at once, not after the hold
    assert call.call_id in {c.call_id for c in store_factory().expired()}
    assert store_factory().claim_recovery(call.call_id, "sweeper-2", 30.0) == 1  # a new count


def test_claim_recovery_never_takes_a_call_with_a_live_lease_or_a_result(store_factory, lose_lease):
    """Reproduces on 4a34578: the sweeper could republish a call that another worker had
    just claimed (claim_recovery checked nothing but its own hold)."""
    # Given a call recovery found lapsed, which a worker claims before the sweeper acts
    store, sweeper = store_factory(), store_factory()
    call, done = new_call(), new_call()
    store.register(call)
    cfg = config()
    lease = claim(store, call, "worker-a", cfg).lease

    # When the sweeper tries to claim the right to republish it
    # Then it is refused while the lease lives, and once the call has its result
    assert sweeper.claim_recovery(call.call_id, "sweeper", 30.0) == 0
    store.finish(lease, Outcome.success(1), cfg)
    assert sweeper.claim_recovery(call.call_id, "sweeper", 30.0) == 0
    store.register(done)
    assert sweeper.claim_recovery(done.call_id, "sweeper", 30.0) == 1
    assert sweeper.claim_recovery(f"never-seen-{uuid.uuid4().hex}", "sweeper", 30.0) == 0


def test_claim_recovery_backs_off_and_counts_republishes_until_a_claim(store_factory, lose_lease):
    # Given a registered call nobody claims, republished with a 0.2 s first hold, 0.4 s at most
    store = store_factory()
    fresh = new_call()
    store.register(fresh)

    # When a sweeper tries again and again
    seen = []
    began = time.monotonic()
    while len(seen) < 5 and time.monotonic() - began < 20:
        sent = time.monotonic()
        n = store.claim_recovery(fresh.call_id, "sweeper", 0.2, 0.4)
        if n:
            seen.append((n, sent, time.monotonic()))
        time.sleep(0.01)

    # Then each win is counted, and each hold doubles (0.2, 0.4) up to the cap (0.4, not 0.8, 1.6):
    # a hold starts at the store's time of its win, between that call's send and its reply, so
    # from one win's send to the next win's reply is at least the hold, however loaded the host
    assert [n for n, _, _ in seen] == [1, 2, 3, 4, 5]
    gaps = [b - a for (_, a, _), (_, _, b) in itertools.pairwise(seen)]
    assert 0.19 <= gaps[0] and 0.39 <= gaps[1] and 0.39 <= gaps[2] and 0.39 <= gaps[3], gaps
    assert gaps[3] < 1.5, gaps  # capped (uncapped it would be 1.6; a wide margin for load)

    # And a claim restarts the count: a later lapse is a first republish again
    lease = claim(store, fresh, "worker-a", config(lease_ttl_s=SHORT_TTL_S)).lease
    lose_lease(store, lease)
    assert store_factory().claim_recovery(fresh.call_id, "sweeper", 0.2, 0.4) == 1


def test_abandon_records_a_failure_only_for_a_call_nobody_holds(store_factory, lose_lease):
    # Given a registered call nobody claimed, and one a worker holds
    store, other = store_factory(), store_factory()
    lost, held = new_call(), new_call()
    store.register(lost)
    store.register(held)
    cfg = config()
    lease = claim(store, held, "worker-a", cfg).lease
    failure = Outcome.failure("ExecutionAbandoned", "never claimed", 0)

    # When recovery gives up on both
    # Then the unclaimed one ends failed, once, with its result event; the held one is untouched
    assert other.abandon(lost, failure) is True
    assert other.abandon(lost, failure) is False
    assert store.result(lost.call_id) == failure
    assert trail(store, lost.call_id) == [(FAILED, f"{lost.call_id}:result", 0)]
    assert lost.call_id not in {c.call_id for c in store.expired(unclaimed_grace_s=0)}
    assert other.abandon(held, Outcome.failure("ExecutionAbandoned", "x", 1)) is False
    assert other.abandon(held, failure) is False  # wrong attempt count as well
    # And a later delivery of the abandoned call answers with that result
    assert isinstance(store.begin(lost, "worker-b", cfg), Finished)
    assert store.finish(lease, Outcome.success(1), cfg) is not None
