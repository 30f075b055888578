"""Calling a bound tool from Python: ``handler.task(name)`` is a Celery task handle; a
direct call of a ``Tool`` runs it unguarded with a marked context."""

from __future__ import annotations

import asyncio
import time

import pytest
from celery import Celery, chain, group

from aaa_celery.errors import ConfigError, ToolArgsError
from aaa_celery.testing import wait_for
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool
from aaa_celery.worker import app_store

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_a_tool_sent_through_its_handle_runs_guarded_on_the_fleet(compat):
    handle = compat.app.tools_handler.task("refund")
    result = handle.delay(order_id="A-1", amount=30)
    assert result.get(timeout=20) == {"order_id": "A-1", "amount": 30, "attempt": 1, "guarded": True}
    assert [e.type for e in app_store(compat.app).events(result.id)] == ["aaa.tool.started", "aaa.tool.completed"]
    later = handle.apply_async({"order_id": "A-2", "amount": 5}, countdown=1)
    assert later.get(timeout=20)["order_id"] == "A-2"


def test_tool_handles_compose_in_canvas_and_revoke_like_tasks(compat):
    handle = compat.app.tools_handler.task("refund")
    describe = compat.app.tasks["compat.describe"]
    assert chain(handle.s(order_id="C-1", amount=7), describe.s()).apply_async().get(timeout=30) == "C-1:7"
    values = group(handle.s(order_id=f"G-{i}", amount=i) for i in range(3)).apply_async().get(timeout=30)
    assert [(v["order_id"], v["amount"], v["guarded"]) for v in values] == [(f"G-{i}", i, True) for i in range(3)]
    linked = handle.apply_async({"order_id": "L-1", "amount": 2}, link=describe.s())
    assert linked.get(timeout=20)["order_id"] == "L-1"
    child = wait_for(lambda: linked.children, 20, "the linked call was sent")[0]
    assert child.get(timeout=20) == "L-1:2"
    later = handle.apply_async({"order_id": "R-1", "amount": 1}, countdown=3)
    later.revoke()
    wait_for(lambda: later.state == "REVOKED", 20, "Celery revoked the tool call")
    time.sleep(5.0)  # past its countdown and two recovery sweeps
    assert compat.starts(later.id) == []


def test_wrong_arguments_fail_at_send_time_and_nothing_is_published_or_stored():
    app = Celery("handles", broker="memory://", set_as_current=False)
    app.conf.update(aaa_store_url="memory://handles-test", accept_content=["json"])

    @tool
    def refund(order_id: str, amount: int) -> str:
        """Refund."""
        return order_id

    handler = ToolHandler(ToolRegistry([refund]))
    with pytest.raises(ConfigError, match="bind the handler"):
        handler.task("refund")
    handler.bind(app)
    with pytest.raises(ConfigError, match="no such tool"):
        handler.task("nope")
    sent = []
    from celery.signals import before_task_publish

    def spy(sender=None, **_):
        sent.append(sender)

    before_task_publish.connect(spy)
    try:
        with pytest.raises(ToolArgsError, match="amount"):
            handler.task("refund").delay(order_id="A-1", amount="lots")
        with pytest.raises(ToolArgsError, match="extra|Extra"):
            handler.task("refund").delay(order_id="A-1", amount=1, evil=True)
    finally:
        before_task_publish.disconnect(spy)
    assert sent == []
    assert app_store(app).expired(unclaimed_grace_s=0) == []


def test_a_direct_call_of_a_tool_is_unguarded_and_says_so():
    seen = []

    @tool
    def probe(x: int, ctx: ToolContext) -> int:
        """Probe."""
        seen.append(ctx)
        return x * 2

    assert asyncio.run(probe(x=21)) == 42
    [ctx] = seen
    assert ctx is not None and ctx.guarded is False and ctx.meta == {"unguarded": True}
