"""Engine(app=celery_app) on a real fleet: Redis, two ``celery worker`` processes
(one per pool: ``-Q aaa.default -c 4`` and ``-Q aaa.slow -c 1``) and the engine
in the test process."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMRequest, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.runtime import APPROVAL_GRANTED, Engine, RunHandle, RunOutcome
from aaa_celery.stores.runs import run_key
from aaa_celery.worker.stores import app_store

from . import fleet_engine_app as fa
from .conftest import until
from .fleet import Worker, fleet_logs

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


class Fleet:
    def __init__(self, url: str, workers: list[Worker]) -> None:
        self.url = url
        self.workers = workers
        self.client = fa.make_app(url)
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def ledger(self, tool_name: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        return fa.read_ledger(self.redis, tool_name, event)

    def logs(self) -> str:
        return fleet_logs(self.workers, 5000)


@pytest.fixture(scope="module")
def fleet(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # a db of our own: other tests flush db 0 of the session server
    url = redis_server.url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    logdir: Path = tmp_path_factory.mktemp("engine-fleet")
    env = {fa.ENV: url}
    workers: list[Worker] = []
    try:
        workers.append(Worker("default", ["aaa.default"], 4, env, logdir))
        workers.append(Worker("slow", ["aaa.slow"], 1, env, logdir))
        for w in workers:
            w.wait_ready()
        f = Fleet(url, workers)
        yield f
        f.redis.close()
    finally:
        for w in workers:
            w.stop()


def scripted(*turns: Callable[[LLMRequest], LLMResponse] | LLMResponse) -> FakeLLMClient:
    """A fake model answering turn n with ``turns[n]`` (a response, or a function of the request)."""
    queue = list(turns)

    def model(request: LLMRequest) -> LLMResponse:
        step = queue.pop(0) if queue else text("")
        return step(request) if callable(step) else step

    return FakeLLMClient(model)


def calls(*items: tuple[str, dict[str, Any]] | ToolCall) -> LLMResponse:
    return LLMResponse(tool_calls=tuple(c if isinstance(c, ToolCall) else ToolCall(c[0], c[1]) for c in items))


def echo_facts(request: LLMRequest) -> LLMResponse:
    return text(" | ".join(m.content for m in request.messages if m.role == "tool"))


async def _drive(fleet: Fleet, model: FakeLLMClient, *, run_id: str | None = None, tenant: str | None = None,
                 during: Callable[[Engine, RunHandle], Any] | None = None) -> tuple[RunHandle, RunOutcome]:
    async with Engine(app=fleet.client) as engine:
        LLMHandler(model).attach(engine)
        fa.handler().attach(engine)
        handle = engine.start(ToolLoop(fa.REGISTRY), {"task": "go"}, run_id=run_id, tenant=tenant)
        if during is not None:
            await during(engine, handle)
        outcome = await asyncio.wait_for(handle.result(), 60)
        return handle, outcome


def run(fleet: Fleet, *turns: Any, **kwargs: Any) -> tuple[RunHandle, RunOutcome]:
    try:
        return asyncio.run(_drive(fleet, scripted(*turns), **kwargs))
    except BaseException:
        print(fleet.logs())
        raise



def ids(handle: RunHandle) -> dict[str, str]:
    """The engine's call id of each call, by the model's tool call id."""
    return {e["data"]["tool_call_id"]: e["data"]["call_id"] for e in handle.events()
            if e["type"] == "aaa.tool.requested"}


def facts(handle: RunHandle) -> dict[str, dict[str, Any]]:
    """The result event of each call, by the model's tool call id."""
    model_id = {e["data"]["call_id"]: e["data"]["tool_call_id"] for e in handle.events()
                if e["type"] == "aaa.tool.requested"}
    return {model_id[e["data"]["call_id"]]: e for e in handle.events()
            if e["type"] in ("aaa.tool.completed", "aaa.tool.failed")}


