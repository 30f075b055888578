"""The conformance suite of ``CallStore`` (stores/base.py): every case runs on every backend.

The other interfaces have their own: ``test_recovery_index.py``, ``test_checkpoints.py``,
``test_store_ops.py`` (operations), ``test_conformance_budgets.py``, ``test_run_records.py``.

A store only makes the lifecycle's decisions atomic (DESIGN.md §2-3), so each case
here states one guarantee of the call lifecycle and checks that memory, redis,
postgresql and sqlite keep it alike. Workers are separate store instances from
``store_factory``; a lost lease is ``lose_lease`` (TTL lapse, or a killed session).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import ExecutionAbandoned, OutcomeUnknown
from aaa_celery.lifecycle import (
    COMPLETED,
    FAILED,
    FENCED,
    RETRIED,
    STALE_RESULT,
    STARTED,
    Accepted,
    Busy,
    CallSpec,
    Checkpoint,
    Claimed,
    Finished,
    Outcome,
    Refused,
    Stale,
    checkpoint_json,
    registered_late,
    stamped,
)

SHORT_TTL_S = 0.3
LONG_TTL_S = 30.0


def new_call(name: str = "refund") -> CallSpec:
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    return CallSpec(
        call_id, name=name, idempotency_key=f"key/{call_id}",
        request={"task": f"tools.{name}", "args": [], "kwargs": {"order": 7}, "queue": "tools"},
    )


def config(**overrides) -> GuardConfig:
    return GuardConfig(**{"lease_ttl_s": LONG_TTL_S, **overrides})


def claim(store, call: CallSpec, worker: str, cfg: GuardConfig) -> Claimed:
    got = store.begin(call, worker, cfg)
    assert isinstance(got, Claimed), f"{worker} expected to claim {call.call_id}, got {got!r}"
    return got


def trail(store, call_id: str) -> list[tuple[str, str, int]]:
    return [(e.type, e.id, e.attempt) for e in store.events(call_id)]


def started_attempts(store, call_id: str) -> list[int]:
    return [e.attempt for e in store.events(call_id) if e.type == STARTED]


def superseded(store_factory, lose_lease, cfg: GuardConfig):
    """A's attempt 1 lost its lease and B took the call over as attempt 2.

    Returns the two workers' stores, the call, and A's (old) and B's (new) leases."""
    a, b = store_factory(), store_factory()
    call = new_call()
    old = claim(a, call, "worker-a", cfg.model_copy(update={"lease_ttl_s": SHORT_TTL_S})).lease
    lose_lease(a, old)
    new = claim(b, call, "worker-b", cfg).lease
    return a, b, call, old, new


# --- begin ------------------------------------------------------------------------------


def test_begin_claims_attempt_1_and_records_started_event_durably(store_factory):
    # Given a call nobody has seen
    worker_a, reader = store_factory(), store_factory()
    call, cfg = new_call(), config()

    # When a worker begins it
    got = worker_a.begin(call, "worker-a", cfg)

    # Then it holds attempt 1, fenced by 1
    assert isinstance(got, Claimed)
    lease = got.lease
    assert (lease.call_id, lease.attempt, lease.fence) == (call.call_id, 1, 1)
    assert lease.worker == "worker-a"
    assert lease.token and lease.ttl_s == cfg.lease_ttl_s
    if worker_a.ttl_leases:
        assert lease.expires_at == pytest.approx(worker_a.now() + cfg.lease_ttl_s, abs=2.0)
    # And the started event is already visible to another worker, with the spec's id and data
    [event] = reader.events(call.call_id)
    assert (event.type, event.id, event.attempt) == (STARTED, f"{call.call_id}:attempt:1", 1)
    assert event.call_id == call.call_id
    assert event.data == {
        "call_id": call.call_id, "name": "refund", "attempt": 1,
        "worker": "worker-a", "idempotency_key": call.idempotency_key,
    }
    assert reader.result(call.call_id) is None


