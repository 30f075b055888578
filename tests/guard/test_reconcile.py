"""The reconcile step's answers, on the memory store with a driven clock: happened, did not
happen, cannot tell, and a reconcile that raises or answers nonsense (the fleet test,
tests/worker/test_reconcile.py, kills real workers)."""

from __future__ import annotations

import pytest

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import OutcomeUnknown, ToolError
from aaa_celery.guard import GuardRunner, Happened, NotHappened
from aaa_celery.guard.reconcile import RECONCILED
from aaa_celery.lifecycle import CallSpec
from aaa_celery.stores.memory import MemoryStore

AMO = GuardConfig(delivery=Delivery.AT_MOST_ONCE, lease_ttl_s=1.0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lost_call(answer):
    """A store with an at_most_once call whose attempt 1 was lost, and a runner whose
    reconcile answers ``answer`` (or raises it)."""
    clock = Clock()
    store = MemoryStore(clock=clock)
    call = CallSpec("c1", "pay", "key-1")
    store.begin(call, "w1", AMO)
    clock.t += 5  # the lease lapsed: its worker died

    def reconcile(attempt):
        assert attempt == 1
        if isinstance(answer, Exception):
            raise answer
        return answer

    from aaa_celery.worker.codec import CODEC  # kombu's JSON, as a worker keeps values

    return store, call, GuardRunner(store, AMO, codec=CODEC, reconcile=reconcile)


def found(store):
    return [e.data["found"] for e in store.events("c1") if e.type == RECONCILED]


def test_happened_settles_the_call_with_the_value():
    store, call, runner = lost_call(Happened({"id": "ch_1"}))
    assert runner.run(call, "w2", lambda n: pytest.fail("never runs")) == {"id": "ch_1"}
    assert store.result("c1").value == {"id": "ch_1"} and found(store) == ["happened"]
    assert GuardRunner(store, AMO).run(call, "w3", lambda n: None) == {"id": "ch_1"}  # later deliveries too


def test_not_happened_fails_cleanly():
    store, call, runner = lost_call(NotHappened("no charge with key-1"))
    with pytest.raises(ToolError, match="EffectNotApplied.*no charge with key-1"):
        runner.run(call, "w2", lambda n: None)
    assert store.result("c1").error == "EffectNotApplied" and found(store) == ["not_happened"]


@pytest.mark.parametrize(("answer", "kind"), [(None, "unknown"), (RuntimeError("provider down"), "error"),
                                              ("yes", "error"), (Happened(object()), "error")])
def test_cannot_tell_or_an_error_leaves_outcome_unknown(answer, kind):
    store, call, runner = lost_call(answer)
    with pytest.raises(OutcomeUnknown):
        runner.run(call, "w2", lambda n: None)
    assert store.result("c1").error == "OutcomeUnknown" and found(store) == [kind]


def test_a_reconcile_step_that_hangs_is_cut_at_the_timeout_and_leaves_outcome_unknown():
    import time

    store, call, _ = lost_call(None)
    runner = GuardRunner(store, AMO, timeout_s=0.5, reconcile=lambda attempt: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown):
        runner.run(call, "w2", lambda n: None)
    assert time.monotonic() - started < 10
    assert found(store) == ["error"]
    assert [e.data["error"] for e in store.events("c1") if e.type == RECONCILED] == ["ToolTimeout"]