def test_three_tools_one_approved_then_the_answer_with_the_full_event_sequence(fleet: Fleet):
    # Given a model that charges (at_most_once), wires (requires_approval) and looks up (plain) in one turn
    c_charge = ToolCall("charge", {"order_id": "A-1", "amount": 30}, id="call_charge")
    c_wire = ToolCall("wire", {"to": "ACME", "amount": 30}, id="call_wire")
    c_lookup = ToolCall("lookup", {"order_id": "A-1"}, id="call_lookup")

    async def approve_after_the_others(engine: Engine, handle: RunHandle) -> None:
        pending = await until(handle.pending_approvals, what="the wire call waits for a person")
        assert [(p.tool, p.arguments, p.run_id, p.call_id) for p in pending] == [
            ("wire", {"to": "ACME", "amount": 30}, handle.run_id, ids(handle)["call_wire"])
        ]
        await until(lambda: len(facts(handle)) == 2, what="charge and lookup done")
        # not sent while waiting: no body run, nothing registered in the store
        assert fleet.ledger("wire") == []
        assert fleet.client.AsyncResult(pending[0].call_id).state == "PENDING"
        handle.signal(APPROVAL_GRANTED, {"call_id": pending[0].call_id, "digest": pending[0].digest})

    handle, outcome = run(fleet, calls(c_charge, c_wire, c_lookup), echo_facts, during=approve_after_the_others)

    # Then the model answered with all three facts
    assert outcome.status == "completed"
    assert outcome.value["text"] == "charged 30 for A-1 | wired 30 to ACME | order A-1: paid 30 EUR"
    # and the run's events came in this order (charge and lookup finish in either order)
    # (events name the engine's call id; shown here by the model's tool call id)
    model_id = {v: k for k, v in ids(handle).items()}
    types = [(e["type"], model_id.get(e["data"].get("call_id"))) for e in handle.events()]
    assert types[:6] == [
        ("aaa.run.started", None),
        ("aaa.llm.completed", None),
        ("aaa.tool.requested", "call_charge"),
        ("aaa.tool.requested", "call_wire"),
        ("aaa.approval.requested", "call_wire"),
        ("aaa.tool.requested", "call_lookup"),
    ]
    assert sorted(types[6:8]) == [("aaa.tool.completed", "call_charge"), ("aaa.tool.completed", "call_lookup")]
    assert types[8:] == [
        ("aaa.approval.granted", "call_wire"),
        ("aaa.tool.completed", "call_wire"),
        ("aaa.llm.completed", None),
        ("aaa.run.completed", None),
    ]
    # each call ran once, as task <tenant>:<run id>:<turn>.<position>.<digest>, on the fleet
    for name, call, position in (("charge", c_charge, 0), ("wire", c_wire, 1)):
        [entry] = fleet.ledger(name)
        assert entry["task_id"] == ids(handle)[call.id]
        assert entry["task_id"].startswith(f"~:{handle.run_id}:0.{position}.")
        assert entry["pid"] != os.getpid()
    # the store's audit trail of the approved call
    events = app_store(fleet.client).events(ids(handle)["call_wire"])
    assert [e.type for e in events] == ["aaa.tool.started", "aaa.tool.completed"]


def test_task_id_and_tenant_reach_the_tool_context_on_the_worker(fleet: Fleet):
    handle, outcome = run(fleet, calls(ToolCall("whoami", {}, id="call_who")), echo_facts, tenant="acme")
    value = facts(handle)["call_who"]["data"]["value"]
    assert value == {
        "tenant": "acme",
        "run_id": handle.run_id,
        "call_id": ids(handle)["call_who"],
        "task_id": ids(handle)["call_who"],
    }
    assert value["call_id"].startswith(f"acme:{handle.run_id}:0.0.")


def test_failures_on_the_fleet_become_failed_facts_with_type_and_message(fleet: Fleet):
    handle, outcome = run(
        fleet, calls(("boom", {}), ("lookup", {"order": "x"}), ("no_such_tool", {})), echo_facts
    )
    parts = outcome.value["text"].split(" | ")
    assert parts[0] == "ToolError: the account is frozen"
    assert parts[1].startswith("ToolArgsError: lookup: bad arguments")
    assert parts[2].startswith("ToolArgsError: unknown tool 'no_such_tool'")
    assert {e["data"]["error"] for e in facts(handle).values()} == {"ToolError", "ToolArgsError"}