def test_begin_while_held_is_busy_and_records_nothing(store_factory):
    # Given worker A holds a call
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config()
    claim(a, call, "worker-a", cfg)

    # When worker B receives the same call
    got = b.begin(call, "worker-b", cfg)

    # Then B is told who holds it, and no attempt 2 exists
    assert isinstance(got, Busy)
    assert got.holder == "worker-a"
    if a.ttl_leases:
        assert got.expires_at is not None and got.expires_at > b.now()
    assert started_attempts(b, call.call_id) == [1]


def test_a_retried_begin_whose_reply_was_lost_claims_the_same_attempt_again(store_factory, lose_lease):
    """Issue 13, item 2 (reproduces on 4a34578: the retry was Busy, its own orphaned claim).

    A ``begin`` whose write landed but whose reply was lost is retried with the same token:
    it claims that attempt again, live (a TTL lease) or after its session died (PostgreSQL),
    and no attempt is wasted, under at_most_once too."""
    # Given worker A's begin with token T landed, but A never heard the reply
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config(delivery=Delivery.AT_MOST_ONCE)
    first = claim(a, call, "worker-a", cfg)  # stands for the write that landed
    token = first.lease.token.rpartition(".")[2]
    if not a.ttl_leases:
        lose_lease(a, first.lease)  # the reply was lost with the connection, and its session died

    # When A's begin is retried with T (on another connection)
    again = b.begin(call, "worker-a", cfg, token=token)

    # Then it claims attempt 1 again: one started event, no attempt 2, no refusal
    assert isinstance(again, Claimed), again
    assert again.attempt == 1
    assert started_attempts(b, call.call_id) == [1]
    # And another delivery (another token) is busy, not a second claim
    assert isinstance(store_factory().begin(call, "worker-c", cfg), Busy)
    # And the reclaimed lease records the one result
    assert isinstance(b.finish(again.lease, Outcome.success({"ok": 1}), cfg), Accepted)
    assert b.result(call.call_id).attempt == 1


def test_a_retried_begin_after_its_lease_lapsed_is_not_refused_under_at_most_once(store_factory, lose_lease):
    """Issue 13, item 2 (reproduces on 4a34578: OutcomeUnknown for a body that never ran)."""
    # Given A's claim with token T landed, its reply was lost, and its lease lapsed
    a, b = store_factory(), store_factory()
    call = new_call()
    cfg = config(delivery=Delivery.AT_MOST_ONCE, lease_ttl_s=SHORT_TTL_S)
    first = claim(a, call, "worker-a", cfg)
    lose_lease(a, first.lease)

    # When the begin is retried with T
    again = b.begin(call, "worker-a", cfg, token=first.lease.token.rpartition(".")[2])

    # Then attempt 1 is claimed again; only another token would have been refused
    assert isinstance(again, Claimed) and again.attempt == 1, again
    assert started_attempts(b, call.call_id) == [1]
    assert b.result(call.call_id) is None


def test_a_token_let_go_by_its_holder_claims_nothing_again(store_factory):
    # Given A claimed with token T and released the call (the attempt counts as lost)
    a = store_factory()
    call, cfg = new_call(), config(max_attempts=2)
    first = claim(a, call, "worker-a", cfg)
    a.release(first.lease)

    # When a begin with T comes again, it is an ordinary delivery: attempt 2
    again = a.begin(call, "worker-a", cfg, token=first.lease.token.rpartition(".")[2])
    assert isinstance(again, Claimed) and again.attempt == 2, again


