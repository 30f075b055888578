"""GuardPolicy's rules on the embedded engine: a refused call is a PolicyDenied fact naming
the rule, and no attempt is taken (issue 12, item 8)."""

from __future__ import annotations

import asyncio

import pytest
from celery import Celery
from celery.exceptions import Reject

from aaa_celery import PolicyDenied, StoreUnavailable
from aaa_celery.algos import ToolLoop
from aaa_celery.lifecycle import FAILED, STARTED
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.policy import Budget, Deny, Where
from aaa_celery.runtime import Engine
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.tools import GuardPolicy, ToolHandler, ToolRegistry, tool
from aaa_celery.tools.handler import use_store

RAN: list[tuple[str, int]] = []


@tool
def refund(customer_id: str, amount: int) -> str:
    """Refund a customer."""
    RAN.append((customer_id, amount))
    return f"refunded {amount}"


POLICY = GuardPolicy(rules=[
    Deny(tools="refund", tenants="trial-*", name="no refunds on trial"),
    Where(tools="refund", check="amount <= 500"),
    Budget(tools="refund", amount="amount", limit=5, by="customer_id", name="refunds per customer and day"),
])


def run(tenant, *calls):
    from .conftest import call_then_echo

    async def main():
        async with Engine() as engine:
            LLMHandler(FakeLLMClient(call_then_echo(*calls))).attach(engine)
            ToolHandler(ToolRegistry([refund]), guards=POLICY).attach(engine)
            handle = engine.start(ToolLoop(ToolRegistry([refund])), {"task": "go"}, tenant=tenant)
            await asyncio.wait_for(handle.result(), 30)
            facts = [e["data"] for e in handle.events() if e["type"] in ("aaa.tool.completed", "aaa.tool.failed")]
            trails = {f["call_id"]: (engine.store.result(f["call_id"]), engine.store.events(f["call_id"]))
                      for f in facts}
            return facts, trails

    return asyncio.run(main())


def test_access_and_argument_rules_refuse_before_anything_is_stored_or_sent():
    RAN.clear()
    facts, trails = run("trial-42", ("refund", {"customer_id": "K-1", "amount": 1}))
    assert facts[0]["error"] == "PolicyDenied" and "'no refunds on trial'" in facts[0]["message"]
    facts2, trails2 = run("acme", ("refund", {"customer_id": "K-1", "amount": "0600"}))
    assert facts2[0]["error"] == "PolicyDenied"
    # judged on the validated arguments: "0600" is 600
    assert "Where(refund: amount <= 500)" in facts2[0]["message"] and "amount=600" in facts2[0]["message"]
    assert RAN == []
    for result, events in (*trails.values(), *trails2.values()):
        assert result is None and events == []  # nothing stored: the call was never sent


def test_a_budget_refuses_in_the_worker_without_taking_an_attempt():
    RAN.clear()
    facts, trails = run("acme", ("refund", {"customer_id": "K-1", "amount": 3}),
                        ("refund", {"customer_id": "K-1", "amount": 3}),
                        ("refund", {"customer_id": "K-2", "amount": 5}))
    assert sorted(RAN) in ([("K-1", 3), ("K-2", 5)],)
    denied = [f for f in facts if f.get("error")]
    assert len(denied) == 1 and denied[0]["error"] == "PolicyDenied"
    assert "'refunds per customer and day'" in denied[0]["message"] and "customer_id='K-1'" in denied[0]["message"]
    result, events = trails[denied[0]["call_id"]]
    assert result.error == "PolicyDenied" and result.attempt == 0
    assert not [e for e in events if e.type == STARTED]


class UnreachableBudgets(MemoryStore):
    """A memory store whose budgets cannot be reached (what a Redis outage looks like)."""

    def spend(self, *args, **kwargs):
        raise StoreUnavailable("budgets unreachable")


def bound_refund(store):
    app = Celery("policy-unit", broker="memory://", backend="cache+memory://")
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                    worker_prefetch_multiplier=1, aaa_store_url="memory://")
    ToolHandler(ToolRegistry([refund]), guards=POLICY).bind(app)
    use_store(app, store)
    return app.tasks["aaa.tool.refund"]


def deliver(task, call_id, arguments):
    """Run one delivery of the call in this thread, as a worker's pool would."""
    task.push_request(id=call_id, called_directly=False, hostname="unit", delivery_info={})
    try:
        return task(arguments=arguments)
    finally:
        task.pop_request()


def test_a_store_that_cannot_count_the_budget_hands_the_message_back_and_nothing_runs():
    RAN.clear()
    task = bound_refund(UnreachableBudgets())
    with pytest.raises(Reject) as err:
        deliver(task, "call-1", {"customer_id": "K-1", "amount": 1})
    assert err.value.requeue and RAN == []


def test_a_redelivered_finished_call_is_answered_and_counts_nothing_more():
    RAN.clear()
    store = MemoryStore()
    task = bound_refund(store)
    assert deliver(task, "call-1", {"customer_id": "K-1", "amount": 5}) == "refunded 5"
    # the budget is spent; the same call delivered again is answered from the store
    assert deliver(task, "call-1", {"customer_id": "K-1", "amount": 5}) == "refunded 5"
    assert RAN == [("K-1", 5)]
    with pytest.raises(PolicyDenied, match="refunds per customer and day"):
        deliver(task, "call-2", {"customer_id": "K-1", "amount": 1})
    assert store.result("call-2").error == "PolicyDenied"
    assert [(e.type, e.attempt, e.data["name"]) for e in store.events("call-2")] == [(FAILED, 0, "refund")]