def test_calls_of_one_turn_run_concurrently_on_the_fleet(fleet: Fleet):
    started = time.monotonic()
    handle, outcome = run(fleet, calls(*[("nap", {"seconds": 1.5})] * 4), echo_facts)
    elapsed = time.monotonic() - started
    assert outcome.status == "completed"
    mine = [e for e in fleet.ledger("nap") if f":{handle.run_id}:" in e["task_id"]]
    starts = sorted(e["at"] for e in mine if e["event"] == "start")
    ends = sorted(e["at"] for e in mine if e["event"] == "end")
    assert len(starts) == 4 and max(starts) < min(ends)  # all four were running at once
    # the ledger's overlap above is the proof; the wall time only catches a run that waits on
    # something else, with a margin for a loaded 2-core machine (four in turn take >= 6 s of naps)
    assert elapsed < 30, elapsed


def test_slow_pool_of_one_never_overlaps_while_default_calls_keep_flowing(fleet: Fleet):
    handle, outcome = run(
        fleet,
        calls(("slow_nap", {"seconds": 1.0}), ("slow_nap", {"seconds": 1.0}),
              *[("nap", {"seconds": 0.2})] * 3),
        echo_facts,
    )
    assert outcome.status == "completed"
    mine = lambda name: [e for e in fleet.ledger(name) if f":{handle.run_id}:" in e["task_id"]]  # noqa: E731
    slow = sorted(mine("slow_nap"), key=lambda e: e["at"])
    assert [e["event"] for e in slow] == ["start", "end", "start", "end"]  # never two at once
    quick_ends = [e["at"] for e in mine("nap") if e["event"] == "end"]
    assert len(quick_ends) == 3 and max(quick_ends) < slow[2]["at"]  # default flowed meanwhile


def test_driving_a_run_again_is_deduplicated_by_the_guard_but_a_reused_model_id_is_a_new_call(fleet: Fleet):
    """Reproduces on 4a34578 (the reused model id): the second ``call_dup`` of one turn got the
    first's result, its body never ran."""
    # Given the model sends two charges under one model id in one turn
    first = ToolCall("charge", {"order_id": "D-1", "amount": 5}, id="call_dup")
    second = ToolCall("charge", {"order_id": "D-2", "amount": 7}, id="call_dup")
    handle, outcome = run(fleet, calls(first, second), echo_facts, run_id="run_dedup")
    # Then they are two calls, and both ran
    assert outcome.value["text"] == "charged 5 for D-1 | charged 7 for D-2"
    mine = lambda: [e["call_id"] for e in fleet.ledger("charge") if ":run_dedup:" in e["call_id"]]
    assert len(set(mine())) == 2
    # When the same run is driven again with the same turn (a resume)
    again, outcome2 = run(fleet, calls(first, second), echo_facts, run_id="run_dedup")
    # Then each call is the same call: answered from the store, no body ran again
    assert outcome2.value["text"] == "charged 5 for D-1 | charged 7 for D-2"
    requested = lambda h: [e["data"]["call_id"] for e in h.events() if e["type"] == "aaa.tool.requested"]
    assert requested(again) == requested(handle) and len(set(requested(handle))) == 2
    assert len(mine()) == 2


def test_a_lost_at_most_once_call_reaches_the_model_as_outcome_unknown_verify_do_not_retry(fleet: Fleet):
    async def kill_the_process_running_it(engine: Engine, handle: RunHandle) -> None:
        entry = await until(lambda: fleet.ledger("hang", "start"), what="hang started")
        os.kill(entry[0]["pid"], signal.SIGKILL)  # a pool child of our own worker

    handle, outcome = run(fleet, calls(ToolCall("hang", {}, id="call_hang")), echo_facts,
                          during=kill_the_process_running_it)
    fact = facts(handle)["call_hang"]["data"]
    assert fact["error"] == "OutcomeUnknown"
    assert "may or may not have taken effect" in fact["message"]
    assert "Do not simply retry" in fact["message"] and "verify" in fact["message"]
    assert outcome.value["text"].startswith("OutcomeUnknown: ")
    assert len(fleet.ledger("hang", "start")) == 1  # never run again


