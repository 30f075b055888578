"""Pydantic AI agents whose function tools run as guarded Celery calls (issue 38), on a real
fleet: Redis, two ``celery worker`` processes, the agent in the test process (the web
process), Pydantic AI's ``FunctionModel`` and ``TestModel`` as the model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("pydantic_ai")

from pydantic_ai import (  # noqa: E402
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelMessage,
    ModelRequest,
    FunctionToolset,
    ModelResponse,
    RetryPromptPart,
    RunContext,
    TextPart,
    ToolApproved,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402

from aaa_celery.contrib.pydantic_ai import GuardedToolset  # noqa: E402
from aaa_celery.errors import ConfigError, OutcomeUnknown  # noqa: E402
from aaa_celery.protocol import mint_call_id  # noqa: E402
from aaa_celery.worker.stores import app_store  # noqa: E402

from ..runtime.conftest import kill_9_when  # noqa: E402
from ..runtime.fleet import Worker, fleet_logs  # noqa: E402
from . import pydantic_ai_app as pa  # noqa: E402

pytestmark = [pytest.mark.redis, pytest.mark.fleet]
ROOT = Path(__file__).resolve().parents[2]


class Fleet:
    def __init__(self, url: str, workers: list[Worker]) -> None:
        self.url, self.workers = url, workers
        self.app, self.guarded = pa.make_app(url)
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def ledger(self, tool: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        return pa.read_ledger(self.redis, tool, **fields)

    def logs(self) -> str:
        return fleet_logs(self.workers)

    def state(self, since_s: float = 180) -> str:
        """Where each call of the last ``since_s`` seconds is, for a run that timed out: the store's
        record and events of each, the broker's queue and ``unacked`` messages, and what each worker
        says it holds (Celery's ``inspect``: active, reserved, and its pool's state)."""
        store, lines = app_store(self.app), ["===== calls, as the store has them ====="]
        try:
            for rec in store.calls(since=store.now() - since_s):
                events = [(e.type.removeprefix("aaa.tool."), e.attempt) for e in store.events(rec.call_id)]
                lines.append(f"{rec.call_id} {rec.spec.name} attempts={rec.attempts} holder={rec.holder} "
                             f"result={rec.result.error or 'ok' if rec.result else None} events={events}")
            lines.append("===== broker =====")
            for queue in ("aaa.default", "celery"):
                lines.append(f"queue {queue}: {[json.loads(m)['headers'].get('id') for m in self.redis.lrange(queue, 0, -1)]}")
            for tag, raw in self.redis.hgetall("unacked").items():
                headers = json.loads(raw)[0].get("headers", {})
                lines.append(f"unacked {tag}: {headers.get('task')} {headers.get('id')}")
            inspect = self.app.control.inspect(timeout=2)
            for name, found in (("active", inspect.active()), ("reserved", inspect.reserved())):
                lines.append(f"{name}: {json.dumps({w: [t.get('id') for t in ts] for w, ts in (found or {}).items()})}")
            for worker, stats in (inspect.stats() or {}).items():
                lines.append(f"pool of {worker}: {json.dumps(stats.get('pool'), default=str)}")
        except Exception as e:  # noqa: BLE001 - a diagnostic: say what failed, never hide the test's own failure
            lines.append(f"(state read failed: {e!r})")
        return "\n".join(lines)

    def starts(self, call_id: str) -> list[int]:
        """The attempts the store records of a call (its ``aaa.tool.started`` events)."""
        return [e.attempt for e in app_store(self.app).events(call_id) if e.type == "aaa.tool.started"]


@pytest.fixture(scope="module")
def fleet(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    url = redis_server.url.rsplit("/", 1)[0] + "/9"  # a db of our own
    redis.Redis.from_url(url).flushdb()
    logdir = tmp_path_factory.mktemp("pydantic-ai-fleet")
    env = {pa.ENV: url}
    workers: list[Worker] = []
    try:
        for name in ("w1", "w2"):
            workers.append(Worker(name, ["aaa.default"], 2, env, logdir, app="tests.contrib.pydantic_ai_app"))
        for w in workers:
            w.wait_ready()
        f = Fleet(url, workers)
        os.environ[pa.ENV] = url  # the unguarded runs' bodies write the ledger from this process
        yield f
        os.environ.pop(pa.ENV, None)
        f.redis.close()
    finally:
        for w in workers:
            w.stop()


def conversation() -> str:
    return f"conv-{uuid.uuid4().hex[:10]}"


def returns(messages: list[ModelMessage]) -> list[Any]:
    return [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]


def refund_and_search(order: str = "A-100", query: str = "A-100"):
    """A model that refunds and searches in one response, then answers with both results."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("refund", {"order_id": order, "amount": 30}),
                                        ToolCallPart("search", {"query": query})])
        return ModelResponse(parts=[TextPart(json.dumps(returns(messages)))])

    return FunctionModel(model)


