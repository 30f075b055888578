"""Call identity is the engine's, and tenants are part of it (issue 12, items 1 and 2), on
the embedded engine.

The model's ``tool_call_id`` only threads the transcript: two model calls are two calls
whatever ids the model gave them, and a tenant never reads another tenant's call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ConfigError
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMRequest, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.runtime import APPROVAL_GRANTED, Engine, RunHandle
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.runs import run_key
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool

from .conftest import until

ran: list[dict[str, Any]] = []


@tool
def lookup(order_id: str, ctx: ToolContext) -> str:
    """Look an order up."""
    ran.append({"tool": "lookup", "order_id": order_id, "call_id": ctx.call_id, "tenant": ctx.tenant})
    return f"order {order_id}: paid"


@tool(requires_approval=True, delivery="at_most_once")
def wire(to: str, amount: int, ctx: ToolContext) -> str:
    """Wire money (a person approves)."""
    ran.append({"tool": "wire", "to": to, "call_id": ctx.call_id})
    return f"wired {amount} to {to}"


@tool
def whoami(ctx: ToolContext) -> str:
    """Say whose call this is."""
    ran.append({"tool": "whoami", "tenant": ctx.tenant, "call_id": ctx.call_id, "run_id": ctx.run_id})
    return f"tenant={ctx.tenant} run={ctx.run_id}"


REGISTRY = ToolRegistry([lookup, wire, whoami])


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def turns(*responses: LLMResponse) -> FakeLLMClient:
    """A model answering turn n with ``responses[n]``, then with every tool message joined."""
    queue = list(responses)

    def model(request: LLMRequest) -> LLMResponse:
        if queue:
            return queue.pop(0)
        return text(" | ".join(m.content for m in request.messages if m.role == "tool"))

    return FakeLLMClient(model)


def calls(*items: ToolCall) -> LLMResponse:
    return LLMResponse(tool_calls=items)


async def drive(engine: Engine, model: FakeLLMClient, during: Any = None, **start: Any) -> tuple[RunHandle, Any]:
    LLMHandler(model).attach(engine)
    ToolHandler(REGISTRY).attach(engine)
    handle = engine.start(ToolLoop(REGISTRY), {"task": "go"}, **start)
    if during is not None:
        await during(handle)
    return handle, await asyncio.wait_for(handle.result(), 30)


def requested(handle: RunHandle) -> list[dict[str, Any]]:
    return [e["data"] for e in handle.events() if e["type"] == "aaa.tool.requested"]


# -- item 1: the model's id is not the call's identity -----------------------------------------


def test_a_model_that_numbers_calls_per_turn_gets_every_later_call_run():
    """Reproduces on 4a34578: the second ``call_0`` got the first one's recorded result
    (``order A-1: paid`` twice) and its body never ran."""
    model = turns(
        calls(ToolCall("lookup", {"order_id": "A-1"}, id="call_0")),
        calls(ToolCall("lookup", {"order_id": "B-2"}, id="call_0")),
    )

    async def go() -> tuple[RunHandle, Any]:
        async with Engine() as engine:
            return await drive(engine, model)

    handle, outcome = asyncio.run(go())
    assert outcome.value["text"] == "order A-1: paid | order B-2: paid"
    assert [r["order_id"] for r in ran] == ["A-1", "B-2"]
    # two calls of our own, each threaded back to the model's (reused) id
    first, second = requested(handle)
    assert first["tool_call_id"] == second["tool_call_id"] == "call_0"
    assert first["call_id"] != second["call_id"]
    assert [r["call_id"] for r in ran] == [first["call_id"], second["call_id"]]


def test_two_calls_sharing_one_model_id_in_one_turn_are_two_calls_each_approved_on_its_own():
    """Reproduces on 4a34578: the second pending approval overwrote the first under the key
    ``<run>:call_0``; the first call then waited forever and the run hung."""
    model = turns(calls(
        ToolCall("wire", {"to": "ACME", "amount": 10}, id="call_0"),
        ToolCall("wire", {"to": "EMCA", "amount": 20}, id="call_0"),
        ToolCall("lookup", {"order_id": "C-3"}, id="call_0"),
    ))

    async def approve_both(handle: RunHandle) -> None:
        pending = await until(lambda: len(handle.pending_approvals()) == 2 and handle.pending_approvals(),
                              timeout_s=10, what="both wire calls wait for a person")
        assert sorted(p.arguments["to"] for p in pending) == ["ACME", "EMCA"]
        assert len({p.call_id for p in pending}) == 2
        for p in pending:
            handle.signal(APPROVAL_GRANTED, {"call_id": p.call_id, "digest": p.digest})

    async def go() -> tuple[RunHandle, Any]:
        async with Engine() as engine:
            return await drive(engine, model, approve_both)

    handle, outcome = asyncio.run(go())
    assert outcome.value["text"] == "wired 10 to ACME | wired 20 to EMCA | order C-3: paid"
    assert sorted(r.get("to") or r.get("order_id") for r in ran) == ["ACME", "C-3", "EMCA"]
    assert len({e["call_id"] for e in requested(handle)}) == 3


def test_a_model_id_that_is_too_long_or_forges_a_log_line_never_stops_the_call():
    # the model's id only threads the transcript: an unusable one is left out of the message
    model = turns(calls(ToolCall("whoami", {}, id="c" * 2000), ToolCall("lookup", {"order_id": "F-6"}, id="x\nINFO forged")))

    async def go() -> tuple[RunHandle, Any]:
        async with Engine() as engine:
            return await drive(engine, model)

    handle, outcome = asyncio.run(go())
    assert outcome.value["text"] == f"tenant=None run={handle.run_id} | order F-6: paid"
    assert [e["tool_call_id"] for e in requested(handle)] == ["c" * 2000, "x\nINFO forged"]


# -- item 2: tenants ----------------------------------------------------------------------------


def test_two_tenants_with_equal_run_and_model_call_ids_have_separate_calls_on_one_memory_store():
    """Reproduces on 4a34578: tenant B's call had the key ``r-shared:call_0`` of tenant A's,
    so B got A's recorded result (``tenant=acme``) and B's own call never ran."""
    store = MemoryStore()

    async def go(tenant: str) -> tuple[RunHandle, Any]:
        async with Engine(store=store) as engine:  # two engines (two web processes), one store
            return await drive(engine, turns(calls(ToolCall("whoami", {}, id="call_0"))),
                               run_id="r-shared", tenant=tenant)

    handle_a, outcome_a = asyncio.run(go("acme"))
    # a run id is one tenant's while the store holds its run (issue 21: test_run_id_tenants.py);
    # once A's run record is gone (forgotten), B may use the id, and its calls are still its own
    store.forget_run(run_key("acme", "r-shared"))
    handle_b, outcome_b = asyncio.run(go("globex"))
    assert outcome_a.value["text"] == "tenant=acme run=r-shared"
    assert outcome_b.value["text"] == "tenant=globex run=r-shared"
    assert [r["tenant"] for r in ran] == ["acme", "globex"]  # each body ran, once
    [call_a], [call_b] = requested(handle_a), requested(handle_b)
    assert call_a["call_id"] != call_b["call_id"]
    assert store.result(call_a["call_id"]).value != store.result(call_b["call_id"]).value


def test_reads_with_the_wrong_tenant_see_nothing():
    # Given a run of tenant acme that made one call and waits on a second (an approval)
    model = turns(calls(ToolCall("whoami", {}, id="call_0"), ToolCall("wire", {"to": "X", "amount": 1}, id="call_1")))

    engines: list[Engine] = []

    async def check(handle: RunHandle) -> None:
        [engine] = engines
        [pending] = await until(handle.pending_approvals, what="the wire call waits")
        done = await until(lambda: [e["data"]["call_id"] for e in handle.events() if e["type"] == "aaa.tool.completed"])
        # Then acme (and an operator, who names no tenant) sees the run, the approval and the call
        assert engine.get(handle.run_id, tenant="acme") is handle is engine.get(handle.run_id)
        assert engine.pending_approvals(tenant="acme") == [pending] == engine.pending_approvals()
        assert [e.type for e in engine.call_events(done[0], tenant="acme")] == ["aaa.tool.started",
                                                                                 "aaa.tool.completed"]
        assert engine.call_result(done[0], tenant="acme").ok
        # and every read scoped to another tenant, or to no tenant, sees nothing
        for other in ("globex", None):
            with pytest.raises(KeyError):
                engine.get(handle.run_id, tenant=other)
            assert engine.pending_approvals(tenant=other) == []
            assert engine.call_events(done[0], tenant=other) == []
            assert engine.call_result(done[0], tenant=other) is None
        handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest})

    async def go() -> tuple[RunHandle, Any]:
        async with Engine() as engine:
            engines.append(engine)
            return await drive(engine, model, check, tenant="acme")

    asyncio.run(go())


def test_sync_engine_reads_are_scoped_by_tenant_too():
    from aaa_celery.runtime import SyncEngine

    with SyncEngine() as sync:
        LLMHandler(turns(calls(ToolCall("whoami", {}, id="call_0")))).attach(sync)
        ToolHandler(REGISTRY).attach(sync)
        handle = sync.start(ToolLoop(REGISTRY), {"task": "go"}, tenant="acme", run_id="r-sync")
        handle.result(timeout=30)
        assert sync.get("r-sync", tenant="acme").run_id == "r-sync"
        with pytest.raises(KeyError):
            sync.get("r-sync", tenant="globex")
        assert [h.run_id for h in sync.runs(tenant="acme")] == ["r-sync"]
        assert sync.runs(tenant="globex") == [] and sync.pending_approvals(tenant="globex") == []


def test_a_run_id_cannot_be_reused_for_another_tenant():
    """Reproduces on 4a34578: once tenant acme's run ``r-1`` had ended, tenant globex could start
    ``r-1`` on the same engine, and got acme's recorded results."""

    async def go() -> None:
        async with Engine() as engine:
            handle, _ = await drive(engine, turns(calls(ToolCall("whoami", {}, id="call_0"))),
                                    run_id="r-1", tenant="acme")
            with pytest.raises(ConfigError, match="another tenant"):
                engine.start(ToolLoop(REGISTRY), {"task": "go"}, run_id="r-1", tenant="globex")
            with pytest.raises(ConfigError, match="another tenant"):
                engine.start(ToolLoop(REGISTRY), {"task": "go"}, run_id="r-1")  # no tenant is not acme either
            assert engine.get("r-1") is handle

    asyncio.run(go())


