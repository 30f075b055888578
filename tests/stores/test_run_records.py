"""Run records (aaa_celery/stores/runs.py) on every backend: the part of the store
interface that keeps agent runs (record, events, model turns, approval decisions,
run lease), so that any process can list, read, decide and resume them."""

from __future__ import annotations

import time
import uuid

from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.runs import RunRecord


def new_run(tenant: str | None = "acme", started_at: float | None = None, status: str = "running",
            **kw) -> RunRecord:
    now = time.time() if started_at is None else started_at
    return RunRecord(f"run-{uuid.uuid4().hex[:10]}", tenant, "ToolLoop", {"task": "refund A-100"}, status,
                     now, now, **kw)


def event(seq: int, type: str = "aaa.tool.requested") -> dict:
    return {"seq": seq, "type": type, "run_id": "r", "data": {"n": seq}, "at": 1.0}


def test_a_run_record_round_trips_through_another_store_instance(store_factory):
    a, b = store_factory(), store_factory()
    run = new_run(approvals={"c1": {"state": "open", "digest": "d" * 64, "arguments": {"amount": 30}}})
    a.put_run(run)
    got = b.get_run(run.key)
    assert got is not None
    assert (got.run_id, got.tenant, got.algo, got.input, got.status) == (
        run.run_id, "acme", "ToolLoop", {"task": "refund A-100"}, "running")
    assert got.approvals == run.approvals and got.events == 0 and got.holder is None
    run.status, run.outcome = "completed", {"status": "completed", "value": {"text": "ok"}, "error": None}
    a.put_run(run)
    assert b.get_run(run.key).outcome["value"] == {"text": "ok"}
    assert b.get_run("acme:run-unknown") is None


def test_runs_are_listed_per_tenant_newest_first_a_page_at_a_time(store_factory):
    store = store_factory()
    base = time.time()
    acme = [new_run("acme", base + n) for n in range(7)]
    other = [new_run("other", base + n + 0.5) for n in range(3)]
    untenanted = new_run(None, base)
    for run in [*acme, *other, untenanted]:
        store.put_run(run)
    want = [r.run_id for r in reversed(acme)]
    first = store.list_runs(tenant="acme", limit=3)
    assert [r.run_id for r in first] == want[:3]
    second = store.list_runs(tenant="acme", limit=3, before=first[-1].cursor)
    third = store.list_runs(tenant="acme", limit=3, before=second[-1].cursor)
    assert [r.run_id for r in second + third] == want[3:]
    assert [r.run_id for r in store.list_runs(tenant=None)] == [untenanted.run_id]
    assert {r.run_id for r in store.list_runs(all_tenants=True, limit=100)} == {
        r.run_id for r in [*acme, *other, untenanted]}
    done = acme[2]
    done.status = "completed"
    store.put_run(done)
    active = store.list_runs(tenant="acme", active=True, limit=100)
    assert done.run_id not in {r.run_id for r in active} and len(active) == 6


def test_events_append_in_order_once_and_read_from_a_cursor(store_factory):
    a, b = store_factory(), store_factory()
    run = new_run()
    a.put_run(run)
    a.append_run_events(run.key, [event(1), event(2)])
    a.append_run_events(run.key, [event(2), event(3)])  # a retried append: 2 is not written twice
    a.append_run_events(run.key, [event(5)])  # a gap: not the next one, not written
    assert [e["seq"] for e in b.run_events(run.key)] == [1, 2, 3]
    assert [e["seq"] for e in b.run_events(run.key, after=1)] == [2, 3]
    assert [e["seq"] for e in b.run_events(run.key, after=1, limit=1)] == [2]
    assert b.run_events(run.key, after=3) == []
    assert b.run_events(run.key)[0]["data"] == {"n": 1}
    assert b.get_run(run.key).events == 3


def test_a_model_turn_is_recorded_once_first_writer_wins(store_factory):
    a, b = store_factory(), store_factory()
    run = new_run()
    a.put_run(run)
    assert a.recorded_turn(run.key, 0) is None
    first = {"text": "", "tool_calls": [{"name": "refund", "arguments": {"amount": 30}, "id": "m1"}]}
    assert a.record_turn(run.key, 0, first) == first
    assert b.record_turn(run.key, 0, {"text": "other"}) == first
    assert b.recorded_turn(run.key, 0) == first and b.recorded_turn(run.key, 1) is None


def test_an_approval_is_decided_once_by_whichever_process_gets_there_first(store_factory):
    a, b = store_factory(), store_factory()
    run = new_run()
    a.put_run(run)
    call, digest = "acme:r:0.0.0123456789abcdef", "d" * 64
    assert a.approval_decision(run.key, call, digest) is None
    assert b.decide_approval(run.key, call, digest, {"granted": True, "reason": ""}) is True
    assert a.decide_approval(run.key, call, digest, {"granted": False, "reason": "no"}) is False
    assert a.approval_decision(run.key, call, digest) == {"granted": True, "reason": ""}
    assert a.approval_decision(run.key, call, "e" * 64) is None  # another request of the same call
    assert a.decide_approval("acme:run-unknown", call, digest, {"granted": True}) is False


