"""A value budget holds under concurrency on a real fleet (issue 12, item 8): 20 concurrent
refunds against a budget of 5, on two prefork workers, with the Redis store."""

from __future__ import annotations

import uuid

import pytest

from aaa_celery import PolicyDenied, open_store
from aaa_celery.lifecycle import STARTED
from aaa_celery.testing import Fleet, Ledger

from .conftest import ROOT
from .trust_app import make_app

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_twenty_concurrent_refunds_against_a_budget_of_five_run_exactly_five(redis_url, tmp_path):
    env = {"AAA_TRUST_BROKER": redis_url, "AAA_TRUST_BUDGET": "5"}
    client, store, ledger = make_app(env), open_store(redis_url), Ledger(redis_url)
    with Fleet("tests.worker.trust_app", size=2, pool="prefork", concurrency=3, env=env, cwd=ROOT,
               workdir=tmp_path, prefix=f"budget-{uuid.uuid4().hex[:4]}-") as fleet:
        refund = client.tasks["aaa.tool.refund"]
        sent = [refund.apply_async(kwargs={"arguments": {"customer_id": "K-1", "amount": 1}}) for _ in range(20)]
        done, denied = [], []
        for result in sent:
            try:
                done.append(result.get(timeout=60))
            except PolicyDenied as e:
                denied.append((result.id, str(e)))
        # another customer's budget is its own
        other = refund.apply_async(kwargs={"arguments": {"customer_id": "K-2", "amount": 5}})
        assert other.get(timeout=60) == "refunded 5 to K-2"
        # a message sent around ToolTask.apply_async (send_task) is judged by the worker
        around = client.send_task("aaa.tool.refund", kwargs={"arguments": {"customer_id": "K-3", "amount": 600}},
                                  queue="aaa.default")
        with pytest.raises(PolicyDenied, match=r"Where\(refund: amount <= 500\)"):
            around.get(timeout=60)
        assert all(w.alive for w in fleet)
    assert not [e for e in store.events(around.id) if e.type == STARTED]
    runs = [e for e in ledger.entries() if e.get("event") == "start" and e.get("customer_id") == "K-1"]
    assert len(done) == 5 and len(runs) == 5, (done, runs)
    assert len(denied) == 15
    for call_id, message in denied:
        assert "'refunds per customer and day'" in message and "would exceed the budget of 5" in message
        outcome = store.result(call_id)
        assert outcome.error == "PolicyDenied" and outcome.attempt == 0
        assert not [e for e in store.events(call_id) if e.type == STARTED]  # no attempt was taken
    store.close()
    ledger.close()