@pytest.mark.parametrize(
    ("start", "message"),
    [
        ({"tenant": "acme\ninjected"}, "tenant must not contain control"),
        ({"tenant": ""}, "tenant must not be empty"),
        ({"tenant": "t" * 129}, "tenant is 129 bytes long"),
        ({"run_id": "r\r1"}, "run id must not contain control"),
        ({"run_id": "r\u202e1"}, "run id must not contain control or format"),
        ({"run_id": "é" * 129}, "run id is 258 bytes long"),
        ({"run_id": "r\ud800"}, "run id must not contain"),
        ({"tenant": 7}, "tenant must be a str"),
    ],
)
def test_hostile_tenants_and_run_ids_are_refused_at_start_with_a_clear_error(start: dict[str, Any], message: str):
    from aaa_celery.errors import InvalidId

    async def go() -> None:
        async with Engine() as engine:
            LLMHandler(turns()).attach(engine)
            with pytest.raises(InvalidId, match=message):
                engine.start(ToolLoop(REGISTRY), {"task": "go"}, **start)
            assert engine.runs == {}

    asyncio.run(go())


def test_driving_a_run_again_finds_each_recorded_call_and_runs_only_new_ones():
    # Given a run that looked an order up
    store = MemoryStore()

    async def go(order_id: str) -> tuple[RunHandle, Any]:
        async with Engine(store=store) as engine:
            return await drive(engine, turns(calls(ToolCall("lookup", {"order_id": order_id}, id="call_0"))),
                               run_id="r-again", tenant="acme")

    first, _ = asyncio.run(go("A-1"))
    # When the same run is driven again with the same model turn (a resume), the call is the
    # same call: its recorded result comes back, the body does not run again
    again, outcome = asyncio.run(go("A-1"))
    assert outcome.value["text"] == "order A-1: paid"
    assert requested(again)[0]["call_id"] == requested(first)[0]["call_id"]
    assert [r["order_id"] for r in ran] == ["A-1"]
    # and another call in the same place (same turn, position and model id) is another call
    other, outcome = asyncio.run(go("B-2"))
    assert outcome.value["text"] == "order B-2: paid"
    assert requested(other)[0]["call_id"] != requested(first)[0]["call_id"]
    assert [r["order_id"] for r in ran] == ["A-1", "B-2"]


