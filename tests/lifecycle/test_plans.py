"""lifecycle.plan_checkpoint, purgeable and plan_spend: what a store keeps of a checkpoint,
which calls a purge deletes, and what a spend writes (every store applies them; tests/stores
runs them on each)."""

from __future__ import annotations

import pytest

from aaa_celery.lifecycle import (
    MAX_CHECKPOINT_BYTES, PURGED, Checkpoint, Lease, Outcome, Spend, awaits_recovery, checkpoint_json, lost_cause_event, plan_checkpoint, plan_purge, plan_spend, purgeable,
)

LEASE = Lease("c", 2, "w", "t", 10.0, 110.0)


def test_a_checkpoint_is_kept_stamped_with_its_lease_attempt_only_while_the_lease_holds():
    kept = plan_checkpoint(LEASE, True, checkpoint_json(1, {"page": 3}))
    assert kept.reply is True and Checkpoint.from_json(kept.checkpoint or "") == Checkpoint(2, {"page": 3})
    lost = plan_checkpoint(LEASE, False, checkpoint_json(2, {"page": 3}))
    assert lost.reply is False and lost.checkpoint is None


def test_a_checkpoint_no_store_keeps_is_refused_holding_or_not():
    over = checkpoint_json(2, "x" * (MAX_CHECKPOINT_BYTES - 64)).replace('"x', '"xx' + "y" * 100)
    for bad in (over, "{}", "[]", "nope"):
        for holds in (True, False):
            with pytest.raises(ValueError):
                plan_checkpoint(LEASE, holds, bad)


def test_a_purge_deletes_finished_calls_seen_before_the_cutoff_and_all_they_keep():
    done = Outcome.success(1, 1)
    assert purgeable(done, 99.0, 100.0)
    assert not purgeable(done, 100.0, 100.0)  # seen at the cutoff: kept
    assert not purgeable(None, 0.0, 100.0)  # no result yet: kept, whatever its age
    assert set(PURGED) == {"result", "events", "checkpoint", "recovery", "call"} and PURGED[-1] == "call"


def test_a_purge_plan_deletes_a_purgeable_call_or_the_listing_of_one_whose_records_are_gone():
    done = Outcome.success(1, 1)
    assert plan_purge(True, done, 99.0, 100.0) == "call"
    assert plan_purge(True, None, 99.0, 100.0) is None  # running: kept
    assert plan_purge(True, done, 100.0, 100.0) is None  # seen again since: kept
    assert plan_purge(False, None, 99.0, 100.0) == "entry"  # its records expired
    assert plan_purge(False, None, None, 100.0) is None  # not listed: nothing to do


def test_a_spend_counts_a_token_once_per_window_within_the_limit():
    # window 10 s: now 105 is window 10
    assert plan_spend(None, 0.0, False, 2.0, 3.0, 10.0, 105.0) == Spend(True, 10, True, 2.0)
    assert plan_spend(10, 2.0, False, 2.0, 3.0, 10.0, 105.0) == Spend(False, 10)  # over the limit
    assert plan_spend(10, 2.0, True, 2.0, 3.0, 10.0, 105.0) == Spend(True, 10)  # counted already
    assert plan_spend(10, 0.2, False, 0.1, 0.3, 10.0, 105.0) == Spend(True, 10, False, 0.1)  # float slack
    # a new window starts empty: the old total and tokens no longer count
    assert plan_spend(9, 3.0, True, 2.0, 3.0, 10.0, 105.0) == Spend(True, 10, True, 2.0)
    assert plan_spend(9, 0.0, False, 4.0, 3.0, 10.0, 105.0) == Spend(False, 10, True)


def test_recovery_brings_back_a_lost_attempt_at_once_and_an_unclaimed_call_after_its_grace():
    assert awaits_recovery(1, 0, seen_at=100.0, now=100.0, grace_s=60.0)  # attempt 1 lost
    assert not awaits_recovery(1, 1, 100.0, 159.9, 60.0)  # handed on: waits as a new call
    assert awaits_recovery(1, 1, 100.0, 160.0, 60.0) and awaits_recovery(0, 0, 100.0, 160.0, 60.0)
    assert not awaits_recovery(0, 0, 100.0, 159.9, 60.0)  # registered, within its grace
    # a call with a result, or one a live lease holds, is never brought back
    assert not awaits_recovery(1, 0, 100.0, 200.0, 60.0, result=Outcome.success(1, 1))
    assert not awaits_recovery(1, 0, 100.0, 200.0, 60.0, holder_live=True)


def test_only_a_lapsed_claimed_call_without_a_result_has_a_lost_cause_to_look_up():
    assert lost_cause_event("c", 2, None, False) == "c:attempt:2:fenced"
    assert lost_cause_event("c", 0, None, False) is None  # never claimed
    assert lost_cause_event("c", 2, None, True) is None  # its lease is live
    assert lost_cause_event("c", 2, Outcome.success(1, 2), False) is None  # finished