def call_id(conv: str, step: int, position: int, tool: str, arguments: dict[str, Any]) -> str:
    """The guard's id of a call of the tests' tenant (what the adapter mints)."""
    return mint_call_id("acme", conv, step, position, tool, arguments)


def run(fleet: Fleet, agent: Agent[Any, Any], prompt: str | None = "refund A-100", **kwargs: Any) -> Any:
    try:
        return asyncio.run(asyncio.wait_for(agent.run(prompt, deps="acme", **kwargs), 90))
    except BaseException:
        print(fleet.logs())
        raise


def test_happy_path_the_output_uses_both_results_and_each_body_ran_once(fleet: Fleet):
    conv = conversation()
    agent = Agent(refund_and_search("H-1", "H-1"), toolsets=[fleet.guarded])
    result = run(fleet, agent, conversation_id=conv)
    assert json.loads(result.output) == ["refunded 30 on H-1", ["H-1: order A-100, paid 30 EUR"]]
    assert len(fleet.ledger("refund", order_id="H-1")) == 1
    assert len(fleet.ledger("search", query="H-1")) == 1
    # the store shows one attempt of each, under the ids the guard minted (the model's ids aside)
    assert fleet.starts(call_id(conv, 0, 0, "refund", {"order_id": "H-1", "amount": 30})) == [1]
    assert fleet.starts(call_id(conv, 0, 1, "search", {"query": "H-1"})) == [1]


def holder(fleet: Fleet, tool: str, **fields: Any) -> int:
    """The process id of the pool child that runs ``tool``'s body (once it started)."""
    deadline = time.monotonic() + 30
    while not (found := fleet.ledger(tool, **fields)):
        assert time.monotonic() < deadline, f"{tool} never started:\n{fleet.logs()}"
        time.sleep(0.05)
    return int(found[-1]["pid"])


def kill_9_when_started(fleet: Fleet, tool: str, **fields: Any) -> None:
    """In a thread of the web process: ``kill -9`` the pool child running ``tool``."""
    os.kill(holder(fleet, tool, **fields), signal.SIGKILL)


async def run_while(fleet: Fleet, agent: Agent[Any, Any], action: Any, **kwargs: Any) -> Any:
    """Run the agent while ``action()`` runs in a thread (it kills, decides, ...)."""
    task = asyncio.ensure_future(agent.run("go", deps="acme", **kwargs))
    await asyncio.to_thread(action)
    try:
        return await asyncio.wait_for(task, 90)
    except TimeoutError:
        print(fleet.state())
        print(fleet.logs())  # every worker process's stacks, then their logs
        raise


def test_kill_9_of_the_refund_holder_raises_outcome_unknown_and_the_refund_started_once(fleet: Fleet):
    # Given an at_most_once refund whose body hangs, and an agent that refunds and searches
    conv = conversation()
    agent = Agent(refund_and_search("slow-K-1", "K-1"), toolsets=[fleet.guarded])
    # When the pool child running the refund is killed with -9
    with pytest.raises(OutcomeUnknown) as caught:
        asyncio.run(run_while(fleet, agent, lambda: kill_9_when_started(fleet, "refund", order_id="slow-K-1"),
                              conversation_id=conv))
    # Then the app catches OutcomeUnknown (the refund may have happened: verify, do not retry)
    refund_id = call_id(conv, 0, 0, "refund", {"order_id": "slow-K-1", "amount": 30})
    assert caught.value.call_id == refund_id and "verify" in str(caught.value).lower()
    # and the effect ledger shows one refund start, never a second
    time.sleep(2)  # a recovery sweep or two
    assert len(fleet.ledger("refund", order_id="slow-K-1")) == 1
    assert fleet.starts(refund_id) == [1]