def test_the_run_lease_is_held_by_one_driver_until_it_lapses_or_is_released(store_factory):
    a, b = store_factory(), store_factory()
    run = new_run()
    a.put_run(run)
    assert a.lease_run(run.key, "web-a", 30.0)
    assert not b.lease_run(run.key, "web-b", 30.0)
    assert a.lease_run(run.key, "web-a", 0.3)  # a renewal (here shorter)
    assert b.get_run(run.key).holder == "web-a"
    time.sleep(0.6)
    assert b.get_run(run.key).holder is None and b.get_run(run.key).orphaned
    assert b.lease_run(run.key, "web-b", 30.0)  # the lease lapsed: B takes the run over
    assert not a.lease_run(run.key, "web-a", 30.0)  # and A's heartbeat learns it lost it
    a.release_run(run.key, "web-a")  # not A's: nothing happens
    assert a.get_run(run.key).holder == "web-b"
    b.release_run(run.key, "web-b")
    assert a.get_run(run.key).holder is None
    assert not a.lease_run("acme:run-unknown", "web-a", 30.0)


def test_forget_and_purge_remove_runs_but_keep_the_ones_still_going(store_factory):
    store = store_factory()
    old = time.time() - 1000
    finished = [new_run(status="completed", started_at=old) for _ in range(3)]
    going = new_run(started_at=old)
    for run in [*finished, going]:
        store.put_run(run)
        store.append_run_events(run.key, [event(1)])
        store.record_turn(run.key, 0, {"text": "x"})
    store.forget_run(finished[0].key)
    assert store.get_run(finished[0].key) is None and store.run_events(finished[0].key) == []
    assert store.purge_runs(time.time() - 500) == 2
    assert [r.run_id for r in store.list_runs(tenant="acme", limit=100)] == [going.run_id]
    assert store.recorded_turn(finished[1].key, 0) is None
    assert store.get_run(going.key).events == 1


def test_the_memory_store_keeps_at_most_run_retention_finished_runs():
    store = MemoryStore(run_retention=5)
    going = new_run()
    store.put_run(going)
    for _ in range(50):
        store.put_run(new_run(status="completed"))
    assert len(store.list_runs(tenant="acme", limit=100)) == 6
    assert store.get_run(going.key) is not None


def test_two_tenants_runs_of_one_run_id_are_two_runs_found_by_id_alone(store_factory):
    store = store_factory()
    acme, globex = new_run("acme"), new_run("globex")
    globex.run_id = acme.run_id
    for run in (acme, globex):
        store.put_run(run)
        store.append_run_events(run.key, [event(1)])
    acme.status = "completed"
    store.put_run(acme)
    assert acme.key != globex.key
    assert store.get_run(acme.key).tenant == "acme" and store.get_run(globex.key).tenant == "globex"
    assert {r.tenant for r in store.find_runs(acme.run_id)} == {"acme", "globex"}
    assert [r.tenant for r in store.list_runs(tenant="globex")] == ["globex"]
    store.forget_run(acme.key)
    assert [r.tenant for r in store.find_runs(acme.run_id)] == ["globex"]
    assert store.find_runs("run-nobody") == []


def test_a_long_listing_pages_through_every_run(store_factory, backend, store_url):
    """Past one index page of a shard (Redis reads 200 entries a round trip; one shard here)."""
    from aaa_celery.stores import open_store

    store = open_store(store_url, shards=1) if backend.startswith("redis") else store_factory()
    try:
        base = time.time()
        runs = [new_run("bulk", base + n / 1000) for n in range(450)]
        for run in runs:
            store.put_run(run)
        seen, before = [], None
        while page := store.list_runs(tenant="bulk", limit=300, before=before):
            seen += [r.run_id for r in page]
            before = page[-1].cursor
        assert seen == [r.run_id for r in reversed(runs)]
    finally:
        if backend.startswith("redis"):
            store.close()


def test_writes_to_an_unknown_run_leave_nothing(store_factory):
    """Issue 20: the differential test found the memory store dropping the turns and events
    of a run it has no record of (never put, or forgotten) while the SQL stores kept them
    (Redis kept the turns): a forgotten run's late writer left rows nobody reads or purges."""
    store = store_factory()
    key = new_run().key  # never put
    assert store.record_turn(key, 1, {"text": "a"}) == {"text": "a"}
    store.append_run_events(key, [event(1)])
    assert not store.decide_approval(key, "c1", "d" * 64, {"granted": True})
    assert store.recorded_turn(key, 1) is None
    assert store.run_events(key) == []
    assert store.approval_decision(key, "c1", "d" * 64) is None
    run = new_run()
    store.put_run(run)
    store.forget_run(run.key)  # forgotten: the same
    assert store.record_turn(run.key, 1, {"text": "b"}) == {"text": "b"}
    store.append_run_events(run.key, [event(1)])
    assert store.recorded_turn(run.key, 1) is None and store.run_events(run.key) == []