@pytest.mark.parametrize("delivery, max_attempts, recorded, cause", [
    (Delivery.AT_MOST_ONCE, 3, None, "worker_lost"),
    (Delivery.AT_MOST_ONCE, 3, "store_unreachable", "store_unreachable"),
    (Delivery.AT_LEAST_ONCE, 1, None, "worker_lost"),
    (Delivery.AT_LEAST_ONCE, 1, "store_unreachable", "store_unreachable"),
])
def test_a_refusal_names_the_loss_that_caused_it(store_factory, lose_lease, delivery, max_attempts, recorded, cause):
    """Issue 13, item 3: ``OutcomeUnknown`` / ``ExecutionAbandoned`` say which loss caused
    them (reproduces on 4a34578: always "the worker was lost", even when the store was)."""
    a, b = store_factory(), store_factory()
    call = new_call()
    cfg = config(delivery=delivery, max_attempts=max_attempts, lease_ttl_s=SHORT_TTL_S)
    lease = claim(a, call, "worker-a", cfg).lease
    lose_lease(a, lease)
    if recorded:
        a.fenced(lease, recorded)  # the holder gave up: it could not prove its lease
    refused = b.begin(call, "worker-b", cfg)
    assert isinstance(refused, Refused), refused
    assert refused.result.message.endswith(f"(cause: {cause})"), refused.result.message
    assert b.result(call.call_id) == refused.result
    kind = OutcomeUnknown if delivery is Delivery.AT_MOST_ONCE else ExecutionAbandoned
    assert kind(refused.result.message).cause == cause


def test_every_attempt_lost_is_a_poison_call(store_factory, lose_lease):
    a = store_factory()
    call, cfg = new_call(), config(max_attempts=2, lease_ttl_s=SHORT_TTL_S)
    for n in (1, 2):
        lease = claim(a, call, f"worker-{n}", cfg).lease
        lose_lease(a, lease)
    refused = a.begin(call, "worker-3", cfg)
    assert isinstance(refused, Refused)
    assert ExecutionAbandoned(refused.result.message).cause == "poison_call"


def test_lost_lease_is_taken_over_as_attempt_2(store_factory, lose_lease):
    # Given worker A's lease on a call lapses (TTL passes, or A's session dies)
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config(lease_ttl_s=SHORT_TTL_S)
    lease = claim(a, call, "worker-a", cfg).lease
    lose_lease(a, lease)

    # When worker B receives the call
    got = b.begin(call, "worker-b", cfg)

    # Then B claims attempt 2, recorded as B's
    assert isinstance(got, Claimed)
    assert (got.attempt, got.lease.fence, got.lease.worker) == (2, 2, "worker-b")
    assert got.lease.token != lease.token
    started = [e for e in b.events(call.call_id) if e.type == STARTED]
    assert [(e.id, e.data["worker"]) for e in started] == [
        (f"{call.call_id}:attempt:1", "worker-a"),
        (f"{call.call_id}:attempt:2", "worker-b"),
    ]


def test_at_least_once_runs_max_attempts_then_refuses_execution_abandoned(
    store_factory, lose_lease
):
    # Given an at_least_once call that loses every attempt's worker
    call = new_call()
    cfg = config(lease_ttl_s=SHORT_TTL_S, delivery=Delivery.AT_LEAST_ONCE, max_attempts=3)
    for n in (1, 2, 3):
        worker = store_factory()
        got = claim(worker, call, f"worker-{n}", cfg)
        assert got.attempt == n
        lose_lease(worker, got.lease)

    # When the call is delivered once more
    store = store_factory()
    got = store.begin(call, "worker-4", cfg)

    # Then it is refused as ExecutionAbandoned, which becomes its one recorded result
    assert isinstance(got, Refused)
    assert (got.result.ok, got.result.error) == (False, "ExecutionAbandoned")
    assert store.result(call.call_id) == got.result
    assert started_attempts(store, call.call_id) == [1, 2, 3]
    assert [t for t, _, _ in trail(store, call.call_id)] == [STARTED] * 3 + [FAILED]
    # And any later delivery just finds the failure
    again = store_factory().begin(call, "worker-5", cfg)
    assert isinstance(again, Finished) and again.result == got.result


def test_at_most_once_lost_attempt_is_outcome_unknown_never_attempt_2(store_factory, lose_lease):
    # Given an at_most_once call whose only attempt lost its worker
    a = store_factory()
    call = new_call("send_payment")
    cfg = config(lease_ttl_s=SHORT_TTL_S, delivery=Delivery.AT_MOST_ONCE, max_attempts=5)
    lose_lease(a, claim(a, call, "worker-a", cfg).lease)

    # When the call is delivered again
    b = store_factory()
    got = b.begin(call, "worker-b", cfg)

    # Then it is refused as OutcomeUnknown and never runs again
    assert isinstance(got, Refused)
    assert (got.result.ok, got.result.error) == (False, "OutcomeUnknown")
    assert b.result(call.call_id) == got.result
    again = store_factory().begin(call, "worker-c", cfg)
    assert isinstance(again, Finished) and again.result.error == "OutcomeUnknown"
    assert started_attempts(b, call.call_id) == [1]


