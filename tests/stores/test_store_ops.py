"""Conformance of the operators' verbs (stores/ops.py) on every backend: the time index of
calls behind ``celery aaa calls``, ``resolve`` of a call in doubt, and ``purge``."""

from __future__ import annotations

import time

import pytest

from aaa_celery.config import Delivery
from aaa_celery.errors import NotResolvable
from aaa_celery.lifecycle import Finished, Outcome
from aaa_celery.lifecycle import RESOLVED, CallSpec
from aaa_celery.protocol import call_id as tenant_call_id
from aaa_celery.stores.ops import CallRecord, call_state, matches

from .test_conformance import SHORT_TTL_S, claim, config, new_call


def records(store, **kw):
    return {r.call_id: r for r in store.calls(**kw)}


def test_calls_lists_every_call_newest_first_with_its_state(store_factory, lose_lease):
    # Given a completed, a failed, a running, a pending and an OutcomeUnknown call
    store = store_factory()
    start = store.now()
    done, failed, running, pending, unknown = (new_call(n) for n in ("refund", "refund", "report", "mail", "pay"))
    lease = claim(store, done, "w1", config()).lease
    store.finish(lease, Outcome.success({"id": 1}), config())
    time.sleep(0.01)  # Redis orders by milliseconds
    lease = claim(store, failed, "w1", config()).lease
    store.finish(lease, Outcome.failure("ValueError", "bad"), config())
    time.sleep(0.01)
    claim(store_factory(), running, "w2", config())  # w2's own store: losing w3's session must not end it
    time.sleep(0.01)
    store.register(pending)
    time.sleep(0.01)
    amo = config(lease_ttl_s=SHORT_TTL_S, delivery=Delivery.AT_MOST_ONCE)
    lose_lease(store, claim(store, unknown, "w3", amo).lease)
    store_factory().begin(unknown, "w4", amo)

    # When an operator lists the calls
    got = list(store.calls(since=start - 1))

    # Then each call is there once, newest first, in its state
    ids = [r.call_id for r in got]
    assert ids[:5] == [unknown.call_id, pending.call_id, running.call_id, failed.call_id, done.call_id]
    seen = [r.seen_at for r in got]
    assert seen == sorted(seen, reverse=True)
    states = {r.call_id: call_state(r) for r in got}
    assert states == {done.call_id: "completed", failed.call_id: "failed", running.call_id: "running",
                      pending.call_id: "pending", unknown.call_id: "unknown"}
    rec = {r.call_id: r for r in got}
    assert rec[running.call_id].holder == "w2" and rec[done.call_id].holder is None
    assert rec[done.call_id].result == Outcome.success({"id": 1}, 1)
    assert rec[unknown.call_id].attempts == 1 and rec[done.call_id].spec.name == "refund"
    assert [r.call_id for r in got if matches(r, tool="refund")] == [failed.call_id, done.call_id]
    assert [r.call_id for r in got if matches(r, state="running", tool="report")] == [running.call_id]


def test_calls_reads_a_time_window(store_factory):
    store = store_factory()
    old = new_call()
    store.register(old)
    time.sleep(0.05)
    middle = store.now()
    time.sleep(0.05)
    new = new_call()
    store.register(new)
    assert list(records(store, since=middle)) == [new.call_id]
    assert old.call_id in records(store, until=middle) and new.call_id not in records(store, until=middle)


