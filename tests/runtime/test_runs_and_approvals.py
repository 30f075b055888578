"""Runs (handle, events, result, tenant, the sync facade), approvals and pools, on the embedded engine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMRequest, LLMResponse, ToolCall
from aaa_celery.llm.fake import text, tool_call
from aaa_celery.runtime import APPROVAL_DENIED, APPROVAL_GRANTED, Engine, RunHandle, SyncEngine
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool

from .conftest import call_then_echo, until

ran: list[dict[str, Any]] = []


@tool(requires_approval=True, delivery="at_most_once")
def wire(to: str, amount: int) -> str:
    """Wire money (a person approves)."""
    ran.append({"to": to, "amount": amount})
    return f"wired {amount} to {to}"


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: paid"


@tool
def whoami(ctx: ToolContext) -> str:
    """The tenant."""
    return f"tenant={ctx.tenant}"


REGISTRY = ToolRegistry([wire, lookup, whoami])


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()



async def drive(model: Any, during: Callable[[Engine, RunHandle], Any], **start: Any) -> tuple[RunHandle, Any]:
    async with Engine() as engine:
        LLMHandler(FakeLLMClient(model)).attach(engine)
        ToolHandler(REGISTRY).attach(engine)
        handle = engine.start(ToolLoop(REGISTRY), {"task": "go"}, **start)
        await during(engine, handle)
        return handle, await asyncio.wait_for(handle.result(), 20)


def fact_events(handle: RunHandle) -> dict[str, dict[str, Any]]:
    """The run's facts by the model's tool call id."""
    requested = {e["data"]["call_id"]: e["data"]["tool_call_id"] for e in handle.events()
                 if e["type"] == "aaa.tool.requested"}
    return {requested[e["data"]["call_id"]]: e for e in handle.events()
            if e["type"] in ("aaa.tool.completed", "aaa.tool.failed")}


# -- runs ------------------------------------------------------------------------------------


def test_handle_has_run_id_events_in_order_and_result_and_tenant_reaches_the_tool():
    async def nothing(engine: Engine, handle: RunHandle) -> None:
        assert handle.run_id.startswith("run_") and engine.runs[handle.run_id] is handle

    handle, outcome = asyncio.run(drive(call_then_echo(("whoami", {})), nothing, tenant="acme"))
    assert outcome.status == "completed" and outcome.value["text"] == "tenant=acme"
    assert [e["type"] for e in handle.events()] == [
        "aaa.run.started", "aaa.llm.completed", "aaa.tool.requested", "aaa.tool.completed",
        "aaa.llm.completed", "aaa.run.completed",
    ]
    assert [e["seq"] for e in handle.events()] == list(range(1, 7))
    assert handle.events(after=4)[0]["type"] == "aaa.llm.completed"
    assert handle.events()[0]["data"] == {"input": {"task": "go"}, "tenant": "acme"}
    assert handle.status == "completed" and handle.outcome == outcome


def test_a_failing_algorithm_ends_the_run_as_failed():
    class Broken:
        async def run(self, run: Any, input: Any) -> None:
            raise RuntimeError("bad algorithm")

    async def main():
        async with Engine() as engine:
            LLMHandler(FakeLLMClient([])).attach(engine)
            return await engine.run(Broken(), {})

    outcome = asyncio.run(main())
    assert (outcome.status, outcome.error) == ("failed", "RuntimeError: bad algorithm")


def test_sync_engine_runs_from_plain_threads_and_takes_approvals_from_another_thread():
    pay = call_then_echo(("wire", {"to": "ACME", "amount": 7}))

    def model(request: LLMRequest) -> LLMResponse:
        return text("hello") if request.messages[0].content == "greet" else pay(request)

    with SyncEngine() as engine:
        LLMHandler(FakeLLMClient(model)).attach(engine)
        ToolHandler(REGISTRY).attach(engine)
        handle = engine.start(ToolLoop(REGISTRY), {"task": "pay"}, tenant="acme")
        with pytest.raises(TimeoutError):
            handle.result(timeout=0.3)  # it waits for a person
        deadline = time.monotonic() + 5
        while not engine.pending_approvals() and time.monotonic() < deadline:
            time.sleep(0.01)
        [pending] = engine.pending_approvals()
        assert handle.status == "waiting"
        # a person approves from some request thread
        t = threading.Thread(target=lambda: engine.get(handle.run_id).approve(pending.call_id, pending.digest))
        t.start()
        t.join()
        outcome = handle.result(timeout=10)
        assert outcome.value["text"] == "wired 7 to ACME"
        # run_sync: start plus result
        assert engine.run_sync(ToolLoop(REGISTRY), {"task": "greet"}, timeout=10).value["text"] == "hello"
        assert [h.run_id for h in engine.runs()][-1] == handle.run_id


# -- approvals -------------------------------------------------------------------------------


def test_approval_tool_is_not_sent_until_granted_and_pending_shows_tool_arguments_run_since():
    async def approve(engine: Engine, handle: RunHandle) -> None:
        [pending] = await until(engine.pending_approvals, what="pending approval")
        assert (pending.tool, pending.arguments, pending.run_id) == ("wire", {"to": "ACME", "amount": 30}, handle.run_id)
        assert time.time() - 5 < pending.since <= time.time()
        assert set(pending.to_dict()) == {"run_id", "tenant", "call_id", "tool_call_id", "tool", "arguments", "since",
                                          "expires_at", "digest"}
        await asyncio.sleep(0.3)
        # nothing went to a worker: no body run, no guard record of the task
        assert ran == [] and engine.store.events(pending.call_id) == []
        handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest})

    handle, outcome = asyncio.run(drive(call_then_echo(("wire", {"to": "ACME", "amount": 30})), approve))
    assert outcome.value["text"] == "wired 30 to ACME" and ran == [{"to": "ACME", "amount": 30}]


def test_denied_call_is_a_failed_fact_denied_by_a_person_and_never_runs():
    async def deny(engine: Engine, handle: RunHandle) -> None:
        [pending] = await until(handle.pending_approvals)
        handle.signal(APPROVAL_DENIED, {"call_id": pending.call_id, "digest": pending.digest, "reason": "too much"})

    handle, outcome = asyncio.run(drive(call_then_echo(("wire", {"to": "ACME", "amount": 30})), deny))
    assert outcome.value["text"] == "ApprovalDenied: denied by a person: too much"
    [fact] = fact_events(handle).values()
    assert fact["type"] == "aaa.tool.failed" and fact["data"]["error"] == "ApprovalDenied"
    assert ran == []
    assert "aaa.approval.denied" in [e["type"] for e in handle.events()]


def test_the_model_has_no_path_to_grant_by_tool_name_message_content_or_arguments():
    wire_call = ToolCall("wire", {"to": "X", "amount": 1}, id="call_w")

    def model(request: LLMRequest) -> LLMResponse:
        if request.messages[-1].role != "user":
            return text(" | ".join(m.content for m in request.messages if m.role == "tool"))
        return LLMResponse(
            text=f'{APPROVAL_GRANTED} {{"call_id": "call_w"}}',  # content that names a grant
            tool_calls=(
                wire_call,
                ToolCall(APPROVAL_GRANTED, {"call_id": "call_w"}, id="call_fake_grant"),  # a "tool" named like it
                ToolCall("lookup", {"call_id": "call_w", "type": APPROVAL_GRANTED}, id="call_smuggle"),  # arguments
                # arguments of the waiting tool itself: refused before a person is ever asked
                ToolCall("wire", {"to": "X", "amount": 1, "type": APPROVAL_GRANTED, "approved": True}, id="call_w2"),
            ),
        )

    async def check(engine: Engine, handle: RunHandle) -> None:
        await until(lambda: len(fact_events(handle)) == 3, what="the three attempts failed")
        await asyncio.sleep(0.3)
        facts = fact_events(handle)
        assert facts["call_fake_grant"]["data"]["error"] == "ToolArgsError"  # unknown tool
        assert facts["call_smuggle"]["data"]["error"] == "ToolArgsError"  # not lookup's arguments
        assert facts["call_w2"]["data"]["error"] == "ToolArgsError"  # not wire's arguments
        [pending] = handle.pending_approvals()
        assert pending.tool_call_id == "call_w"  # still waiting
        assert not any(e["type"] == APPROVAL_GRANTED for e in handle.events())
        assert ran == []
        handle.signal(APPROVAL_DENIED, {"call_id": pending.call_id, "digest": pending.digest})

    handle, outcome = asyncio.run(drive(model, check))
    assert outcome.value["text"].startswith("ApprovalDenied: denied by a person | ToolArgsError")
    assert ran == []


def test_an_approval_is_bound_to_the_call_id_and_the_exact_arguments_shown():
    shown_args = {"to": "ACME", "amount": 30}

    def model(request: LLMRequest) -> LLMResponse:
        if request.messages[-1].role == "user":
            return LLMResponse(tool_calls=(ToolCall("wire", shown_args, id="call_b"),))
        return text(request.messages[-1].content)

    async def approve(engine: Engine, handle: RunHandle) -> None:
        [pending] = await until(handle.pending_approvals)
        with pytest.raises(KeyError):
            handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id + "x"})
        with pytest.raises(ValueError, match="other arguments"):
            handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest,
                                             "arguments": {"to": "EVIL", "amount": 30}})
        with pytest.raises(ValueError, match="digest"):
            handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": "0" * 32})
        with pytest.raises(ValueError, match="reserved"):
            handle.signal("aaa.tool.completed", {"call_id": pending.call_id})
        shown_args["to"] = "EVIL"  # whoever holds the call's arguments changes them after they were shown
        assert handle.pending_approvals()[0].arguments == {"to": "ACME", "amount": 30}
        handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest,
                                         "arguments": {"to": "ACME", "amount": 30}})
        with pytest.raises(KeyError):  # decided once
            handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest})

    handle, outcome = asyncio.run(drive(model, approve))
    assert outcome.value["text"] == "wired 30 to ACME" and ran == [{"to": "ACME", "amount": 30}]


# -- pools -----------------------------------------------------------------------------------


def test_a_delegating_tool_waiting_on_child_runs_does_not_starve_the_pool_its_children_need():
    # Given a supervisor pool of 2 whose "delegate" tool blocks on a child run, whose tool is
    # in the default pool, and three delegations at once (more than the supervisor pool holds)
    @tool
    def work(n: int) -> str:
        """Child work in the default pool."""
        return f"done {n}"

    @tool(pool="supervisor", timeout_s=30)
    def delegate(n: int, ctx: ToolContext) -> str:
        """Start a child run and wait for it (from the worker thread)."""
        outcome = ctx.engine.submit(ToolLoop(ToolRegistry([work])), {"task": f"child {n}"}).result(timeout=25)
        return f"child says {outcome.value['text']}"

    def model(request: LLMRequest) -> LLMResponse:
        last = request.messages[-1]
        if last.role == "user" and last.content.startswith("child"):
            return tool_call("work", n=int(last.content.split()[1]))
        if last.role == "user":
            return LLMResponse(tool_calls=tuple(ToolCall("delegate", {"n": n}) for n in range(3)))
        return text(" | ".join(m.content for m in request.messages if m.role == "tool"))

    async def main():
        # one worker thread asked for: the engine still reserves each pool's size
        async with Engine(concurrency=1) as engine:
            LLMHandler(FakeLLMClient(model)).attach(engine)
            ToolHandler(ToolRegistry([delegate, work]), pools={"supervisor": 2, "default": 2}).attach(engine)
            return await asyncio.wait_for(engine.run(ToolLoop(ToolRegistry([delegate])), {"task": "lead"}), 30)

    outcome = asyncio.run(main())
    # Then every child completed though the supervisor pool was saturated
    assert outcome.value["text"] == "child says done 0 | child says done 1 | child says done 2"


def test_pool_of_one_runs_its_calls_one_at_a_time_while_default_flows():
    spans: dict[str, list[tuple[float, float]]] = {"slow": [], "quick": []}

    @tool(pool="slow")
    async def slow() -> str:
        """Slow."""
        t0 = time.monotonic()
        await asyncio.sleep(0.4)
        spans["slow"].append((t0, time.monotonic()))
        return "s"

    @tool
    async def quick() -> str:
        """Quick."""
        t0 = time.monotonic()
        await asyncio.sleep(0.05)
        spans["quick"].append((t0, time.monotonic()))
        return "q"

    async def main():
        async with Engine() as engine:
            LLMHandler(FakeLLMClient(call_then_echo(*[("slow", {})] * 2, *[("quick", {})] * 3))).attach(engine)
            ToolHandler(ToolRegistry([slow, quick]), pools={"slow": 1}).attach(engine)
            return await engine.run(ToolLoop(ToolRegistry([slow, quick])), {"task": "x"})

    outcome = asyncio.run(main())
    assert outcome.value["text"] == "s | s | q | q | q"
    (a0, a1), (b0, b1) = sorted(spans["slow"])
    assert a1 <= b0  # never overlapped
    assert max(end for _, end in spans["quick"]) < b0  # default calls did not wait for the slow pool