def test_release_counts_as_a_lost_attempt(store_factory):
    # Given worker A gives back its lease without a result
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config()
    lease = claim(a, call, "worker-a", cfg).lease
    a.release(lease)

    # When the call is delivered again
    got = b.begin(call, "worker-b", cfg)

    # Then attempt 1 is spent: at_least_once runs attempt 2 at once...
    assert isinstance(got, Claimed) and got.attempt == 2
    # ...and at_most_once refuses
    other = new_call()
    strict = config(delivery=Delivery.AT_MOST_ONCE)
    a.release(claim(a, other, "worker-a", strict).lease)
    refused = b.begin(other, "worker-b", strict)
    assert isinstance(refused, Refused) and refused.result.error == "OutcomeUnknown"


# --- finish -----------------------------------------------------------------------------


def test_finish_records_the_first_result_and_later_results_lose(store_factory):
    # Given worker A finished its call
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config()
    lease = claim(a, call, "worker-a", cfg).lease
    first = a.finish(lease, Outcome.success({"refund": "r-1"}), cfg)
    assert isinstance(first, Accepted)
    assert first.result == Outcome.success({"refund": "r-1"}, attempt=1)

    # When a different outcome arrives for the same call
    second = a.finish(lease, Outcome.failure("ToolError", "boom"), cfg)

    # Then the first result stays the call's one result
    assert isinstance(second, Stale) and second.current == first.result
    assert b.result(call.call_id) == first.result
    results = [e for e in b.events(call.call_id) if e.type in (COMPLETED, FAILED)]
    assert [(e.type, e.id) for e in results] == [(COMPLETED, f"{call.call_id}:result")]
    assert results[0].data == {
        "call_id": call.call_id, "name": "refund", "attempt": 1, "value": {"refund": "r-1"},
    }


def test_retried_finish_of_the_same_outcome_is_accepted_once(store_factory):
    # Given a finish whose write landed (the worker did not hear back, say)
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config()
    lease = claim(a, call, "worker-a", cfg).lease
    outcome = Outcome.failure("ToolError", "card declined")
    first = a.finish(lease, outcome, cfg)

    # When the worker retries the same finish, from another connection too
    again = a.finish(lease, outcome, cfg)
    again_elsewhere = b.finish(lease, outcome, cfg)

    # Then each is Accepted with the same result, and nothing is written twice
    assert isinstance(first, Accepted)
    assert again == first and again_elsewhere == first
    assert trail(b, call.call_id) == [
        (STARTED, f"{call.call_id}:attempt:1", 1),
        (FAILED, f"{call.call_id}:result", 1),
    ]
    assert b.result(call.call_id) == Outcome.failure("ToolError", "card declined", attempt=1)


def test_redelivery_after_completion_returns_finished(store_factory):
    # Given a completed call
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config()
    a.finish(claim(a, call, "worker-a", cfg).lease, Outcome.success(42), cfg)

    # When the broker delivers it again
    got = b.begin(call, "worker-b", cfg)

    # Then the recorded result comes back and no attempt starts
    assert isinstance(got, Finished)
    assert got.result == Outcome.success(42, attempt=1)
    assert started_attempts(b, call.call_id) == [1]


def test_stale_result_is_fenced_and_audited(store_factory, lose_lease):
    # Given A's attempt 1 was superseded by B's attempt 2
    cfg = config()
    a, b, call, old, new = superseded(store_factory, lose_lease, cfg)

    # When A's late result arrives
    late = a.finish(old, Outcome.success("from-a"), cfg)

    # Then it is not applied, only kept as aaa.tool.stale_result
    assert isinstance(late, Stale) and late.current is None
    assert b.result(call.call_id) is None
    [stale] = [e for e in b.events(call.call_id) if e.type == STALE_RESULT]
    assert (stale.id, stale.attempt) == (f"{call.call_id}:attempt:1:stale", 1)
    assert stale.data["value"] == "from-a"
    # And B's result becomes the one result
    done = b.finish(new, Outcome.success("from-b"), cfg)
    assert isinstance(done, Accepted) and done.result == Outcome.success("from-b", attempt=2)
    assert b.result(call.call_id) == done.result


