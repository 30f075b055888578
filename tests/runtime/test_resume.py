"""Resumable runs on the embedded engine over a shared SQLite (or Redis) store (docs/durable-runs.md).

The defect these tests show reproduces on 88103e7: a run, its events and its pending
approvals lived only in the memory of the process that started it; a fresh Engine on the
same store found nothing (``Engine.resume`` did not exist), and a driver that died left
its run, and a refund waiting for a person, lost.

A driver's death is simulated in-process by :func:`crash` (the run's task stops, writes
nothing more, and never gives its lease back), and for real by ``kill -9`` of a child
process (:func:`test_kill_9_of_the_driving_process`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ConfigError
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import APPROVAL_GRANTED, Engine, RunHandle
from aaa_celery.stores import open_store
from aaa_celery.tools import ToolHandler

from .conftest import kill_9_when, until
from .resume_tools import LOG_ENV, LONG_PLAN, REFUND_PLAN, REGISTRY, notes, scripted

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _log(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log.jsonl"))
    monkeypatch.setenv("AAA_RESUME_SLOW_S", "1")


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'aaa.sqlite3'}"


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def shared_url(request, tmp_path) -> str:
    """The store the engines share: an SQLite file, or a Redis server."""
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return f"sqlite:///{tmp_path / 'aaa.sqlite3'}"


def engine_on(url: str, plan: tuple, **kw) -> Engine:
    """An engine of its own (a web process), on the shared store."""
    engine = Engine(store=open_store(url), **{"run_lease_s": 3.0, **kw})
    LLMHandler(FakeLLMClient(scripted(*plan))).attach(engine)
    ToolHandler(REGISTRY).attach(engine)
    return engine


def crash(handle: RunHandle) -> None:
    """The process driving ``handle`` dies: the run's task stops, writes nothing more, and its
    lease is never given back (it lapses)."""
    handle._lost = True
    handle._task.cancel()


def kinds(handle: RunHandle) -> list[str]:
    return [e["type"] for e in handle.events()]


def test_a_run_whose_driver_died_is_resumed_by_a_fresh_engine_without_asking_the_model_again(shared_url):
    url, run_id = shared_url, f"r-long-{uuid.uuid4().hex[:8]}"  # (embedded engines share Celery's memory cache)

    async def go() -> None:
        a = engine_on(url, LONG_PLAN)
        started = a.start(ToolLoop(REGISTRY), {"task": "report on A-100"}, run_id=run_id, tenant="acme")
        await until(lambda: notes("slow_report.start"), what="the long call runs")
        crash(started)
        b = engine_on(url, LONG_PLAN)
        b.add_algo(ToolLoop(REGISTRY))
        with pytest.raises(ConfigError, match="driven by"):  # A's lease has not lapsed yet
            b.resume(run_id, tenant="acme")
        [orphan] = await until(b.orphaned_runs, timeout_s=15, what="the run is orphaned")
        assert (orphan.run_id, orphan.tenant, orphan.status) == (run_id, "acme", "running")
        await until(lambda: notes("slow_report.end"), what="A's worker ends the body it was running")
        handle = b.resume(run_id, tenant="acme")
        outcome = await asyncio.wait_for(handle.result(), 30)
        assert outcome.status == "completed"
        assert outcome.value["text"] == "done: order A-100: paid 30 EUR | report on A-100"
        assert len(notes("slow_report.start")) == 1 and len(notes("lookup")) == 1  # each body ran once
        assert [n["turn"] for n in notes("model")] == [0, 1, 2]  # turns 0 and 1 were replayed, not asked
        assert handle.resumed == 1
        events = b.get(run_id, tenant="acme").events()
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        types = [e["type"] for e in events]
        assert types.count("aaa.run.started") == 1 and types.count("aaa.run.resumed") == 1
        assert types.count("aaa.llm.replayed") == 2 and types[-1] == "aaa.run.completed"
        # any process reads the finished run from the store: a fresh engine, too
        c = engine_on(url, LONG_PLAN)
        view = c.get(run_id, tenant="acme")
        assert view.detached and view.status == "completed" and view.outcome.value == outcome.value
        assert view.resumed == 1 and [e["seq"] for e in view.events(after=3)] == list(range(4, len(events) + 1))
        for engine in (a, b, c):
            await engine.aclose()

    asyncio.run(go())


def test_a_pending_approval_survives_its_driver_and_is_decided_on_another_process(shared_url):
    url, run_id = shared_url, f"r-refund-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        a = engine_on(url, REFUND_PLAN)
        started = a.start(ToolLoop(REGISTRY), {"task": "refund A-100"}, run_id=run_id, tenant="acme")
        [shown] = await until(started.pending_approvals, what="the refund waits for a person")
        crash(started)
        b, c = engine_on(url, REFUND_PLAN), engine_on(url, REFUND_PLAN)  # c only shows and decides
        [seen] = c.pending_approvals(tenant="acme")  # while nobody drives the run
        assert (seen.call_id, seen.digest, seen.arguments) == (shown.call_id, shown.digest, shown.arguments)
        assert c.pending_approvals(tenant="globex") == []
        await until(b.orphaned_runs, timeout_s=15, what="the run is orphaned")
        handle = b.resume(run_id, ToolLoop(REGISTRY), tenant="acme")
        await until(handle.pending_approvals, what="the resumed run waits for the same request")
        assert [p.digest for p in handle.pending_approvals()] == [shown.digest]
        view = c.get(run_id, tenant="acme")
        assert view.detached and view.status == "waiting"
        with pytest.raises(ValueError, match="digest"):
            await asyncio.to_thread(view.signal, APPROVAL_GRANTED, {"call_id": shown.call_id, "digest": "0" * 64})
        await asyncio.to_thread(view.signal, APPROVAL_GRANTED, {"call_id": shown.call_id, "digest": shown.digest})
        outcome = await asyncio.wait_for(handle.result(), 30)
        assert outcome.value["text"] == "done: order A-100: paid 30 EUR | refunded 30 EUR on A-100"
        assert len(notes("refund")) == 1 and [n["turn"] for n in notes("model")] == [0, 1, 2]
        assert "aaa.approval.granted" in kinds(handle)
        with pytest.raises(KeyError):  # single use: the request was decided
            await asyncio.to_thread(c.get(run_id, tenant="acme").signal, APPROVAL_GRANTED,
                                    {"call_id": shown.call_id, "digest": shown.digest})

        # Driving the run again asks nobody about the refund that already ran: its result is in the store
        again = b.start(ToolLoop(REGISTRY), {"task": "refund A-100"}, run_id=run_id, tenant="acme")
        outcome = await asyncio.wait_for(again.result(), 30)
        assert outcome.value["text"] == "done: order A-100: paid 30 EUR | refunded 30 EUR on A-100"
        assert "aaa.approval.requested" not in kinds(again) and len(notes("refund")) == 1
        for engine in (a, b, c):
            await engine.aclose()

    asyncio.run(go())


def test_a_decision_taken_while_nobody_drove_the_run_holds_when_it_is_resumed(url):
    async def go() -> None:
        a = engine_on(url, REFUND_PLAN)
        started = a.start(ToolLoop(REGISTRY), {"task": "refund A-100"}, run_id="r-1", tenant="acme")
        [shown] = await until(started.pending_approvals, what="the refund waits")
        crash(started)
        c = engine_on(url, REFUND_PLAN)
        await asyncio.to_thread(c.get("r-1", tenant="acme").signal, "aaa.approval.denied",
                                {"call_id": shown.call_id, "digest": shown.digest, "reason": "not this one"})
        b = engine_on(url, REFUND_PLAN, auto_resume=True)  # opted in: it takes orphaned runs on
        b.add_algo(ToolLoop(REGISTRY))
        b.start(ToolLoop(REGISTRY), {"task": "other"}, run_id="r-2", tenant="acme")  # starts b's loop
        done = await until(lambda: (r := c.get("r-1", tenant="acme")).done and r, timeout_s=30,
                           what="b resumes r-1 on its own and ends it")
        assert done.resumed == 1
        assert "denied by a person: not this one" in done.outcome.value["text"]
        assert notes("refund") == []
        for engine in (a, b, c):
            await engine.aclose()

    asyncio.run(go())


def test_an_engine_that_closes_gives_its_runs_back_to_be_resumed_at_once(url):
    async def go() -> None:
        a = engine_on(url, LONG_PLAN, run_lease_s=60.0)
        a.start(ToolLoop(REGISTRY), {"task": "x"}, run_id="r-deploy", tenant="acme")
        await until(lambda: notes("lookup"), what="the run makes its first call")
        await a.aclose()  # a deploy: the process stops, its runs do not end
        b = engine_on(url, LONG_PLAN)
        [orphan] = b.orphaned_runs()  # at once: the lease was given back, not left to lapse
        assert orphan.status == "running"
        outcome = await asyncio.wait_for(b.resume("r-deploy", ToolLoop(REGISTRY), tenant="acme").result(), 30)
        assert outcome.status == "completed" and len(notes("lookup")) == 1
        await b.aclose()

    asyncio.run(go())


def test_kill_9_of_the_driving_process(url, tmp_path, monkeypatch):
    """A real process death: the child drives the run (and, embedded, runs its tools) and is
    kill -9ed in the middle of the long call. A fresh engine here resumes the run: the model's
    recorded turns are not requested again and the finished lookup does not run again. The long
    call's body died with its process; being at_least_once it runs again (attempt 2) once its
    lease lapses (docs/durable-runs.md: on a fleet the body lives in a worker and runs once)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "AAA_RESUME_SLOW_S": "60"}
    child = subprocess.Popen([sys.executable, "-m", "tests.runtime.resume_child", url, "r-kill", "long"],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_9_when(child, lambda: notes("slow_report.start"), 60, "the long call")
    monkeypatch.setenv("AAA_RESUME_SLOW_S", "0.1")

    async def go() -> None:
        b = engine_on(url, LONG_PLAN)
        await until(b.orphaned_runs, timeout_s=15, what="the dead child's run is orphaned")
        handle = b.resume("r-kill", ToolLoop(REGISTRY), tenant="acme")
        outcome = await asyncio.wait_for(handle.result(), 60)
        assert outcome.value["text"] == "done: order A-100: paid 30 EUR | report on A-100"
        model = notes("model")
        assert [n["turn"] for n in model] == [0, 1, 2]  # the child asked turns 0 and 1, we asked turn 2 only
        assert {n["pid"] for n in model[:2]} == {child.pid} and model[2]["pid"] == os.getpid()
        assert len(notes("lookup")) == 1
        assert [n["pid"] for n in notes("slow_report.start")] == [child.pid, os.getpid()]
        assert len(notes("slow_report.end")) == 1
        await b.aclose()

    asyncio.run(go())
