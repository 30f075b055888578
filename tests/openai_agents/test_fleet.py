"""The Agents SDK's function tools as guarded calls, on a real fleet: Redis, two ``celery
worker`` processes, the agent in the test process against the local stub model server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agents import RunState, Runner  # noqa: E402

from aaa_celery.contrib.openai_agents import AgentTools  # noqa: E402
from aaa_celery.errors import OutcomeUnknown  # noqa: E402
from aaa_celery.protocol import parse_call_id  # noqa: E402

from ..llm.stub_server import StubModelServer  # noqa: E402
from ..runtime.conftest import kill_9_when  # noqa: E402
from ..runtime.fleet import ROOT, Worker, fleet_logs  # noqa: E402
from . import agents_app as aa  # noqa: E402
from .agent import Script, drive, guarded, plain  # noqa: E402

pytestmark = [pytest.mark.redis, pytest.mark.fleet]
APP = "tests.openai_agents.agents_app"


class Fleet:
    def __init__(self, url: str, workers: list[Worker]) -> None:
        self.url, self.workers = url, workers
        self.app = aa.make_app(url)
        self.guard = AgentTools(self.app, aa.handler())
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def ledger(self, tool_name: str | None = None) -> list[dict[str, Any]]:
        return aa.read_ledger(self.redis, tool_name)

    def attempts(self, call_id: str) -> list[int]:
        return [e.attempt for e in self.guard.store.events(call_id) if e.type == "aaa.tool.started"]

    def logs(self) -> str:
        return fleet_logs(self.workers)


@pytest.fixture(scope="module")
def fleet(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    url = redis_server.url.rsplit("/", 1)[0] + "/11"  # a db of our own
    redis.Redis.from_url(url).flushdb()
    os.environ[aa.ENV] = url  # the plain agent's tools run in this process and write the ledger too
    logdir: Path = tmp_path_factory.mktemp("agents-fleet")
    workers: list[Worker] = []
    try:
        for name in ("one", "two"):
            workers.append(Worker(name, ["aaa.default"], 2, {aa.ENV: url}, logdir, app=APP))
        for w in workers:
            w.wait_ready()
        f = Fleet(url, workers)
        yield f
        f.redis.close()
    finally:
        os.environ.pop(aa.ENV, None)
        for w in workers:
            w.stop()


def run(fleet: Fleet, script: Script, text: str, run_id: str, **kwargs: Any) -> Any:
    with StubModelServer("openai", script) as server:
        try:
            return asyncio.run(asyncio.wait_for(drive(fleet.guard, guarded(fleet.guard, server.base_url), text,
                                                      run_id, **kwargs), 90))
        except BaseException:
            print(fleet.logs())
            raise


def calls(fleet: Fleet, run_id: str, tool: str) -> list[str]:
    """The guard's call ids of a run's calls of ``tool`` (from the store's index of calls)."""
    found = []
    for record in fleet.guard.store.calls():
        identity = parse_call_id(record.call_id)
        if identity is not None and identity.run_id == run_id and tool in record.spec.name:
            found.append(record.call_id)
    return sorted(found)


# -- acceptance ------------------------------------------------------------------------------

def test_happy_path_the_output_uses_both_results_and_the_store_shows_one_attempt_each(fleet: Fleet):
    script = Script([("call_s", "search", {"query": "shoes"}), ("call_r", "refund", {"order_id": "A-100", "amount": 30})])
    with StubModelServer("openai", script) as server:
        result = asyncio.run(drive(fleet.guard, guarded(fleet.guard, server.base_url), "refund A-100", "happy"))
        sent_back = {m["tool_call_id"]: m["content"] for m in server.bodies[-1]["messages"] if m["role"] == "tool"}
    assert result.final_output == "done: 3 results for shoes | refunded 30 EUR on A-100"
    # the model's own tool call ids thread each result back to its call
    assert sent_back == {"call_s": "3 results for shoes", "call_r": "refunded 30 EUR on A-100"}
    for tool in ("search", "refund"):
        (call_id,) = calls(fleet, "happy", tool)
        assert "call_" not in call_id  # minted by the guard, not the model's id
        assert fleet.attempts(call_id) == [1]
        assert [e.type for e in fleet.guard.store.events(call_id)][-1] == "aaa.tool.completed"


def drive_killing(fleet: Fleet, script: Script, run_id: str, tool: str, field: str, value: str) -> Any:
    """Drive a run and ``kill -9`` the pool child whose ledger entry of ``tool`` has ``field == value``
    once it started (a pool child of our own worker, by the pid it wrote)."""
    def started() -> list[int]:
        return [e["pid"] for e in fleet.ledger(tool) if e[field] == value]

    async def go() -> Any:
        async def kill_it() -> None:
            while not started():
                await asyncio.sleep(0.05)
            os.kill(started()[0], signal.SIGKILL)

        with StubModelServer("openai", script) as server:
            killer = asyncio.create_task(kill_it())
            try:
                return await asyncio.wait_for(drive(fleet.guard, guarded(fleet.guard, server.base_url), "go",
                                                    run_id), 90)
            finally:
                assert killer.done(), "the run ended before its tool started"
                killer.cancel()

    return asyncio.run(go())


def test_the_model_s_tool_call_id_reaches_the_tool_as_ctx_tool_call_id_beside_the_guard_s_call_id(fleet: Fleet):
    run(fleet, Script([("call_lookup_7", "lookup", {"order_id": "D-4"})]), "go", "ids")
    (entry,) = [e for e in fleet.ledger("lookup") if e["order_id"] == "D-4"]
    assert entry["tool_call_id"] == "call_lookup_7"
    assert [entry["call_id"]] == calls(fleet, "ids", "lookup") and "call_lookup_7" not in entry["call_id"]


def test_kill_9_of_the_refund_holder_raises_outcome_unknown_and_the_refund_never_starts_again(fleet: Fleet):
    script = Script([("call_r", "refund", {"order_id": "HANG-1", "amount": 30})])
    with pytest.raises(OutcomeUnknown) as caught:
        drive_killing(fleet, script, "lost-refund", "refund", "order_id", "HANG-1")
    assert "verify" in str(caught.value).lower()
    (call_id,) = calls(fleet, "lost-refund", "refund")
    assert caught.value.call_id == call_id  # type: ignore[attr-defined]
    time.sleep(2)  # recovery had its chances to send it again
    assert [e["order_id"] for e in fleet.ledger("refund")].count("HANG-1") == 1
    assert fleet.attempts(call_id) == [1]


def test_kill_9_of_the_search_holder_brings_attempt_2_s_result_to_the_agent(fleet: Fleet):
    script = Script([("call_s", "search", {"query": "hang boots"})])
    result = drive_killing(fleet, script, "lost-search", "search", "query", "hang boots")
    assert result.final_output == "done: 3 results for hang boots"
    (call_id,) = calls(fleet, "lost-search", "search")
    assert fleet.attempts(call_id) == [1, 2]
    assert len([e for e in fleet.ledger("search") if e["query"] == "hang boots"]) == 2


def test_web_process_killed_mid_run_then_the_run_driven_again_runs_no_tool_body_twice(fleet: Fleet):
    script = Script([("call_s", "search", {"query": "socks"})],
                    [("call_r", "refund", {"order_id": "SLOW-7", "amount": 12})])
    env = {**os.environ, aa.ENV: fleet.url, "PYTHONPATH": str(ROOT)}
    with StubModelServer("openai", script) as server:
        child = subprocess.Popen([sys.executable, "-m", "tests.openai_agents.drive_child", server.base_url,
                                  "web-killed", "refund SLOW-7"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        kill_9_when(child, lambda: any(e["order_id"] == "SLOW-7" for e in fleet.ledger("refund")), 60,
                    "the refund's start")
        result = asyncio.run(drive(fleet.guard, guarded(fleet.guard, server.base_url), "refund SLOW-7",
                                   "web-killed"))
    assert result.final_output == "done: 3 results for socks | refunded 12 EUR on SLOW-7"
    assert [e["query"] for e in fleet.ledger("search")].count("socks") == 1
    assert [e["order_id"] for e in fleet.ledger("refund")].count("SLOW-7") == 1


def test_bad_arguments_the_model_reads_the_validation_error_and_retries(fleet: Fleet):
    script = Script([("call_1", "refund", {"order_id": "B-1", "amount": "lots"})],
                    [("call_2", "refund", {"order_id": "B-1", "amount": 5})])
    with StubModelServer("openai", script) as server:
        result = asyncio.run(drive(fleet.guard, guarded(fleet.guard, server.base_url), "go", "bad-args"))
        first_error = next(m["content"] for m in server.bodies[1]["messages"] if m["role"] == "tool")
    assert first_error.startswith("ToolArgsError: ") and "amount" in first_error
    assert result.final_output.endswith("refunded 5 EUR on B-1")
    assert [e["amount"] for e in fleet.ledger("refund") if e["order_id"] == "B-1"] == [5]


def test_wrapping_gives_the_same_final_output_as_the_plain_agent(fleet: Fleet):
    script = Script([("c1", "search", {"query": "hats"}), ("c2", "refund", {"order_id": "C-3", "amount": 7})],
                    [("c3", "search", {"query": "more hats"})])
    with StubModelServer("openai", script) as server:
        unguarded = asyncio.run(Runner.run(plain(server.base_url), "go"))
        wrapped = asyncio.run(drive(fleet.guard, guarded(fleet.guard, server.base_url), "go", "same"))
    assert wrapped.final_output == unguarded.final_output
    assert wrapped.final_output == "done: 3 results for hats | refunded 7 EUR on C-3 | 3 results for more hats"


def test_an_approval_waits_is_decided_in_another_process_by_digest_and_the_call_runs_once(fleet: Fleet):
    script = Script([("call_t", "transfer", {"to": "Ana", "amount": 40})])
    with StubModelServer("openai", script) as server:
        async def first() -> tuple[str, Any]:
            agent = guarded(fleet.guard, server.base_url)  # one client per event loop
            with fleet.guard.run("approve-1"):
                result = await Runner.run(agent, "pay Ana")
                pending = fleet.guard.request_approvals(result.interruptions, result.context_wrapper)
            return result.to_state().to_string(), pending

        saved, pending = asyncio.run(first())
        assert fleet.ledger("transfer") == []  # it waits
        (request,) = pending
        assert request.arguments == {"to": "Ana", "amount": 40}
        assert [p.call_id for p in fleet.guard.pending_approvals("approve-1")] == [request.call_id]
        # an approval for other arguments is refused
        with pytest.raises(ValueError, match="other arguments"):
            fleet.guard.approve("approve-1", request.call_id, request.digest, arguments={"to": "Eve", "amount": 40})
        with pytest.raises(ValueError, match="digest"):
            fleet.guard.approve("approve-1", request.call_id, "0" * 64)
        # a person approves it in another process, by digest
        approver = (f"from tests.openai_agents import agents_app as aa\n"
                    f"from aaa_celery.contrib.openai_agents import AgentTools\n"
                    f"AgentTools(aa.make_app({fleet.url!r}), aa.handler()).approve("
                    f"'approve-1', {request.call_id!r}, {request.digest!r}, arguments={{'to': 'Ana', 'amount': 40}})\n")
        subprocess.run([sys.executable, "-c", approver], cwd=ROOT, check=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        with pytest.raises(KeyError, match="decided already|no pending"):
            fleet.guard.approve("approve-1", request.call_id, request.digest)

        async def resume() -> Any:
            agent = guarded(fleet.guard, server.base_url)
            state = await RunState.from_string(agent, saved)
            for item in state.get_interruptions():
                state.approve(item)
            with fleet.guard.run("approve-1"):
                return await Runner.run(agent, state)

        result = asyncio.run(resume())
    assert result.final_output == "done: sent 40 EUR to Ana"
    assert [e["to"] for e in fleet.ledger("transfer")] == ["Ana"]
    assert fleet.attempts(request.call_id) == [1]
    assert fleet.guard.pending_approvals("approve-1") == []


def test_an_sdk_approval_without_the_guard_s_grant_is_refused_and_nothing_runs(fleet: Fleet):
    script = Script([("call_t", "transfer", {"to": "Bob", "amount": 9})])
    with StubModelServer("openai", script) as server:
        agent = guarded(fleet.guard, server.base_url)
        async def both() -> Any:
            with fleet.guard.run("approve-2"):
                result = await Runner.run(agent, "pay Bob")
            state = result.to_state()
            for item in state.get_interruptions():
                state.approve(item)  # the SDK's word alone, no person's decision in the store
            with fleet.guard.run("approve-2"):
                return await Runner.run(agent, state)

        result = asyncio.run(both())
    assert "no person approved this call" in result.final_output
    assert [e for e in fleet.ledger("transfer") if e["to"] == "Bob"] == []


def test_the_engine_s_approval_views_list_the_request_and_decide_it_as_the_web_pages_do(fleet: Fleet):
    from aaa_celery.runtime import APPROVAL_GRANTED, Engine

    script = Script([("call_t", "transfer", {"to": "Cleo", "amount": 3})])
    with StubModelServer("openai", script) as server:
        async def first() -> tuple[str, Any]:
            with fleet.guard.run("approve-3", tenant="acme"):
                result = await Runner.run(guarded(fleet.guard, server.base_url), "pay Cleo")
                pending = fleet.guard.request_approvals(result.interruptions, result.context_wrapper)
            return result.to_state().to_string(), pending

        saved, (request,) = asyncio.run(first())
        # what the Flask and Django pages read and call: the engine's views of the store
        engine = Engine(app=fleet.app)
        listed = [p for p in engine.pending_approvals(tenant="acme") if p.run_id == "approve-3"]
        assert [(p.call_id, p.digest) for p in listed] == [(request.call_id, request.digest)]
        engine.get("approve-3", tenant="acme").signal(APPROVAL_GRANTED, {"call_id": request.call_id,
                                                                         "digest": request.digest})

        async def resume() -> Any:
            agent = guarded(fleet.guard, server.base_url)
            state = await RunState.from_string(agent, saved)
            for item in state.get_interruptions():
                state.approve(item)
            with fleet.guard.run("approve-3", tenant="acme"):
                return await Runner.run(agent, state)

        result = asyncio.run(resume())
    assert result.final_output == "done: sent 3 EUR to Cleo"
    assert [e["to"] for e in fleet.ledger("transfer") if e["to"] == "Cleo"] == ["Cleo"]
    assert engine.get("approve-3", tenant="acme").status == "completed"
