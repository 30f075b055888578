"""The metrics' store wrapper hands every verb of the store interfaces to the store it wraps
(each written out) and times it; renewals and heartbeat lag are measured on leases."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry  # noqa: E402

from aaa_celery.config import GuardConfig  # noqa: E402
from aaa_celery.lifecycle import CallSpec, Outcome  # noqa: E402
from aaa_celery.stores.base import Store  # noqa: E402
from aaa_celery.stores.memory import MemoryStore  # noqa: E402
from aaa_celery.worker.metrics import MeteredStore, Metrics  # noqa: E402


def sample(registry, metric, **labels):
    return registry.get_sample_value(metric, labels) or 0.0


def test_every_store_verb_reaches_the_wrapped_store_and_is_timed():
    registry = CollectorRegistry()
    inner = MemoryStore()
    store = MeteredStore(inner, Metrics(registry), "w1@host")
    verbs = {n for n, m in vars(Store).items() if callable(m) and not n.startswith("_")}
    assert verbs <= {n for n in dir(MeteredStore)}
    assert not MeteredStore.__abstractmethods__

    cfg = GuardConfig(lease_ttl_s=10)
    lease = store.begin(CallSpec("c1", "t"), "w1", cfg).lease
    assert store.renew(lease)
    store.finish(lease, Outcome.success(1), cfg)
    assert store.result("c1") == inner.result("c1") == Outcome.success(1, 1)
    assert [r.call_id for r in store.calls()] == ["c1"]
    assert store.spend("budget", "t1", 5, 10, 60) == inner.spend("budget", "t2", 5, 10, 60) is True
    assert not store.spend("budget", "t3", 5, 10, 60)  # the wrapped store's budget is spent
    for op in ("begin", "renew", "finish", "result", "spend"):
        assert sample(registry, "aaa_store_latency_seconds_count", op=op, store="memory", hostname="w1@host") >= 1
    assert sample(registry, "aaa_heartbeat_lag_seconds_count", hostname="w1@host") == 1
    assert sample(registry, "aaa_lease_renew_failures_total", hostname="w1@host") == 0
    # A renewal in flight while its call finishes (the heartbeat goes on through finish) finds
    # the lease gone; the guard ignores it, and so does the failure count (CI at a406993 counted
    # one in a healthy fleet under load).
    assert not store.renew(lease)
    assert sample(registry, "aaa_lease_renew_failures_total", hostname="w1@host") == 0


def test_the_wrapper_writes_out_every_verb_of_every_store_interface():
    """MeteredStore times each verb it writes out; one it only inherits (an interface's default
    raising NotImplementedError) would never reach the wrapped store."""
    import inspect

    verbs = {n for cls in Store.__mro__ for n, m in vars(cls).items()
             if inspect.isfunction(m) and not n.startswith("_")}
    missing = verbs - set(vars(MeteredStore))
    assert not missing, f"MeteredStore does not write out {sorted(missing)}"


def test_a_renewal_that_finds_its_lease_taken_over_counts_as_a_failure():
    registry = CollectorRegistry()
    now = [1000.0]
    store = MeteredStore(MemoryStore(clock=lambda: now[0]), Metrics(registry), "w1@host")
    cfg = GuardConfig(lease_ttl_s=10)
    lease = store.begin(CallSpec("c1", "t"), "w1", cfg).lease
    now[0] += 11  # the holder stalled past its TTL; another worker takes the call over
    assert store.begin(CallSpec("c1", "t"), "w2", cfg).lease.attempt == 2
    assert not store.renew(lease)
    assert sample(registry, "aaa_lease_renew_failures_total", hostname="w1@host") == 1


def test_only_a_reconcile_that_settles_the_call_counts_as_reconciled():
    from types import SimpleNamespace

    from aaa_celery.worker.metrics import RECONCILED, Observer

    registry = CollectorRegistry()
    task = SimpleNamespace(name="pay", request=SimpleNamespace(id="c1", hostname="w1@h",
                                                               delivery_info={"routing_key": "aaa.default"}))
    observe = Observer(Metrics(registry), task)
    observe(RECONCILED, 1, {"ok": True, "error": None})
    observe(RECONCILED, 1, {"ok": False, "error": "EffectNotApplied"})
    observe(RECONCILED, 1, {"ok": False, "error": "OutcomeUnknown"})
    labels = {"name": "pay", "hostname": "w1@h", "queue_name": "aaa.default"}
    assert sample(registry, "aaa_task_reconciled_total", **labels) == 2


def test_the_run_records_reach_the_wrapped_store_too():
    """Reproduces on 9aa0fd4: the run-record verbs (inherited from stores/runs.py) raised
    NotImplementedError on a metered store, and an engine on it kept no run state."""
    from aaa_celery.runtime.runstate import keeps_runs
    from aaa_celery.stores.runs import RunRecord

    inner = MemoryStore()
    store = MeteredStore(inner, Metrics(CollectorRegistry()), "w1@host")
    assert keeps_runs(store)
    store.put_run(RunRecord("r1", "acme", "ToolLoop", {}, "running", 1.0, 1.0))
    assert store.lease_run(RunRecord("r1", "acme").key, "w1", 30)
    assert inner.get_run(RunRecord("r1", "acme").key).holder == "w1"


def test_concurrency_slots_reach_the_wrapped_store_and_waits_and_skips_are_counted():
    """Issue 40: the slot verbs are timed and reach the store; a skipped call and a delivery
    sent back to wait count per task (no key, no call id is a label)."""
    from types import SimpleNamespace

    from aaa_celery.worker import metrics
    from aaa_celery.worker.metrics import FAILED, Observer

    registry = CollectorRegistry()
    inner = MemoryStore()
    store = MeteredStore(inner, Metrics(registry), "w1@host")
    assert store.take_slot("k", "c1", 1, 30).reply == "taken" and inner.slot_holders("k") == ["c1"]
    assert store.take_slot("k", "c2", 1, 30).reply == "full" and store.slot_holders("k") == ["c1"]
    store.free_slot("k", "c1")
    assert inner.slot_holders("k") == []
    for op in ("take_slot", "free_slot", "slot_holders"):
        assert sample(registry, "aaa_store_latency_seconds_count", op=op, store="memory", hostname="w1@host") >= 1

    task = SimpleNamespace(name="sync", request=SimpleNamespace(id="c2", hostname="w1@h",
                                                                delivery_info={"routing_key": "aaa.default"}))
    labels = {"name": "sync", "hostname": "w1@h", "queue_name": "aaa.default"}
    observe = Observer(Metrics(registry := CollectorRegistry()), task)
    observe(FAILED, 0, {"error": "CallSkipped", "message": "...", "slot": "unique"})
    observe(FAILED, 1, {"error": "ToolError", "message": "..."})
    assert sample(registry, "aaa_task_slot_skips_total", **labels) == 1
    saved, metrics._metrics = metrics._metrics, observe.metrics
    try:
        metrics.slot_wait(task)
    finally:
        metrics._metrics = saved
    assert sample(registry, "aaa_task_slot_waits_total", **labels) == 1


def test_slots_held_per_key_are_a_gauge_of_bounded_cardinality():
    """Issue 40, item 4: ``aaa_slots_held`` counts the slots this process's calls hold, per
    concurrency key (the store's digest, never an argument value); a slot lost at a renewal
    or freed leaves it, and past SLOT_KEY_LABELS keys the rest count under key="other"."""
    import time

    from aaa_celery.lifecycle import SLOT_GRACE_S
    from aaa_celery.worker.metrics import SLOT_KEY_LABELS

    registry = CollectorRegistry()
    inner = MemoryStore()
    store = MeteredStore(inner, Metrics(registry), "w1@host")

    def held(key):
        return sample(registry, "aaa_slots_held", key=key, hostname="w1@host")

    store.take_slot("k1", "c1", 2, 30)
    store.take_slot("k1", "c2", 2, 30)
    store.take_slot("k1", "c3", 2, 30)           # full: not held
    store.take_slot("k1", "c1", 2, 30)           # a renewal: still one slot
    assert held("k1") == 2
    store.free_slot("k1", "c2")
    assert held("k1") == 1
    inner.free_slot("k1", "c1")                  # c1's slot lapsed, and two other calls took the key
    inner.take_slot("k1", "x1", 2, 30)
    inner.take_slot("k1", "x2", 2, 30)
    assert store.take_slot("k1", "c1", 2, 30).reply == "full"  # c1's renewal finds its slot gone
    assert held("k1") == 0

    for i in range(SLOT_KEY_LABELS + 5):         # k1 has a label already
        store.take_slot(f"many-{i}", "c9", 1, 30)
    assert held("many-0") == held(f"many-{SLOT_KEY_LABELS - 2}") == 1
    assert held(f"many-{SLOT_KEY_LABELS - 1}") == 0 and held("other") == 6
    store.free_slot(f"many-{SLOT_KEY_LABELS}", "c9")
    assert held("other") == 5

    # a call that lost its lease renews no slot: it leaves the gauge once its slot would lapse
    store = MeteredStore(MemoryStore(), Metrics(registry := CollectorRegistry()), "w1@host")
    store.take_slot("brief", "c8", 1, 0.05)
    assert held("brief") == 1
    time.sleep(0.05 + SLOT_GRACE_S + 0.2)
    store.take_slot("k1", "c7", 3, 30)
    assert held("brief") == 0 and held("k1") == 1
