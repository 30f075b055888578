"""One run id in two tenants (issue 21, item 5): refused at start, and never a 500 or a hidden
approval for anyone, on one Redis store shared by several engines.

Reproduces on c79799f: the docs allowed two engines to start the same run id for two
tenants. Once they did, ``/aaa/approvals`` answered 500 to every user of every tenant
(``KeyError: names runs of several tenants``), both runs' pages answered 404, and a process
that drove one of the runs hid the other's approvals.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from celery import Celery

from aaa_celery import open_store
from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ConfigError
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import Engine
from aaa_celery.stores.runs import run_key
from aaa_celery.tools import ToolHandler, ToolRegistry, tool

from .conftest import call_then_echo, until

pytestmark = [pytest.mark.redis]
flask = pytest.importorskip("flask")


@tool(requires_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order (a person approves)."""
    return f"refunded {amount} for {order}"


TOOLS = ToolRegistry([refund])


def attach(engine: Engine) -> Engine:
    LLMHandler(FakeLLMClient(call_then_echo(("refund", {"order": "A-1", "amount": 500})))).attach(engine)
    ToolHandler(TOOLS).attach(engine)
    return engine


def test_a_run_id_of_another_tenant_in_the_store_is_refused_at_start(redis_url):
    async def main() -> None:
        async with Engine(store=open_store(redis_url)) as a, Engine(store=open_store(redis_url)) as b:
            handle = attach(a).start(ToolLoop(TOOLS), {"task": "refund"}, run_id="shared", tenant="a")
            await until(handle.pending_approvals, what="a's approval")
            # Given tenant a's run "shared" in the store, When another engine starts "shared" for b
            with pytest.raises(ConfigError, match="another tenant"):
                attach(b).start(ToolLoop(TOOLS), {"task": "refund"}, run_id="shared", tenant="b")
            # Then nothing of b's is there, and a's run is whole
            assert [r.tenant for r in a.store.find_runs("shared")] == ["a"]
            assert len(a.pending_approvals()) == 1
            handle.cancel()

    asyncio.run(main())


def test_runs_of_one_id_in_two_tenants_break_no_page_and_hide_no_approval(redis_url):
    """Two tenants' runs of one id (a store written by an older release, or two starts that
    raced): every route still answers, each run is reachable, no approval is hidden."""
    store = open_store(redis_url)

    async def drive_a_and_copy_it_for_b() -> tuple[Engine, Any]:
        a = attach(Engine(store=open_store(redis_url)))
        handle = a.start(ToolLoop(TOOLS), {"task": "refund"}, run_id="twin", tenant="a")
        await until(handle.pending_approvals, what="a's approval")
        record = store.get_run(run_key("a", "twin"))
        twin = dataclasses.replace(record, tenant="b", holder=None, approvals={
            cid.replace("a:", "b:", 1): {**req, "tenant": "b", "call_id": cid.replace("a:", "b:", 1)}
            for cid, req in record.approvals.items()})
        store.put_run(twin)
        return a, handle

    loop = asyncio.new_event_loop()
    a, handle = loop.run_until_complete(drive_a_and_copy_it_for_b())
    try:
        # the engine that drives a's run still lists b's approval
        tenants = sorted(p.tenant for p in a.pending_approvals())
        assert tenants == ["a", "b"], tenants
        # a web app on the same store: every route answers, none with a 500
        from aaa_celery.contrib.flask import AAACelery

        fleet = Celery("twin", broker="memory://", backend="cache+memory://")
        fleet.conf.update(aaa_store_url=redis_url, accept_content=["json"], task_serializer="json",
                          result_serializer="json", worker_prefetch_multiplier=1)
        web = flask.Flask("twin")
        web.config.update(SECRET_KEY="t", TESTING=True, AAA_CELERY_APP=fleet, AAA_CELERY_TOOLS=ToolHandler(TOOLS),
                          AAA_CELERY_LLM=FakeLLMClient([]),
                          AAA_CELERY_AUTHORIZE=lambda request, run, call: run is None or
                          run.tenant == request.headers.get("X-Tenant"),
                          AAA_CELERY_TENANT=lambda request: request.headers.get("X-Tenant"))
        ext = AAACelery(web)
        try:
            client = web.test_client()
            for tenant in ("a", "b"):
                r = client.get("/aaa/approvals", headers={"X-Tenant": tenant})
                assert r.status_code == 200, r.get_data(as_text=True)
                assert [p["tenant"] for p in r.get_json()["approvals"]] == [tenant]
                # each tenant reaches its own run of that id
                r = client.get("/aaa/runs/twin/events", headers={"X-Tenant": tenant})
                assert r.status_code == 200, r.get_data(as_text=True)
                assert r.get_json()["tenant"] == tenant
        finally:
            ext.close(web)
    finally:
        handle.cancel()
        loop.run_until_complete(a.aclose())
        loop.close()
        store.close()