def test_resolve_settles_an_unknown_outcome_once_with_who_and_why(store_factory, lose_lease):
    # Given an at_most_once call whose attempt was lost: OutcomeUnknown
    store = store_factory()
    call = new_call("pay")
    amo = config(lease_ttl_s=SHORT_TTL_S, delivery=Delivery.AT_MOST_ONCE)
    lose_lease(store, claim(store, call, "w1", amo).lease)
    assert store_factory().begin(call, "w2", amo).result.error == "OutcomeUnknown"

    # When an operator settles it as completed after checking the provider
    got = store.resolve(call.call_id, "completed", "seen in the PSP dashboard", "ops@host", {"charge": "ch_1"})

    # Then it is the call's result, a redelivery answers it, and the audit says who and why
    assert got == Outcome.success({"charge": "ch_1"}, 1)
    assert store.result(call.call_id) == got
    again = store_factory().begin(call, "w3", amo)
    assert isinstance(again, Finished) and again.result == got
    resolved = [e for e in store.events(call.call_id) if e.type == RESOLVED]
    assert len(resolved) == 1
    assert resolved[0].data["by"] == "ops@host" and resolved[0].data["note"] == "seen in the PSP dashboard"
    assert resolved[0].data["was"]["error"] == "OutcomeUnknown"
    assert call_state(records(store)[call.call_id]) == "resolved"

    # And it cannot be resolved a second time
    with pytest.raises(NotResolvable):
        store.resolve(call.call_id, "failed", "changed my mind", "ops@host")
    assert store.result(call.call_id) == got


def test_resolve_never_overwrites_a_real_result_or_a_running_call(store_factory):
    store = store_factory()
    done, running = new_call(), new_call()
    lease = claim(store, done, "w1", config()).lease
    store.finish(lease, Outcome.success(7), config())
    claim(store, running, "w1", config())
    for call in (done, running):
        with pytest.raises(NotResolvable):
            store.resolve(call.call_id, "failed", "no", "ops")
    assert store.result(done.call_id) == Outcome.success(7, 1)
    assert store.result(running.call_id) is None
    assert not [e for e in store.events(done.call_id) if e.type == RESOLVED]


def test_resolve_as_failed_records_a_tool_error(store_factory):
    store = store_factory()
    call = new_call()
    amo = config(delivery=Delivery.AT_LEAST_ONCE, max_attempts=1, lease_ttl_s=SHORT_TTL_S)
    lease = claim(store, call, "w1", amo).lease
    store.release(lease)
    assert store.begin(call, "w2", amo).result.error == "ExecutionAbandoned"
    got = store.resolve(call.call_id, "failed", "refund never reached the bank", "ops")
    assert (got.ok, got.error) == (False, "ToolError") and "refund never reached the bank" in got.message


def test_purge_deletes_finished_calls_seen_before_the_cutoff_only(store_factory):
    store = store_factory()
    old_done, old_running = new_call(), new_call()
    lease = claim(store, old_done, "w1", config()).lease
    store.finish(lease, Outcome.success(1), config())
    claim(store, old_running, "w1", config())
    time.sleep(0.05)
    cutoff = store.now()
    time.sleep(0.05)
    new_done = new_call()
    lease = claim(store, new_done, "w1", config()).lease
    store.finish(lease, Outcome.success(2), config())

    assert store.purge(cutoff) == 1

    left = records(store)
    assert old_done.call_id not in left and {old_running.call_id, new_done.call_id} <= set(left)
    assert store.result(old_done.call_id) is None and store.events(old_done.call_id) == []
    assert store.result(new_done.call_id) == Outcome.success(2, 1)
    assert store.purge(cutoff) == 0


def test_a_call_handed_on_is_seen_again_then_by_calls_and_purge(store_factory):
    """A retry hands a call on to its next delivery, which makes it wait as a newly
    registered call: every store then shows it as seen at the hand-on, and a purge cutoff
    before that keeps it (Redis kept the first registration's time, and purged it)."""
    store = store_factory()
    call = new_call()
    first = claim(store, call, "w1", config()).lease
    time.sleep(0.05)
    cutoff = store.now()
    time.sleep(0.05)
    store.hand_on(first)
    handed_at = store.now()
    lease = claim(store, call, "w1", config()).lease
    store.finish(lease, Outcome.success(1), config())

    assert cutoff < records(store)[call.call_id].seen_at <= handed_at
    assert store.purge(cutoff) == 0 and store.result(call.call_id) == Outcome.success(1, 2)
    assert store.purge(store.now() + 1) == 1


