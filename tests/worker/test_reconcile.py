"""Reconciliation on a real fleet, at_most_once: the holder of a call is kill -9ed after its
effect. With a reconcile step that finds the effect, the caller gets the value and the body
ran once; with one that cannot tell, the caller gets OutcomeUnknown (today's answer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aaa_celery.errors import OutcomeUnknown
from aaa_celery.guard.reconcile import RECONCILED
from aaa_celery.lifecycle import STARTED
from aaa_celery.stores import open_store
from aaa_celery.testing import Ledger, wait_for
from aaa_celery.testing.fleet import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.fleet]
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.worker.reconcile_app"


@pytest.fixture
def fleet(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("AAA_FLEET_BROKER", redis_url)
    import importlib

    from . import reconcile_app

    client = importlib.reload(reconcile_app).app
    workers = [WorkerProcess(APP, hostname=f"r{n}@reconcile", env={"AAA_FLEET_BROKER": redis_url}, cwd=ROOT,
                             workdir=tmp_path / f"w{n}") for n in range(2)]
    ledger, store = Ledger(redis_url), open_store(redis_url)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_ready(60)
        yield client, workers, ledger, store
    finally:
        for w in workers:
            w.stop()
        store.close()


def kill_holder_after_effect(workers, ledger, call_id):
    effect = wait_for(lambda: ledger.entries(call_id, "effect"), 30, "the effect")[0]
    holder = next(w for w in workers if effect["pid"] in w.children() or effect["pid"] == w.pid)
    holder.kill()
    return holder


def reconciled(store, call_id):
    return [e.data for e in store.events(call_id) if e.type == RECONCILED]


def test_a_reconcile_that_finds_the_effect_gives_the_caller_its_value(fleet):
    client, workers, ledger, store = fleet
    result = client.tasks["rec.pay_found"].delay(30)
    kill_holder_after_effect(workers, ledger, result.id)
    assert result.get(timeout=40) == {"paid": 30, "reconciled": True}
    assert len(ledger.entries(result.id, "start")) == 1  # the body ran once
    assert [e.type for e in store.events(result.id)].count(STARTED) == 1
    assert store.result(result.id).ok and store.result(result.id).value == {"paid": 30, "reconciled": True}
    assert reconciled(store, result.id)[0]["found"] == "happened"


def test_a_reconcile_that_cannot_tell_leaves_outcome_unknown(fleet):
    client, workers, ledger, store = fleet
    result = client.tasks["rec.pay_unknown"].delay(40)
    kill_holder_after_effect(workers, ledger, result.id)
    with pytest.raises(OutcomeUnknown):
        result.get(timeout=40)
    assert len(ledger.entries(result.id, "start")) == 1
    assert store.result(result.id).error == "OutcomeUnknown"
    assert reconciled(store, result.id)[0]["found"] == "unknown"


def test_a_tool_with_reconcile_settles_through_the_bound_task(fleet):
    client, workers, ledger, store = fleet
    result = client.tasks["aaa.tool.refund"].delay(arguments={"amount": 5})
    kill_holder_after_effect(workers, ledger, result.id)
    assert result.get(timeout=40) == {"paid": 5, "reconciled": True}
    assert len(ledger.entries(result.id, "start")) == 1
