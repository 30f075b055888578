"""Eager mode (``task_always_eager``): a guarded task or tool runs in the caller's process as
plain Celery runs an eager task, under the guard, with its record in the store. No worker.

The failing case first: an ``async def`` tool sent eagerly from code that runs inside an
event loop (an async Django view under eager test settings, pytest-asyncio) raised
``RuntimeError: asyncio.run() cannot be called from a running event loop`` (c79799f).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from aaa_celery import GuardedTask, ToolContext
from aaa_celery.errors import StoreUnavailable, ToolTimeout
from aaa_celery.stores import Store, open_store
from aaa_celery.tools import ToolHandler, ToolRegistry, tool
from aaa_celery.worker.stores import use_store


@tool
def ping(text: str) -> str:
    """Echo the text."""
    return text


@tool
async def aping(text: str, ctx: ToolContext) -> dict[str, Any]:
    """Echo the text from a coroutine, with what the guard told the body."""
    await asyncio.sleep(0.01)
    return {"text": text, "attempt": ctx.attempt, "call": ctx.call_id, "lease": ctx.lease_remaining_s > 0}


@tool(timeout_s=0.5)
async def slow() -> str:
    """Sleep past its timeout."""
    await asyncio.sleep(30)
    return "late"


@tool
async def outer(text: str) -> list[Any]:
    """Call two other tools eagerly from inside this tool's own event loop (waiting on a
    result inside a task needs ``disable_sync_subtasks=False``, as in plain Celery)."""
    inner = HANDLER.task("aping").delay(text=text + "!").get(timeout=10, disable_sync_subtasks=False)
    return [inner["text"], HANDLER.task("ping").delay(text=text).get(timeout=10, disable_sync_subtasks=False)]


HANDLER = ToolHandler(ToolRegistry([ping, aping, slow, outer]))


@pytest.fixture(params=["memory", "redis"])
def eager(request: pytest.FixtureRequest) -> Iterator[tuple[Celery, Store]]:
    """An eager app with the tools bound and a plain ``bind=True`` guarded task, over a
    memory store or the test Redis (broker-less: eager calls never publish)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    else:
        url = "memory://"
    app = Celery("eager", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, aaa_store_url=url, task_serializer="json", result_serializer="json",
                    accept_content=["json"], worker_prefetch_multiplier=1)
    HANDLER.bind(app)

    @app.task(base=GuardedTask, bind=True, name="eager.who", shared=False)
    def who(self: Any, x: int, ctx: ToolContext) -> list[Any]:
        return [self.request.id, x, ctx.attempt]

    @app.task(base=GuardedTask, name="eager.nested", shared=False)
    def nested(x: int) -> int:
        return int(who.delay(x).get(timeout=10, disable_sync_subtasks=False)[1]) + 1

    @app.task(base=GuardedTask, name="eager.nested_then_sleep", shared=False, timeout_s=1)
    def nested_then_sleep(inner_s: float) -> None:
        sleepy.delay(inner_s).get(timeout=10, disable_sync_subtasks=False)
        time.sleep(30)  # past the timeout: the outer call's watchdog must still interrupt it

    @app.task(base=GuardedTask, name="eager.sleepy", shared=False)
    def sleepy(s: float) -> None:
        time.sleep(s)

    store = open_store(url)
    use_store(app, store)
    try:
        yield app, store
    finally:
        store.close()


def recorded(store: Store, call_id: str) -> Any:
    outcome = store.result(call_id)
    assert outcome is not None, f"no result recorded for {call_id}"
    return outcome


def test_sync_and_async_tools_run_eagerly_with_their_result_in_the_store(eager):
    app, store = eager
    r = HANDLER.task("ping").delay(text="x")
    assert r.get(timeout=10) == "x"
    assert recorded(store, r.id).ok and recorded(store, r.id).value == "x"
    r = HANDLER.task("aping").apply_async({"text": "y"})
    assert r.get(timeout=10) == {"text": "y", "attempt": 1, "call": r.id, "lease": True}
    assert recorded(store, r.id).attempt == 1
    assert "aaa.tool.started" in [e.type for e in store.events(r.id)]


