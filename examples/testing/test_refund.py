"""My refund tool under a kill -9 runs its effect once (docs/testing-your-tools.md).

    pytest -p aaa_celery.testing.pytest_plugin --aaa-app examples.testing.refund_app examples/testing
"""

from __future__ import annotations

import pytest

from aaa_celery import OutcomeUnknown
from aaa_celery.testing import effects

from examples.testing.refund_app import refund, refund_once


def refunds(order_id: str) -> list[dict]:
    return [e for e in effects.entries() if e["kind"] == "effect" and e.get("order_id") == order_id]


def test_refund_under_kill_9_runs_its_effect_once(aaa_fleet, aaa_check):
    fleet = aaa_fleet(size=2)
    call = refund.delay("A-100", 250)
    fleet.wait_started(call)            # attempt 1 runs on one worker ...
    fleet.kill_holder(call)             # ... which dies mid-call: kill -9, no cleanup

    value = call.get(timeout=60)        # attempt 2 on the other worker
    assert value["order_id"] == "A-100"
    assert [a.attempt for a in fleet.attempts(call.id)] == [1, 2]
    assert [r["applied"] for r in refunds("A-100")] in ([True], [False, True], [True, False])
    aaa_check(keyed=True)               # one result, the refund applied once, no overlap


def test_at_most_once_refund_under_kill_9_is_never_run_twice(aaa_fleet, aaa_check):
    fleet = aaa_fleet(size=2)
    call = refund_once.delay("A-200", 90)
    fleet.wait_started(call)
    fleet.kill_holder(call, whole_worker=False)   # only the pool child that runs it

    with pytest.raises(OutcomeUnknown):
        call.get(timeout=60)
    assert [a.attempt for a in fleet.attempts(call.id)] == [1]
    aaa_check()


def test_a_frozen_holder_s_late_refund_is_applied_once(aaa_fleet, aaa_check):
    fleet = aaa_fleet(size=2)
    call = refund.delay("A-250", 40)
    fleet.wait_started(call)
    frozen = fleet.freeze_holder(call)  # SIGSTOP: a GC pause, a VM freeze
    try:
        fleet.wait_started(call, attempt=2)   # its lease lapsed: another worker took over
    finally:
        frozen.thaw()                   # attempt 1 wakes up: fenced, or its late refund deduped by key
    assert call.get(timeout=60)["order_id"] == "A-250"
    assert fleet.store.result(call.id).attempt == 2
    assert len([r for r in refunds("A-250") if r["applied"]]) == 1
    aaa_check(keyed=True)


def test_a_duplicate_delivery_runs_the_refund_once(aaa_fleet, aaa_check):
    fleet = aaa_fleet(size=2)
    call = refund.delay("A-300", 10)
    fleet.wait_started(call)
    fleet.duplicate(call)               # the same message again, while attempt 1 runs
    assert call.get(timeout=60)["new"] is True
    assert len([e for e in effects.entries() if e["kind"] == "start" and e["call_id"] == call.id]) == 1
    aaa_check(keyed=True)


def test_refund_in_eager_mode_is_guarded_and_deduplicated(aaa_eager, aaa_check, monkeypatch):
    monkeypatch.setenv("REFUND_PSP_DELAY_S", "0")
    first = refund.apply_async(("A-400", 5), task_id="refund-A-400").get()
    again = refund.apply_async(("A-400", 5), task_id="refund-A-400").get()   # the same call id
    assert first == again and first["new"] is True
    assert len(refunds("A-400")) == 1
    assert aaa_eager.store.result("refund-A-400").value == first
    aaa_check(keyed=True)
