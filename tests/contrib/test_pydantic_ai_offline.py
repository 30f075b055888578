"""contrib.pydantic_ai on the embedded default (an in-process worker, the memory store): how each
failure reaches the agent, and an approval decided the way the web pages decide it. The fleet
tests (kill -9, a web process killed) are in test_pydantic_ai.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import (  # noqa: E402
    Agent,
    DeferredToolRequests,
    FunctionToolset,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelRetry,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolFailed,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from aaa_celery.contrib.pydantic_ai import GuardedToolset  # noqa: E402
from aaa_celery.errors import ToolError  # noqa: E402
from aaa_celery.lifecycle import APPROVAL_GRANTED  # noqa: E402
from aaa_celery.policy import Deny  # noqa: E402
from aaa_celery.runtime import Engine  # noqa: E402
from aaa_celery.tools import GuardPolicy  # noqa: E402

tools: FunctionToolset[Any] = FunctionToolset()
runs: dict[str, int] = {}


@tools.tool_plain
def flaky(order_id: str) -> str:
    """Ask the model to retry once (ModelRetry), then answer."""
    runs[order_id] = runs.get(order_id, 0) + 1
    if runs[order_id] == 1:
        raise ModelRetry(f"order {order_id} is locked, try again")
    return f"order {order_id}: ok"


@tools.tool_plain
def gone(order_id: str) -> str:
    """A terminal failure the model reads (ToolFailed)."""
    raise ToolFailed(f"order {order_id} does not exist")


@tools.tool_plain
def crash(order_id: str) -> str:
    """A plain exception: it leaves agent.run, as without the guard."""
    raise RuntimeError(f"the ledger of {order_id} is corrupt")


@tools.tool_plain
def close_account(account: str) -> str:
    """Denied by the guard's policy."""
    raise AssertionError("never sent")


@tools.tool_plain
def wire(to: str, amount: int) -> str:
    """Wire money (a person approves)."""
    runs[f"wire:{to}"] = runs.get(f"wire:{to}", 0) + 1
    return f"wired {amount} to {to}"


@pytest.fixture(scope="module")
def guarded() -> Iterator[GuardedToolset]:
    toolset = GuardedToolset(tools, tenant="acme", policies={"wire": {"requires_approval": True}},
                             guards=GuardPolicy(rules=[Deny(tools="close_account")]))
    yield toolset
    toolset.close()


def returns(messages: list[ModelMessage]) -> list[str]:
    return [str(p.content) if isinstance(p, ToolReturnPart) else p.model_response() for m in messages
            if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart | RetryPromptPart)]


def calling(tool: str, arguments: dict[str, Any], again: int = 0) -> FunctionModel:
    """A model that calls ``tool`` (and ``again`` more times after a retry), then answers with what it read."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) <= 1 + 2 * again:
            return ModelResponse(parts=[ToolCallPart(tool, arguments)])
        return ModelResponse(parts=[TextPart(json.dumps(returns(messages)))])

    return FunctionModel(model)


def both(guarded: GuardedToolset, model: FunctionModel) -> tuple[Any, Any]:
    """The output with the guard, and without it."""
    with_guard = asyncio.run(Agent(model, toolsets=[guarded]).run("go"))
    without = asyncio.run(Agent(model, toolsets=[tools]).run("go"))
    return with_guard.output, without.output


def test_a_body_that_raises_model_retry_gets_the_retry_prompt_as_without_the_guard(guarded):
    runs.clear()
    guarded_out = asyncio.run(Agent(calling("flaky", {"order_id": "F-1"}, again=1), toolsets=[guarded]).run("go"))
    plain_out = asyncio.run(Agent(calling("flaky", {"order_id": "F-2"}, again=1), toolsets=[tools]).run("go"))
    assert json.loads(guarded_out.output) == [s.replace("F-2", "F-1") for s in json.loads(plain_out.output)]
    assert "order F-1 is locked, try again" in json.loads(guarded_out.output)[0]
    assert runs == {"F-1": 2, "F-2": 2}


def test_a_body_that_raises_tool_failed_is_read_by_the_model_as_without_the_guard(guarded):
    with_guard, without = both(guarded, calling("gone", {"order_id": "G-1"}))
    assert with_guard == without and "order G-1 does not exist" in with_guard


def test_a_call_the_policy_denies_is_read_by_the_model_and_never_sent(guarded):
    out = asyncio.run(Agent(calling("close_account", {"account": "acme"}), toolsets=[guarded]).run("go")).output
    [told] = json.loads(out)
    assert told.startswith("PolicyDenied: ") and "close_account" in told


def test_any_other_failure_leaves_agent_run_as_a_tool_error(guarded):
    with pytest.raises(ToolError, match="RuntimeError: the ledger of C-1 is corrupt"):
        asyncio.run(Agent(calling("crash", {"order_id": "C-1"}), toolsets=[guarded]).run("go"))


def test_an_approval_is_decided_through_the_engine_the_web_pages_use(guarded):
    runs.clear()
    agent = Agent(calling("wire", {"to": "ACME", "amount": 5}), toolsets=[guarded],
                  output_type=[str, DeferredToolRequests])
    paused = asyncio.run(agent.run("go", conversation_id="conv-pages"))
    assert isinstance(paused.output, DeferredToolRequests) and runs == {}

    async def decide_as_the_pages_do() -> None:
        engine = Engine(app=guarded.app)  # what the Flask and Django pages hold, on the same store
        [pending] = engine.pending_approvals(tenant="acme")
        assert (pending.run_id, pending.tool, pending.arguments) == ("conv-pages", "wire", {"to": "ACME", "amount": 5})
        engine.get("conv-pages", tenant="acme").signal(APPROVAL_GRANTED, {"call_id": pending.call_id,
                                                                         "digest": pending.digest})

    asyncio.run(decide_as_the_pages_do())
    decisions = asyncio.run(guarded.decisions(paused.output))
    done = asyncio.run(agent.run(message_history=paused.all_messages(), deferred_tool_results=decisions))
    assert json.loads(done.output) == ["wired 5 to ACME"] and runs == {"wire:ACME": 1}
    assert guarded.pending("conv-pages", tenant="acme") == []