def test_kill_9_of_the_search_holder_gives_the_agent_attempt_2s_result(fleet: Fleet):
    conv = conversation()
    agent = Agent(refund_and_search("S-1", "slow-S-1"), toolsets=[fleet.guarded])
    result = asyncio.run(run_while(fleet, agent, lambda: kill_9_when_started(fleet, "search", query="slow-S-1"),
                                   conversation_id=conv))
    refunded, found = json.loads(result.output)
    assert refunded == "refunded 30 on S-1" and found == ["slow-S-1: order A-100, paid 30 EUR", "attempt 2"]
    assert fleet.starts(call_id(conv, 0, 1, "search", {"query": "slow-S-1"})) == [1, 2]
    assert len(fleet.ledger("refund", order_id="S-1")) == 1


WEB = """
import asyncio, sys
from pydantic_ai import Agent
from tests.contrib.pydantic_ai_app import guarded
from tests.contrib.test_pydantic_ai import refund_and_search
agent = Agent(refund_and_search(sys.argv[1], "W-1"), toolsets=[guarded])
asyncio.run(agent.run("go", deps="acme", conversation_id=sys.argv[2]))
"""


def test_the_web_process_killed_mid_run_then_the_run_driven_again_runs_no_body_twice(fleet: Fleet):
    # Given a web process (a child) driving a conversation whose refund takes a few seconds
    conv, order = conversation(), "nap-W-1"
    env = {**os.environ, pa.ENV: fleet.url, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", WEB, order, conv], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # When it is killed -9 while the refund runs on a worker
    kill_9_when(child, lambda: fleet.ledger("refund", order_id=order), 60, "the refund running")
    # Then the conversation driven again (a new process, the same conversation id) gets both results
    agent = Agent(refund_and_search(order, "W-1"), toolsets=[fleet.guarded])
    result = run(fleet, agent, conversation_id=conv)
    assert json.loads(result.output)[0] == f"refunded 30 on {order}"
    # and no body ran twice
    assert len(fleet.ledger("refund", order_id=order)) == 1
    assert len(fleet.ledger("search", query="W-1")) == 1
    # nor when it is replayed from its message history (the model's calls, not their results)
    history = result.all_messages()[:2]
    assert isinstance(history[-1], ModelResponse)
    again = run(fleet, Agent(refund_and_search(order, "W-1"), toolsets=[fleet.guarded]), None,
                message_history=history)
    assert again.output == result.output
    assert len(fleet.ledger("refund", order_id=order)) == 1
    assert len(fleet.ledger("search", query="W-1")) == 1


def test_bad_arguments_get_the_framework_retry_prompt_and_the_model_retries(fleet: Fleet):
    def model(seen: list[str]) -> FunctionModel:
        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            if len(messages) == 1:
                return ModelResponse(parts=[ToolCallPart("refund", {"order_id": "B-1", "amount": "thirty"})])
            if len(messages) == 3:  # what the model was told of its bad call
                seen.extend(str(p.content) for p in messages[2].parts if isinstance(p, ToolReturnPart | RetryPromptPart))
                return ModelResponse(parts=[ToolCallPart("refund", {"order_id": "B-1", "amount": 30})])
            return ModelResponse(parts=[TextPart(json.dumps(returns(messages)[-1]))])

        return FunctionModel(answer)

    seen: list[str] = []
    result = run(fleet, Agent(model(seen), toolsets=[fleet.guarded]), conversation_id=conversation())
    # the model saw the validation error, as it does without the guard, and retried
    unguarded: list[str] = []
    asyncio.run(Agent(model(unguarded), toolsets=[pa.tools]).run("go", deps="acme"))
    assert seen == unguarded and "valid integer" in seen[0]
    assert json.loads(result.output) == "refunded 30 on B-1"
    assert len(fleet.ledger("refund", order_id="B-1")) == 2  # the guarded run's body and the unguarded one's


def test_wrapping_gives_the_same_output_as_not_wrapping_on_the_test_models(fleet: Fleet):
    for model in (TestModel(call_tools=["refund", "search"]), refund_and_search("N-1", "N-1")):
        plain = asyncio.run(Agent(model, toolsets=[pa.tools]).run("go", deps="acme"))
        guarded = run(fleet, Agent(model, toolsets=[fleet.guarded]), conversation_id=conversation())
        assert guarded.output == plain.output


DECIDE = """
import json, sys
from aaa_celery.contrib.pydantic_ai import decide
from tests.contrib.pydantic_ai_app import app
decide(app, json.loads(sys.argv[1]), granted=True, digest=sys.argv[2])
"""


def decide_elsewhere(fleet: Fleet, metadata: dict[str, Any], digest: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, pa.ENV: fleet.url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", DECIDE, json.dumps(metadata), digest], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def wire_then_answer(to: str = "ACME"):
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("wire", {"to": to, "amount": 30})])
        return ModelResponse(parts=[TextPart(json.dumps(returns(messages)))])

    return FunctionModel(model)