def test_purge_leaves_nothing_of_a_call_behind(store_factory):
    """Issue 20: the SQL purge deleted events, results, recoveries and calls but not
    ``aaa_checkpoints``, so a purged call id still read its old checkpoint."""
    from aaa_celery.lifecycle import checkpoint_json

    store = store_factory()
    call = new_call()
    lease = claim(store, call, "w1", config()).lease
    assert store.save_checkpoint(lease, checkpoint_json(1, {"page": 3}))
    store.finish(lease, Outcome.success(1), config())
    time.sleep(0.05)

    assert store.purge(store.now()) == 1

    assert store.result(call.call_id) is None and store.events(call.call_id) == []
    assert store.last_checkpoint(call.call_id) is None
    assert call.call_id not in records(store)
    # the id starts afresh: attempt 1, and no checkpoint of the purged call for it to read
    again = claim(store, call, "w2", config()).lease
    assert again.attempt == 1 and store.last_checkpoint(call.call_id) is None


def test_settle_replaces_only_the_expected_result_and_audits(store_factory, lose_lease):
    from aaa_celery.lifecycle import Draft

    store = store_factory()
    call = new_call("pay")
    amo = config(lease_ttl_s=SHORT_TTL_S, delivery=Delivery.AT_MOST_ONCE)
    lose_lease(store, claim(store, call, "w1", amo).lease)
    unknown = store_factory().begin(call, "w2", amo).result
    event = Draft(f"{call.call_id}:reconciled", "aaa.tool.reconciled", call.call_id, 1, {"found": "happened"})
    other = Outcome.failure("ToolError", "not this one", 1)

    assert not store.settle(call.call_id, other, Outcome.success(1, 1), event)
    assert store.settle(call.call_id, unknown, Outcome.success({"v": 1}, 1), event)
    assert not store.settle(call.call_id, unknown, Outcome.success(2, 1), event)
    assert store.result(call.call_id) == Outcome.success({"v": 1}, 1)
    assert [e.data for e in store.events(call.call_id) if e.type == "aaa.tool.reconciled"] == [{"found": "happened"}]
    assert call_state(records(store)[call.call_id]) == "completed"  # not an operator's resolution


def test_settle_compares_the_result_as_recorded_on_every_store(store):
    """lifecycle.same_outcome: settle replaces a result only if it is the very record
    expected, as JSON, the form every store keeps. The memory and SQL stores compared
    Python values, so an expected value ``True`` settled a result of ``1`` (and ``1.0`` one
    of ``1``) where Redis, which compares the stored JSON, refused."""
    from aaa_celery.lifecycle import Draft

    call = new_call("pay")
    lease = claim(store, call, "w1", config()).lease
    store.finish(lease, Outcome.success(1), config())
    event = Draft(f"{call.call_id}:reconciled", "aaa.tool.reconciled", call.call_id, 1, {})
    for lookalike in (Outcome.success(True, 1), Outcome.success(1.0, 1)):
        assert not store.settle(call.call_id, lookalike, Outcome.success(2, 1), event)
    assert store.result(call.call_id) == Outcome.success(1, 1)
    assert store.settle(call.call_id, Outcome.success(1, 1), Outcome.success(2, 1), event)
    assert store.result(call.call_id) == Outcome.success(2, 1)


def test_the_tenant_filter_takes_the_tenant_from_the_call_id_never_from_a_header():
    """Red on 9f140fc: ``stores.ops.tenant_of`` fell back to the ``aaa_tenant`` header a call
    was sent with, so a plain call that names a tenant in a header was listed as that
    tenant's (``aaa calls --tenant acme``), against protocol's rule."""
    forged = CallRecord("plain-1", CallSpec("plain-1", "refund", request={"headers": {"aaa_tenant": "acme"}}), 0.0)
    owned = tenant_call_id("acme", "run_1")
    real = CallRecord(owned, CallSpec(owned, "refund"), 0.0)
    assert not matches(forged, tenant="acme")
    assert matches(real, tenant="acme") and not matches(real, tenant="globex")