def test_without_fencing_the_first_finisher_wins(store_factory, lose_lease):
    # Given fence_results=False and A's attempt 1 superseded by B's attempt 2
    cfg = config(fence_results=False)
    a, b, call, old, new = superseded(store_factory, lose_lease, cfg)

    # When A (stale) finishes first, then B
    first = a.finish(old, Outcome.success("from-a"), cfg)
    second = b.finish(new, Outcome.success("from-b"), cfg)

    # Then A's result is the one result and B's is kept only for audit
    assert isinstance(first, Accepted) and first.result == Outcome.success("from-a", attempt=1)
    assert isinstance(second, Stale) and second.current == first.result
    assert b.result(call.call_id) == first.result
    types = [t for t, _, _ in trail(b, call.call_id)]
    assert types == [STARTED, STARTED, COMPLETED, STALE_RESULT]


# --- renew, fenced, the audit trail -----------------------------------------------------


def test_renew_holds_the_lease_until_a_takeover_then_fails(store_factory, lose_lease):
    # Given A holds a call and heartbeats
    a, b = store_factory(), store_factory()
    ttl = SHORT_TTL_S * 4  # room for a loaded machine: 0.4 s margins on both sides below
    call, cfg = new_call(), config(lease_ttl_s=ttl)
    old = claim(a, call, "worker-a", cfg).lease
    assert a.renew(old) is True
    if a.ttl_leases:
        # renewing halfway keeps it past its first TTL
        time.sleep(ttl * 0.5)
        assert a.renew(old) is True
        time.sleep(ttl * 0.5 + 0.2)
        assert isinstance(b.begin(call, "worker-b", cfg), Busy)

    # When A's lease lapses and B takes the call over
    lose_lease(a, old)
    new = claim(b, call, "worker-b", config()).lease

    # Then A's heartbeat fails while B's holds
    assert a.renew(old) is False
    assert b.renew(new) is True