# -- the worker: a header never forges a tenant ---------------------------------------------------


def test_a_message_whose_tenant_header_names_another_tenant_is_dropped_without_touching_any_record():
    # Given acme's finished call, on the embedded fleet
    from aaa_celery.protocol import RUN_HEADER, TENANT_HEADER, call_id, task_name

    async def go() -> None:
        async with Engine() as engine:
            handle, _ = await drive(engine, turns(calls(ToolCall("whoami", {}, id="call_0"))),
                                    run_id="r-forge", tenant="acme")
            [acme_call] = [e["call_id"] for e in requested(handle)]
            task = engine.app.tasks[task_name("whoami")]
            before = [e.id for e in engine.store.events(acme_call)]

            # When a plain send names globex in its tenant header on acme's call id
            forged = task.apply_async(kwargs={"arguments": {}}, task_id=acme_call,
                                      headers={TENANT_HEADER: "globex", RUN_HEADER: "r-forge"})
            # or a plain send with a tenant header on an id that holds no tenant, or another run's
            unscoped = task.apply_async(kwargs={"arguments": {}}, task_id="plain-1", headers={TENANT_HEADER: "acme"})
            other_run = task.apply_async(kwargs={"arguments": {}}, task_id=acme_call, headers={RUN_HEADER: "r-2"})
            # or unusable headers on acme's call id (no FAILURE may land under acme's id)
            bad_headers = [task.apply_async(kwargs={"arguments": {}}, task_id=acme_call, headers=h)
                           for h in ({TENANT_HEADER: ""}, {TENANT_HEADER: "acme\n"}, {RUN_HEADER: 7})]
            # and a good one: a tenant's call id minted for it
            good_id = call_id("globex", "billing")
            good = task.apply_async(kwargs={"arguments": {}}, task_id=good_id, headers={TENANT_HEADER: "globex"})
            assert (await asyncio.to_thread(good.get, timeout=20)) == "tenant=globex run=billing"

            # Then the forged ones never ran, wrote nothing to the store nor to the result backend
            await asyncio.sleep(0.5)
            assert [r for r in ran if r["tool"] == "whoami"] == [
                {"tool": "whoami", "tenant": "acme", "call_id": acme_call, "run_id": "r-forge"},
                {"tool": "whoami", "tenant": "globex", "call_id": good_id, "run_id": "billing"},
            ]
            assert [e.id for e in engine.store.events(acme_call)] == before
            assert engine.store.events("plain-1") == [] and engine.store.result("plain-1") is None
            assert unscoped.state == "PENDING"
            assert forged.state == other_run.state == "SUCCESS"  # acme's own result, untouched
            assert {r.state for r in bad_headers} == {"SUCCESS"}
            assert forged.result == "tenant=acme run=r-forge"

    asyncio.run(go())


def test_the_longest_tenant_and_run_id_make_a_call_id_every_layer_accepts():
    # a 128-byte tenant and a 256-byte run id (every byte escaped): a call id of ~1000 characters
    tenant, run_id = "t:" * 64, "é" * 128

    async def go() -> tuple[RunHandle, Any]:
        async with Engine() as engine:
            return await drive(engine, turns(calls(ToolCall("whoami", {}, id="call_0"))), tenant=tenant, run_id=run_id)

    handle, outcome = asyncio.run(go())
    assert outcome.value["text"] == f"tenant={tenant} run={run_id}"
    [call] = requested(handle)
    assert len(call["call_id"]) > 900 and ran[0]["call_id"] == call["call_id"]