def test_delay_apply_and_apply_async_of_a_bind_true_task(eager):
    app, store = eager
    who = app.tasks["eager.who"]
    for result, x in ((who.delay(1), 1), (who.apply_async((2,)), 2), (who.apply(args=(3,)), 3)):
        assert result.get(timeout=10) == [result.id, x, 1]
        assert recorded(store, result.id).value == [result.id, x, 1]


def test_a_recorded_call_sent_again_eagerly_answers_from_the_store(eager):
    app, store = eager
    who = app.tasks["eager.who"]
    first = who.apply_async((5,), task_id="eager-again")
    assert first.get(timeout=10) == ["eager-again", 5, 1]
    again = who.apply_async((6,), task_id="eager-again")  # same call: the body does not run again
    assert again.get(timeout=10) == ["eager-again", 5, 1]


def test_nested_eager_calls(eager):
    app, store = eager
    result = app.tasks["eager.nested"].delay(4)
    assert result.get(timeout=10) == 5
    assert recorded(store, result.id).value == 5
    assert HANDLER.task("outer").delay(text="n").get(timeout=10) == ["n!", "n"]
    seen = {c.spec.name for c in store.calls()}
    assert {"eager.who", "eager.nested", "aping", "ping", "outer"} <= seen, seen


def test_a_nested_call_leaves_the_outer_calls_timeout_armed(eager):
    """The inner call's body ended on the same (main) thread: the outer one's watchdog must
    still be the one the interrupt signal reaches."""
    app, store = eager
    for inner_s in (0, 2):  # the outer call's timeout (1 s) comes after the inner call, or during it
        started = time.monotonic()
        result = app.tasks["eager.nested_then_sleep"].delay(inner_s)
        with pytest.raises(ToolTimeout):
            result.get(timeout=10)
        assert time.monotonic() - started < 20


def test_an_async_tool_sent_eagerly_from_inside_a_running_event_loop(eager):
    """Red on c79799f: RuntimeError from asyncio.run, and the tool's coroutine never awaited."""
    app, store = eager
    caller = threading.get_ident()

    async def view() -> tuple[Any, Any, str]:
        r = HANDLER.task("aping").delay(text="in a loop")
        nested = HANDLER.task("outer").delay(text="deep")
        return r.get(timeout=10), nested.get(timeout=10), r.id

    value, nested, call_id = asyncio.run(view())
    assert value == {"text": "in a loop", "attempt": 1, "call": call_id, "lease": True}
    assert nested == ["deep!", "deep"]
    assert recorded(store, call_id).ok
    assert threading.get_ident() == caller


def test_an_async_tool_times_out_eagerly_inside_a_running_loop(eager):
    app, store = eager

    async def view() -> Any:
        return HANDLER.task("slow").delay()

    result = asyncio.run(view())
    with pytest.raises(ToolTimeout):
        result.get(timeout=10)
    assert not recorded(store, result.id).ok


def test_an_eager_call_whose_store_is_down_raises_instead_of_returning_none():
    """Red on c79799f: the guard handed the call back (Reject), which an eager call turns into
    a REJECTED result whose get() returned None, silently; there is no broker to retry it."""
    app = Celery("eager_down", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, aaa_store_url="redis://127.0.0.1:1/0", task_serializer="json",
                    accept_content=["json"], worker_prefetch_multiplier=1)
    ran = []

    @app.task(base=GuardedTask, name="eager.down", shared=False)
    def down() -> str:
        ran.append(1)
        return "ran"

    result = down.delay()
    with pytest.raises(StoreUnavailable, match="unavailable"):
        result.get(timeout=10)
    assert ran == []


def test_an_async_django_view_under_eager_test_settings_runs_an_async_guarded_task():
    """The reported case, as a Django project meets it: an async view sends an ``async def``
    guarded task under CELERY_TASK_ALWAYS_EAGER and waits for it (Django's AsyncClient runs
    the view in an event loop). Red on c79799f: RuntimeError from asyncio.run, coroutine never
    awaited."""
    pytest.importorskip("django")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "tests.django_plain.run_eager_view"], cwd=root, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root),
                                                                                         os.environ.get("PYTHONPATH"))))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["status"] == 200
    assert seen["body"]["value"] == seen["recorded"] == {"order": "A-1", "status": "shipped"}
