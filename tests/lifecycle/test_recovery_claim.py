"""lifecycle.plan_recovery_claim: the republish count and its backoff, decided once (the
memory and SQL stores apply it; claim_recovery.lua mirrors it)."""

from __future__ import annotations

from aaa_celery.lifecycle import plan_recovery_claim, recovery_hold


def test_a_held_call_is_not_claimed_again_until_its_hold_ends():
    assert plan_recovery_claim(1, (1, 1), held_until=105.0, now=100.0, hold_s=5.0, max_hold_s=None) is None
    assert plan_recovery_claim(1, (1, 1), held_until=100.0, now=100.0, hold_s=5.0, max_hold_s=20.0) == (2, 110.0)


def test_the_count_backs_off_and_restarts_after_a_claim():
    # counted at attempt 1: the third republish waits 4x, capped by max_hold_s
    assert plan_recovery_claim(1, (1, 2), 0.0, 100.0, 5.0, 12.0) == (3, 112.0)
    # a new attempt since (a claim) restarts the count
    assert plan_recovery_claim(2, (1, 5), 0.0, 100.0, 5.0, 12.0) == (1, 105.0)
    assert plan_recovery_claim(0, None, 0.0, 100.0, 5.0, None) == (1, 105.0)
    assert recovery_hold(4, 1.0, None) == 1.0 and recovery_hold(4, 1.0, 100.0) == 8.0