def test_an_approval_required_call_waits_is_approved_elsewhere_by_digest_and_runs_once(fleet: Fleet):
    conv = conversation()
    wire_id = call_id(conv, 0, 0, "wire", {"to": "ACME", "amount": 30})
    agent = Agent(wire_then_answer(), toolsets=[fleet.guarded], capabilities=[fleet.guarded.wait_for_approvals()])

    def approve() -> None:
        deadline = time.monotonic() + 30
        while not (record := app_store(fleet.app).get_run(f"acme:{conv}")) or wire_id not in record.approvals:
            assert time.monotonic() < deadline, "no request for approval"
            time.sleep(0.1)
        request = record.approvals[wire_id]
        assert record.status == "waiting" and request["arguments"] == {"to": "ACME", "amount": 30}
        assert fleet.ledger("wire", to="ACME") == []  # nothing sent while it waits
        meta = {"call_id": wire_id, "run_id": conv, "tenant": "acme"}
        refused = decide_elsewhere(fleet, meta, "0" * 64)  # the digest of something else
        assert refused.returncode != 0 and "digest" in refused.stderr
        done = decide_elsewhere(fleet, meta, request["digest"])
        assert done.returncode == 0, done.stderr

    result = asyncio.run(run_while(fleet, agent, approve, conversation_id=conv))
    assert json.loads(result.output) == ["wired 30 to ACME"]
    assert len(fleet.ledger("wire", to="ACME")) == 1 and fleet.starts(wire_id) == [1]
    assert app_store(fleet.app).get_run(f"acme:{conv}").approvals[wire_id]["state"] == "granted"


def test_an_approval_for_other_arguments_is_refused(fleet: Fleet):
    conv = conversation()
    agent = Agent(wire_then_answer("ACME-2"), toolsets=[fleet.guarded],
                  output_type=[str, DeferredToolRequests])
    paused = run(fleet, agent, conversation_id=conv)
    assert isinstance(paused.output, DeferredToolRequests)
    [part] = paused.output.approvals
    meta = paused.output.metadata[part.tool_call_id]
    assert decide_elsewhere(fleet, meta, meta["digest"]).returncode == 0
    # the app resumes the run with the person's approval, but of other arguments
    other = DeferredToolResults(approvals={part.tool_call_id: ToolApproved(override_args={"to": "EVIL", "amount": 9})},
                                metadata={part.tool_call_id: {"digest": meta["digest"]}})
    resumed = run(fleet, agent, None, message_history=paused.all_messages(), deferred_tool_results=other)
    # is refused: the model reads the refusal (ToolFailed), and nothing is sent
    [told] = json.loads(resumed.output)
    assert told.startswith("ApprovalDenied: ") and "other arguments" in told
    assert fleet.ledger("wire", to="EVIL") == [] and fleet.ledger("wire", to="ACME-2") == []
    # the approval of the arguments shown lets the call run, once
    decisions = asyncio.run(fleet.guarded.decisions(paused.output))
    assert decisions is not None and decisions.approvals == {part.tool_call_id: True}
    done = run(fleet, agent, None, message_history=paused.all_messages(), deferred_tool_results=decisions)
    assert json.loads(done.output) == ["wired 30 to ACME-2"]
    assert len(fleet.ledger("wire", to="ACME-2")) == 1


def test_a_tool_that_takes_run_context_is_refused_when_the_toolset_is_made(fleet: Fleet):
    tools: FunctionToolset[Any] = FunctionToolset()

    @tools.tool
    def needs_deps(ctx: RunContext[Any], order_id: str) -> str:
        return order_id

    with pytest.raises(ConfigError, match="RunContext"):
        GuardedToolset(tools, app=fleet.app)
    with pytest.raises(ConfigError, match="no tool named"):
        GuardedToolset(pa.tools, app=fleet.app, policies={"refnud": {"delivery": "at_most_once"}})
