"""lifecycle.plan_recovery_claim: the republish count and its backoff, decided once (the
stores apply it; claim_recovery.lua applies it in the state it was planned for)."""

from __future__ import annotations

from aaa_celery.lifecycle import CallState, Outcome, plan_recovery_claim, recovery_hold


def test_a_held_call_is_not_claimed_again_until_its_hold_ends():
    assert plan_recovery_claim(CallState(1), (1, 1), held_until=105.0, now=100.0, hold_s=5.0, max_hold_s=None) is None
    assert plan_recovery_claim(CallState(1), (1, 1), held_until=100.0, now=100.0, hold_s=5.0, max_hold_s=20.0) == (2, 110.0)


def test_the_count_backs_off_and_restarts_after_a_claim():
    # counted at attempt 1: the third republish waits 4x, capped by max_hold_s
    assert plan_recovery_claim(CallState(1), (1, 2), 0.0, 100.0, 5.0, 12.0) == (3, 112.0)
    # a new attempt since (a claim) restarts the count
    assert plan_recovery_claim(CallState(2), (1, 5), 0.0, 100.0, 5.0, 12.0) == (1, 105.0)
    assert plan_recovery_claim(CallState(0), None, 0.0, 100.0, 5.0, None) == (1, 105.0)
    assert recovery_hold(4, 1.0, None) == 1.0 and recovery_hold(4, 1.0, 100.0) == 8.0


def test_only_a_known_call_without_a_result_or_a_live_lease_is_claimed():
    assert plan_recovery_claim(None, None, 0.0, 100.0, 5.0, None) is None
    assert plan_recovery_claim(CallState(1, Outcome.success(1, 1)), None, 0.0, 100.0, 5.0, None) is None
    assert plan_recovery_claim(CallState(1, holder_live=True), None, 0.0, 100.0, 5.0, None) is None
    assert plan_recovery_claim(CallState(1), None, 0.0, 100.0, 5.0, None) == (1, 105.0)
