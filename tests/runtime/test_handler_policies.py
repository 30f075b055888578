"""ToolHandler(guards=GuardPolicy(...)) and ToolHandler(result_retry=RetryPolicy(...))."""

from __future__ import annotations

import asyncio
import time

import redis

from aaa_celery import open_store
from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import Engine
from aaa_celery.tools import GuardPolicy, RetryPolicy, ToolHandler, ToolRegistry, tool

from .conftest import call_then_echo


def run_with(handler: ToolHandler, *calls, store=None):
    async def main():
        async with Engine(store=store) as engine:
            LLMHandler(FakeLLMClient(call_then_echo(*calls))).attach(engine)
            handler.attach(engine)
            started = time.monotonic()
            outcome = await asyncio.wait_for(engine.run(ToolLoop(handler.registry), {"task": "go"}), 30)
            return engine, outcome, time.monotonic() - started

    return asyncio.run(main())


@tool
def shout(text: str) -> str:
    """Repeat loudly."""
    return text.upper()


@tool
def wipe() -> str:
    """Delete everything."""
    return "wiped"


def test_guard_policy_denies_a_tool_as_policy_denied_and_oversized_arguments_as_tool_args_errors():
    policy = GuardPolicy(denied_tools=frozenset({"wipe"}), max_args_bytes=64)
    _, outcome, _ = run_with(
        ToolHandler(ToolRegistry([shout, wipe]), guards=policy),
        ("wipe", {}),
        ("shout", {"text": "x" * 200}),
        ("shout", {"text": "ok"}),
    )
    denied, oversized, fine = outcome.value["text"].split(" | ")
    assert denied.startswith("PolicyDenied: wipe: denied by the guard policy's rule 'denied_tools': this tool is denied")
    assert oversized.startswith("ToolArgsError: shout: arguments larger than 64 bytes")
    assert fine == "OK"


def test_guard_policy_truncates_long_text_results_for_the_model():
    _, outcome, _ = run_with(
        ToolHandler(ToolRegistry([shout]), guards=GuardPolicy(max_result_chars=10)), ("shout", {"text": "y" * 50})
    )
    assert outcome.value["text"] == "Y" * 9 + "…"


def test_result_retry_records_the_result_once_after_the_store_comes_back(redis_url):
    # Given a Redis store that the tool itself makes refuse writes for 1.2 s just as it returns
    pauser = redis.Redis.from_url(redis_url)

    @tool
    def pay(order_id: str) -> str:
        """Pay."""
        pauser.execute_command("CLIENT", "PAUSE", 1200, "WRITE")
        return f"paid {order_id}"

    store = open_store(redis_url, socket_timeout=0.25)
    handler = ToolHandler(ToolRegistry([pay]), result_retry=RetryPolicy(max_tries=12, initial_s=0.2, max_s=0.5))

    # When the worker records the result (finish times out while paused)
    engine, outcome, elapsed = run_with(handler, ("pay", {"order_id": "A-1"}), store=store)

    # Then it retried with backoff until the store came back, and recorded one result
    assert outcome.value["text"] == "paid A-1"
    assert elapsed >= 1.0  # the retry path really ran: the first finish could not land
    (key,) = list(pauser.scan_iter("aaa:*:result"))
    task_id = key.decode().split("}:", 1)[1].removesuffix(":result")
    assert task_id.startswith(f"~:{outcome.run_id}:")  # no tenant, this run
    types = [e.type for e in store.events(task_id)]
    assert types == ["aaa.tool.started", "aaa.tool.completed"]
