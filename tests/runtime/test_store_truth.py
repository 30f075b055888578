"""One truth (issue 13, item 3): the engine's fact for a call Celery reports failed is the
guard store's record; a call the store still runs is pending, not failed."""

from __future__ import annotations

from aaa_celery.config import GuardConfig
from aaa_celery.lifecycle import CallSpec, Claimed, Outcome
from aaa_celery.runtime.results import ToolFact, fact_from_celery, fact_from_record
from aaa_celery.stores.memory import MemoryStore


def celery_failure(call_id: str) -> ToolFact:
    fact = fact_from_celery(call_id, "refund", "FAILURE", TimeoutError("TimeLimitExceeded(30)"))
    assert fact is not None and not fact.ok
    return fact


def truth(store: MemoryStore, call_id: str) -> ToolFact | None:
    recorded = store.result(call_id)
    return fact_from_record(call_id, "refund", celery_failure(call_id), recorded,
                            recorded is not None or bool(store.events(call_id)))


def test_a_celery_failure_of_a_call_the_store_still_runs_is_pending_then_the_record_wins():
    """Reproduces on 4a34578: a FAILURE from outside the guard (a hard time limit, a lost
    worker) became the call's fact while the store went on to run the call."""
    store, cfg = MemoryStore(), GuardConfig()
    claimed = store.begin(CallSpec("c1", "refund"), "w", cfg)
    assert isinstance(claimed, Claimed)
    assert truth(store, "c1") is None  # begun, no result: pending, not failed
    store.finish(claimed.lease, Outcome.success({"refunded": 7}), cfg)
    fact = truth(store, "c1")
    assert fact is not None and fact.ok and fact.value == {"refunded": 7}


def test_a_recorded_failure_is_the_fact_and_a_call_the_store_never_saw_keeps_celerys():
    store, cfg = MemoryStore(), GuardConfig()
    claimed = store.begin(CallSpec("c2", "refund"), "w", cfg)
    assert isinstance(claimed, Claimed)
    store.finish(claimed.lease, Outcome.failure("ToolError", "card declined"), cfg)
    fact = truth(store, "c2")
    assert fact is not None and (fact.ok, fact.error, fact.message) == (False, "ToolError", "card declined")
    never = truth(store, "c3")  # e.g. refused before the guard ran it
    assert never == celery_failure("c3")
