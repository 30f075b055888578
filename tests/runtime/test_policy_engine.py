"""GuardPolicy's rules on the embedded engine: a refused call is a PolicyDenied fact naming
the rule, and no attempt is taken (issue 12, item 8)."""

from __future__ import annotations

import asyncio

from aaa_celery.algos import ToolLoop
from aaa_celery.lifecycle import STARTED
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.policy import Budget, Deny, Where
from aaa_celery.runtime import Engine
from aaa_celery.tools import GuardPolicy, ToolHandler, ToolRegistry, tool

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
