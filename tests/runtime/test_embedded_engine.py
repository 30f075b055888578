"""The embedded engine: tools run as guarded Celery tasks on an in-process worker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from celery import current_task

from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ConfigError, ToolError
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import Engine
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool

from .conftest import call_then_echo

ROOT = Path(__file__).resolve().parents[2]


def test_the_spec_example_prints_its_three_lines():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "refund.py")], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "refund  -> at_most_once | max_attempts = 3",
        "search  -> at_least_once | max_attempts = 3",
        "refunded A-100 (key=refund:A-100, attempt=1, fence=1)",
    ]


def requested_ids(handle) -> list[str]:
    """The engine's call ids of the run's calls, in the order requested."""
    return [e["data"]["call_id"] for e in handle.events() if e["type"] == "aaa.tool.requested"]


async def _run(registry: ToolRegistry, *calls, handler: ToolHandler | None = None, engine_kwargs=None):
    async with Engine(**(engine_kwargs or {})) as engine:
        LLMHandler(FakeLLMClient(call_then_echo(*calls))).attach(engine)
        (handler or ToolHandler(registry)).attach(engine)
        handle = engine.start(ToolLoop(registry), {"task": "go"})
        outcome = await handle.result()
        return engine, handle, outcome


def test_tool_body_runs_inside_a_celery_worker_task_with_the_guard_in_force():
    seen = {}

    @tool
    def where(ctx: ToolContext) -> str:
        """Report where the body runs."""
        seen["task_id"] = current_task.request.id
        seen["queue"] = current_task.request.delivery_info["routing_key"]
        seen["thread"] = threading.current_thread().name
        seen["events_before_body"] = [e.type for e in ctx.engine.store.events(current_task.request.id)]
        seen["ctx"] = ctx
        return "here"

    engine, handle, outcome = asyncio.run(_run(ToolRegistry([where]), ("where", {})))
    ctx = seen["ctx"]
    assert outcome.status == "completed" and outcome.value["text"] == "here"
    assert seen["queue"].startswith("aaa-embedded-")  # it came through the broker
    # one meaning of "call id": the task id and the store key; the model's id threads the transcript
    assert seen["task_id"] == ctx.call_id == requested_ids(handle)[0]
    assert ctx.call_id.startswith(f"~:{handle.run_id}:0.0.") and ctx.tool_call_id.startswith("call_")
    assert seen["thread"] != threading.main_thread().name
    # the attempt record was durable before the body ran, and the result was recorded after
    assert seen["events_before_body"] == ["aaa.tool.started"]
    trail = engine.store.events(seen["task_id"])
    assert [e.type for e in trail] == ["aaa.tool.started", "aaa.tool.completed"]
    assert trail[0].id == f"{seen['task_id']}:attempt:1"
    assert trail[0].data["idempotency_key"] == f"{handle.run_id}/{ctx.call_id}"


def test_tool_context_values():
    seen = []

    @tool
    async def keyed(order_id: str, ctx: ToolContext) -> str:
        """Default key."""
        seen.append(ctx)
        return "k"

    @tool(idempotency_key=lambda a: f"refund:{a['order_id']}")
    async def business(order_id: str, ctx: ToolContext) -> str:
        """Business key."""
        seen.append(ctx)
        return "b"

    @tool
    def plain(x: int) -> int:
        """No ctx at all."""
        return x * 2

    _, handle, outcome = asyncio.run(
        _run(
            ToolRegistry([keyed, business, plain]),
            ("keyed", {"order_id": "A-1"}),
            ("business", {"order_id": "A-2"}),
            ("plain", {"x": 21}),
        )
    )
    assert outcome.value["text"] == "k | b | 42"
    by_key = {c.idempotency_key: c for c in seen}
    default = next(c for c in seen if "/" in c.idempotency_key)
    assert default.idempotency_key == f"{handle.run_id}/{default.call_id}"
    assert "refund:A-2" in by_key
    for c in seen:
        assert (c.attempt, c.fence, c.run_id) == (1, 1, handle.run_id)
        assert c.tool_call_id.startswith("call_") and c.call_id in requested_ids(handle)


def test_every_kind_of_failure_becomes_a_failed_fact_for_the_model():
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def refuse() -> str:
        """Refuse cleanly."""
        raise ToolError("the account is frozen")

    @tool
    def crash() -> str:
        """Crash."""
        raise KeyError("boom")

    @tool(timeout_s=0.3)
    async def slow_async() -> str:
        """Too slow."""
        await asyncio.sleep(30)
        return "never"

    @tool(timeout_s=0.3)
    def slow_sync() -> str:
        """Too slow, in a thread."""
        for _ in range(300):
            time.sleep(0.01)
        return "never"

    registry = ToolRegistry([add, refuse, crash, slow_async, slow_sync])
    started = time.monotonic()
    engine, handle, outcome = asyncio.run(
        _run(
            registry,
            ("add", {"a": "x"}),
            ("refuse", {}),
            ("crash", {}),
            ("slow_async", {}),
            ("slow_sync", {}),
            ("no_such_tool", {}),
        )
    )
    assert time.monotonic() - started < 2.9  # the timeouts cut the bodies short
    assert outcome.status == "completed"
    facts = outcome.value["text"].split(" | ")
    assert facts[0].startswith("ToolArgsError: add: bad arguments") and "b" in facts[0]
    assert facts[1] == "ToolError: the account is frozen"
    assert facts[2] == "KeyError: 'boom'"
    assert facts[3].startswith("ToolTimeout:") and facts[4].startswith("ToolTimeout:")
    assert facts[5].startswith("ToolArgsError: unknown tool 'no_such_tool'")
    failed = [e for e in handle.events() if e["type"] == "aaa.tool.failed"]
    assert len(failed) == 6
    assert {e["data"]["error"] for e in failed} == {"ToolArgsError", "ToolError", "KeyError", "ToolTimeout"}


def test_tool_calls_of_one_turn_run_concurrently():
    @tool
    async def nap(n: int) -> int:
        """Sleep a little."""
        await asyncio.sleep(0.5)
        return n

    started = time.monotonic()
    _, _, outcome = asyncio.run(_run(ToolRegistry([nap]), *[("nap", {"n": i}) for i in range(4)]))
    assert outcome.value["text"] == "0 | 1 | 2 | 3"
    assert time.monotonic() - started < 1.9


def test_a_second_handler_merges_into_the_first_executor():
    @tool
    def supervisor_tool() -> str:
        """S."""
        return "s"

    @tool
    def worker_tool() -> str:
        """W."""
        return "w"

    async def main():
        async with Engine() as engine:
            LLMHandler(FakeLLMClient(call_then_echo(("supervisor_tool", {}), ("worker_tool", {})))).attach(engine)
            ToolHandler(ToolRegistry([supervisor_tool])).attach(engine)
            ToolHandler(ToolRegistry([worker_tool])).attach(engine)
            ToolHandler(ToolRegistry([worker_tool])).attach(engine)  # the same tool again is fine
            return await engine.run(ToolLoop(ToolRegistry([supervisor_tool, worker_tool])), {"task": "x"})

    assert asyncio.run(main()).value["text"] == "s | w"


def test_two_different_tools_with_one_name_clash_at_attach():
    def one() -> str:
        """1."""
        return "1"

    def two() -> str:
        """2."""
        return "2"

    engine = Engine()
    ToolHandler(ToolRegistry([tool(name="same")(one)])).attach(engine)
    with pytest.raises(ConfigError, match="'same'"):
        ToolHandler(ToolRegistry([tool(name="same")(two)])).attach(engine)


def test_tools_attached_after_the_worker_started_are_served():
    @tool
    def first() -> str:
        """1."""
        return "1"

    @tool
    def later() -> str:
        """2."""
        return "2"

    async def main():
        async with Engine() as engine:
            LLMHandler(FakeLLMClient(call_then_echo(("first", {})))).attach(engine)
            ToolHandler(ToolRegistry([first])).attach(engine)
            await engine.run(ToolLoop(ToolRegistry([first])), {"task": "x"})
            ToolHandler(ToolRegistry([later])).attach(engine)
            LLMHandler(FakeLLMClient(call_then_echo(("later", {})))).attach(engine)
            return await engine.run(ToolLoop(ToolRegistry([later])), {"task": "y"})

    assert asyncio.run(main()).value["text"] == "2"


def test_engine_without_a_model_says_how_to_attach_one():
    async def main():
        async with Engine() as engine:
            engine.start(ToolLoop(ToolRegistry([])), {"task": "x"})

    with pytest.raises(ConfigError, match="LLMHandler"):
        asyncio.run(main())