# -- call identity and tenants on the fleet (issue 12) ---------------------------------------------


def test_a_model_that_says_call_0_every_turn_gets_every_call_run_on_the_fleet(fleet: Fleet):
    """Reproduces on 4a34578: the second turn's ``call_0`` was answered with the first turn's result."""
    handle, outcome = run(
        fleet,
        calls(ToolCall("charge", {"order_id": "E-1", "amount": 1}, id="call_0")),
        calls(ToolCall("charge", {"order_id": "E-2", "amount": 2}, id="call_0")),
        echo_facts,
    )
    assert outcome.value["text"] == "charged 1 for E-1 | charged 2 for E-2"
    started = [e for e in fleet.ledger("charge") if f":{handle.run_id}:" in e["call_id"]]
    assert [e["call_id"].split(":")[2][:3] for e in started] == ["0.0", "1.0"]  # turn 0, then turn 1


def test_two_tenants_with_equal_run_and_model_call_ids_never_share_a_call_on_the_fleet(fleet: Fleet):
    """Reproduces on 4a34578: tenant globex's call had acme's key ``r-tenants:call_0``; globex got
    acme's result (``"tenant": "acme"``) and its own call never ran."""
    who = ToolCall("whoami", {}, id="call_0")
    # Given acme and globex, from two engines (two web processes) on one Redis store and fleet
    handle_a, _ = run(fleet, calls(who), echo_facts, run_id="r-tenants", tenant="acme")
    # (a run id is one tenant's while the store holds its run, issue 21: once acme's record is
    # forgotten, globex may use the id, and its calls are still its own)
    app_store(fleet.client).forget_run(run_key("acme", "r-tenants"))
    handle_b, _ = run(fleet, calls(who), echo_facts, run_id="r-tenants", tenant="globex")
    # Then each ran its own call, and each one's result is its own
    value_a, value_b = facts(handle_a)["call_0"]["data"]["value"], facts(handle_b)["call_0"]["data"]["value"]
    assert (value_a["tenant"], value_b["tenant"]) == ("acme", "globex")
    call_a, call_b = value_a["call_id"], value_b["call_id"]
    assert call_a != call_b
    assert [e["tenant"] for e in fleet.ledger("whoami") if ":r-tenants:" in e["call_id"]] == ["acme", "globex"]
    store = app_store(fleet.client)
    assert store.result(call_a).value["tenant"] == "acme" and store.result(call_b).value["tenant"] == "globex"

    # and every read scoped to the wrong tenant sees nothing
    async def reads() -> None:
        async with Engine(app=fleet.client) as engine:
            for call, owner, other in ((call_a, "acme", "globex"), (call_b, "globex", "acme")):
                assert engine.call_result(call, tenant=owner).value["tenant"] == owner
                assert engine.call_result(call, tenant=other) is None
                assert engine.call_events(call, tenant=other) == []
                assert engine.call_result(call, tenant=None) is None

    asyncio.run(reads())


def test_a_forged_tenant_header_on_the_fleet_is_dropped_and_writes_nothing(fleet: Fleet):
    from aaa_celery.protocol import TENANT_HEADER

    handle, _ = run(fleet, calls(ToolCall("whoami", {}, id="call_0")), echo_facts, run_id="r-forged", tenant="acme")
    acme_call = ids(handle)["call_0"]
    store = app_store(fleet.client)
    before = [e.id for e in store.events(acme_call)]
    # When a plain send names globex on acme's call id
    fleet.client.tasks["aaa.tool.whoami"].apply_async(kwargs={"arguments": {}}, task_id=acme_call,
                                                      headers={TENANT_HEADER: "globex"})
    deadline = time.monotonic() + 30
    while "does not belong to the tenant" not in fleet.workers[0].log:  # refused before it was run
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.1)
    # Then it never ran, and acme's record and Celery result are untouched
    assert [e["tenant"] for e in fleet.ledger("whoami") if e["call_id"] == acme_call] == ["acme"]
    assert [e.id for e in store.events(acme_call)] == before
    assert fleet.client.AsyncResult(acme_call).result["tenant"] == "acme"