def test_events_tell_the_story_in_order_with_the_spec_ids(store_factory, lose_lease):
    # Given attempt 1 lost its lease, attempt 2 took over, and A then cancelled its tool
    cfg = config()
    a, b, call, old, new = superseded(store_factory, lose_lease, cfg)
    a.fenced(old)

    # When B completes the call and A's cancelled attempt reports again
    b.finish(new, Outcome.success("ok"), cfg)
    a.fenced(old)

    # Then the trail lists each fact once, oldest first, with the spec's types and ids
    cid = call.call_id
    assert trail(b, cid) == [
        (STARTED, f"{cid}:attempt:1", 1),
        (STARTED, f"{cid}:attempt:2", 2),
        (FENCED, f"{cid}:attempt:1:fenced", 1),
        (COMPLETED, f"{cid}:result", 2),
    ]
    events = b.events(cid)
    assert all(e.call_id == cid for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert events[2].data == {"call_id": cid, "attempt": 1, "worker": "worker-a"}
    assert b.events(f"call-never-seen-{uuid.uuid4().hex}") == []


def test_record_from_outside_an_attempt_first_writer_wins_and_frees_the_lease(store_factory):
    # Given a call a worker holds, and a call the store never saw
    store, other = store_factory(), store_factory()
    held, unseen = new_call(), new_call("mail")
    cfg = config()
    lease = claim(store, held, "worker-a", cfg).lease
    revoked = Outcome.failure("TaskRevokedError", "revoked")

    # When the call is revoked from outside its attempt (no lease: kind "first")
    # Then it is recorded with its result event, named by the stored spec, and the lease is free
    assert other.record(CallSpec(held.call_id), revoked) is True
    assert store.result(held.call_id) == revoked
    assert trail(store, held.call_id) == [(STARTED, f"{held.call_id}:attempt:1", 1),
                                          (FAILED, f"{held.call_id}:result", 0)]
    assert store.events(held.call_id)[-1].data["name"] == held.name
    assert not store.renew(lease)
    # (every reader sees no holder: PostgreSQL's calls() showed the holder whose session
    # still held the lock, though the call's row named no lease any more)
    assert next(r for r in other.calls() if r.call_id == held.call_id).holder is None
    # And a second record, or the holder's late finish, keeps that result
    assert other.record(CallSpec(held.call_id), Outcome.failure("TaskRevokedError", "expired")) is False
    assert isinstance(store.finish(lease, Outcome.success(1), cfg), Stale)
    assert store.result(held.call_id) == revoked
    # And a call the store never saw is registered and recorded (a refused message)
    assert other.record(unseen, Outcome.failure("ToolArgsError", "bad")) is True
    assert isinstance(store.begin(unseen, "worker-b", cfg), Finished)
    assert store.events(unseen.call_id)[-1].data["name"] == "mail"


def test_a_fenced_record_ends_only_its_own_attempt(store_factory, lose_lease):
    # Given a call whose attempt 1 lapsed and attempt 2 started elsewhere
    store = store_factory()
    call = new_call()
    cfg = config(lease_ttl_s=SHORT_TTL_S)
    lose_lease(store, claim(store, call, "worker-a", cfg).lease)
    claim(store_factory(), call, "worker-b", config())
    limit = Outcome.failure("TimeLimitExceeded", "hard time limit (1s) exceeded")

    # When the time limit of attempt 1 is recorded (kind "fenced")
    # Then it is refused: attempt 2 runs on, nothing is written
    assert store.record(call, stamped(limit, 1), "fenced") is False
    assert store.result(call.call_id) is None
    # And the time limit of attempt 2 ends the call
    assert store.record(call, stamped(limit, 2), "fenced") is True
    assert store.result(call.call_id) == stamped(limit, 2)


def test_record_refuses_an_unknown_kind(store_factory):
    with pytest.raises(ValueError, match="record kind"):
        store_factory().record(new_call(), Outcome.failure("X", "y"), "whatever")



def test_register_remembers_a_call_once_and_its_first_delivery_claims_attempt_1(store_factory):
    # Given a call registered at publish time, twice (a retried publish)
    store, other = store_factory(), store_factory()
    call = new_call("mail")
    store.register(call)
    other.register(call)

    # Then nothing is recorded yet, and its first delivery claims attempt 1 under its name
    assert store.events(call.call_id) == [] and store.result(call.call_id) is None
    got = claim(other, CallSpec(call.call_id), "worker-a", config())
    assert got.attempt == 1
    assert store.events(call.call_id)[0].data["name"] == "mail"


def test_register_many_remembers_each_call_as_register_does(store_factory):
    # Given a call already running, and three new calls sent together
    store, other = store_factory(), store_factory()
    running = new_call("mail")
    lease = claim(other, running, "worker-a", config()).lease
    sent = [new_call(f"mail-{n}") for n in range(3)]

    # When they are registered in one batch (the running one sent again with them)
    store.register_many([*sent, running])

    # Then each new call's first delivery claims attempt 1 under its own name, and the
    # running call keeps its lease (registering a known call changes nothing)
    for call in sent:
        assert store.events(call.call_id) == []
        assert claim(other, CallSpec(call.call_id), "worker-b", config()).attempt == 1
        assert store.events(call.call_id)[0].data["name"] == call.name
    assert isinstance(store.begin(running, "worker-b", config()), Busy)
    assert store.finish(lease, Outcome.success(1), config()) == Accepted(Outcome.success(1, 1))


def test_hand_on_frees_the_lease_and_the_next_delivery_claims_the_next_attempt(store_factory):
    # Given an at_most_once call whose attempt 1 hands it on (a retry the body asked for)
    store, other = store_factory(), store_factory()
    call = new_call()
    cfg = config(delivery=Delivery.AT_MOST_ONCE, max_attempts=1)
    lease = claim(store, call, "worker-a", cfg).lease
    store.hand_on(lease)

    # Then the lease is free and aaa.tool.retried recorded, and the next delivery claims
    # attempt 2 (the attempt was not lost: not OutcomeUnknown, not counted toward max_attempts)
    assert not store.renew(lease)
    assert (RETRIED, f"{call.call_id}:attempt:1:retried", 1) in trail(store, call.call_id)
    again = claim(other, call, "worker-b", cfg)
    assert again.attempt == 2
    # And a hand-on by a lease that no longer holds the call is audited only
    store.hand_on(lease)
    assert isinstance(store.begin(call, "worker-c", cfg), Busy)


# --- concurrency ------------------------------------------------------------------------

N_THREADS = 8
N_CALLS = 200


@dataclass
class Log:
    """What the racing workers saw, in the test's own monotonic clock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: call -> [(attempt, t_before_begin, t_claimed, t_let_go)]; t_let_go None: abandoned
    claims: dict[str, list[tuple[int, float, float, float | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    accepted: dict[str, list[Outcome]] = field(default_factory=lambda: defaultdict(list))
    errors: list[BaseException] = field(default_factory=list)


def _work(store, calls: list[CallSpec], cfg: GuardConfig, seed: int, log: Log, deadline: float):
    rng = random.Random(seed)
    pending = list(calls)
    while pending:
        assert time.monotonic() < deadline, f"worker {seed}: {len(pending)} calls never finished"
        rng.shuffle(pending)
        progress = False
        for call in list(pending):
            t0 = time.monotonic()
            got = store.begin(call, f"w{seed}", cfg)
            if isinstance(got, (Finished, Refused)):
                pending.remove(call)
                progress = True
                continue
            if isinstance(got, Busy):
                continue
            t1 = time.monotonic()
            progress = True
            time.sleep(rng.uniform(0, 0.003))
            roll = rng.random()
            if roll < 0.05 and store.ttl_leases:
                with log.lock:  # abandon it, as a frozen worker would: the TTL takes it back
                    log.claims[call.call_id].append((got.attempt, t0, t1, None))
                continue
            t2 = time.monotonic()
            with log.lock:
                log.claims[call.call_id].append((got.attempt, t0, t1, t2))
            if roll < 0.25:
                store.release(got.lease)
            else:
                outcome = Outcome.success(f"{call.call_id}@{got.attempt}")
                done = store.finish(got.lease, outcome, cfg)
                if isinstance(done, Accepted):
                    with log.lock:
                        log.accepted[call.call_id].append(done.result)
        if not progress:
            time.sleep(0.01)


def test_concurrent_workers_never_overlap_and_record_one_result(store_factory, backend):
    # Given 8 workers, each with its own store, and 200 calls they all receive;
    # they release some attempts and (TTL stores) abandon others, forcing takeovers
    stores = [store_factory() for _ in range(N_THREADS)]
    ttl = SHORT_TTL_S if stores[0].ttl_leases else LONG_TTL_S
    cfg = config(lease_ttl_s=ttl, max_attempts=100)
    calls = [new_call(f"tool{i % 7}") for i in range(N_CALLS)]
    log = Log()
    deadline = time.monotonic() + 180

    # When they race begin/finish/release over the same calls
    def run(i: int) -> None:
        try:
            _work(stores[i], calls, cfg, seed=i, log=log, deadline=deadline)
        except BaseException as e:  # noqa: BLE001 - reported below
            log.errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), name=f"w{i}") for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    assert not log.errors, log.errors
    assert not any(t.is_alive() for t in threads)

    reader = store_factory()
    for call in calls:
        cid = call.call_id
        claims = sorted(log.claims[cid], key=lambda c: c[0])
        # Then every call has exactly one result, written once
        result = reader.result(cid)
        assert result is not None, cid
        events = reader.events(cid)
        assert sum(e.type in (COMPLETED, FAILED) for e in events) == 1, trail(reader, cid)
        if log.accepted[cid]:
            assert log.accepted[cid] == [result]
        # And the attempts are contiguous from 1, each claimed exactly once, in order
        started = [e for e in events if e.type == STARTED]
        attempts = [e.attempt for e in started]
        assert attempts == list(range(1, len(started) + 1)), (cid, attempts)
        assert [e.id for e in started] == [f"{cid}:attempt:{n}" for n in attempts]
        assert [c[0] for c in claims] == attempts, (cid, claims)
        # And no claim was granted while the previous one still surely held the call:
        # a lease lives at least until it is let go, or until t_before_begin + TTL
        for (n, t0, _, let_go), (_, _, t1_next, _) in zip(claims, claims[1:], strict=False):
            held_until = t0 + ttl - 0.02
            if let_go is not None:
                held_until = min(held_until, let_go)
            assert t1_next >= held_until, f"{cid}: attempt {n + 1} claimed while {n} held"


def _stored_trail(store, call_id: str) -> str:
    """The call's audit trail exactly as the backend keeps it (not as ``events()`` joins it)."""
    from aaa_celery.stores.memory import MemoryStore
    from aaa_celery.stores.redis import RedisStore
    from aaa_celery.stores.sql import SQLStore
    from aaa_celery.stores.sql.queries import select_events

    if isinstance(store, MemoryStore):
        return repr([e.data for e in store._calls[call_id].events])
    if isinstance(store, RedisStore):
        return "".join(store._redis.lrange(store.key(call_id, "events"), 0, -1))
    assert isinstance(store, SQLStore)
    with store._read() as conn:
        return repr([r.data for r in conn.execute(select_events(call_id))])


def test_a_result_value_is_stored_once_and_every_reader_still_sees_it(store_factory):
    """Reproduces on 23716a3: a result's value was written twice, in the call's result and
    in its ``aaa.tool.completed`` event (a 50 MB result took 100 MB for 7 days)."""
    # Given a call that returns a 2 MB value
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config()
    value = {"report": "x" * 2_000_000}
    done = a.finish(claim(a, call, "worker-a", cfg).lease, Outcome.success(value), cfg)
    assert isinstance(done, Accepted)

    # Then the trail as stored holds no copy of it
    assert len(_stored_trail(b, call.call_id)) < 10_000
    # And every reader still sees it: the result, a redelivery, the completed event
    assert b.result(call.call_id).value == value
    assert b.begin(call, "worker-b", cfg) == Finished(Outcome.success(value, attempt=1))
    [completed] = [e for e in b.events(call.call_id) if e.type == COMPLETED]
    assert completed.data == {"call_id": call.call_id, "name": "refund", "attempt": 1, "value": value}


def test_a_spec_in_force_gives_way_only_to_one_that_says_better_how_to_send_the_call(store_factory):
    """``lifecycle.merge_spec`` on every backend (Redis applies ``replaces_below``'s threshold
    in its scripts): a bare spec never replaces one, a rebuilt request replaces a bare spec
    only, and a message as sent replaces any, another message as sent too, unless it is
    registered late (``lifecycle.registered_late``): then it replaces a rebuilt request only."""
    store = store_factory()
    call_id = f"call-{uuid.uuid4().hex[:12]}"

    def spec(request: dict) -> CallSpec:
        return CallSpec(call_id, "refund", "key-1", request)

    rebuilt, rebuilt_again = {"task": "tools.refund", "args": [1]}, {"task": "tools.refund", "args": [2]}
    sent, sent_again = {"task": "tools.refund", "message": {"body": "a"}}, {"task": "tools.refund", "message": {"body": "b"}}
    steps = [(spec({}), {}), (spec(rebuilt), rebuilt), (spec(rebuilt_again), rebuilt), (spec({}), rebuilt),
             (registered_late(spec(sent_again)), sent_again), (spec(sent), sent), (spec(rebuilt_again), sent),
             (spec({}), sent), (spec(sent_again), sent_again), (registered_late(spec(sent)), sent_again)]
    for registered, in_force in steps:
        store.register(registered)
        kept = [r.spec.request for r in store.calls() if r.call_id == call_id]
        assert kept == [in_force], f"after registering {registered}"
