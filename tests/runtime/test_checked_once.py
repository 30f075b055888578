"""A tool call's arguments are checked once on each side of the broker: once by the engine
(the requested event, the approval and the send use that one check), once by the worker
(the policy's rules, the idempotency key function and the body share it)."""

from __future__ import annotations

from typing import Any

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.policy import Where
from aaa_celery.runtime import SyncEngine
from aaa_celery.tools import GuardPolicy, ToolHandler, ToolRegistry, tool
from aaa_celery.tools import args


@tool(idempotency_key=lambda a: f"refund:{a['order_id']}")
def refund(order_id: int, amount: float = 1.0) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def model(request: Any) -> LLMResponse:
    if request.messages[-1].role == "user":
        return LLMResponse(tool_calls=(ToolCall("refund", {"order_id": "0100", "amount": 5}),))
    return text(" | ".join(m.content for m in request.messages if m.role == "tool"))


def test_one_engine_call_with_a_key_function_and_a_policy_checks_its_arguments_twice(monkeypatch):
    """Red on aee379f: 5 checks, each a pydantic validation (the engine's; the call's
    registration at publish time, for its key; the worker's policy rules, key function and
    body: the body's own, with secrets not in clear, missed the others). On c79799f: 7."""
    checks: list[str] = []
    real = args.check

    def counted(name: str, *rest: Any) -> Any:
        checks.append(name)
        return real(name, *rest)

    monkeypatch.setattr(args, "check", counted)
    policy = GuardPolicy(rules=[Where(tools="refund", check="amount <= 100")])
    sync = SyncEngine()
    try:
        LLMHandler(FakeLLMClient(model)).attach(sync)
        ToolHandler(ToolRegistry([refund]), guards=policy).attach(sync)
        outcome = sync.run_sync(ToolLoop(ToolRegistry([refund])), {"task": "go"}, timeout=60)
    finally:
        sync.close()
    assert outcome.status == "completed" and "refunded 100" in outcome.value["text"], outcome
    assert checks == ["refund", "refund"]  # the engine's, then the worker's
