"""MCP annotations and the delivery policy, both ways, and the config errors at definition
(no server, no fleet)."""

from __future__ import annotations

import pytest
from celery import Celery

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.contrib.mcp import GuardedMCPServer, Hints, RemoteServer, advertised, annotate, delivery_for, remote_tool
from aaa_celery.errors import ConfigError
from aaa_celery.tools import ToolHandler, ToolRegistry, tool


def test_annotations_decide_the_delivery_of_a_tool_without_one() -> None:
    assert delivery_for(Hints(read_only=True)) == Delivery.AT_LEAST_ONCE
    assert delivery_for(Hints(idempotent=True)) == Delivery.AT_LEAST_ONCE
    assert delivery_for(Hints()) == Delivery.AT_MOST_ONCE  # the spec's defaults
    assert delivery_for(Hints.from_wire(None)) == Delivery.AT_MOST_ONCE
    assert delivery_for(Hints.from_wire({"destructiveHint": False})) == Delivery.AT_MOST_ONCE  # not idempotent


def test_what_a_tool_advertises_follows_its_delivery() -> None:
    most = advertised(GuardConfig(delivery="at_most_once"), Hints(idempotent=True, read_only=True))
    assert (most.read_only, most.destructive, most.idempotent) == (False, True, False)
    least = advertised(GuardConfig(delivery="at_least_once"), None)
    assert (least.read_only, least.destructive, least.idempotent) == (False, True, True)
    read = advertised(GuardConfig(delivery="at_least_once"), Hints(read_only=True, title="Look up"))
    assert read.to_wire() == {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True,
                              "openWorldHint": True, "title": "Look up"}


def test_annotate_sets_the_delivery_only_where_the_tool_has_none() -> None:
    @tool
    def read(x: int) -> int:
        return x

    @tool(delivery="at_least_once")
    def write(x: int) -> int:
        return x

    handler = ToolHandler(ToolRegistry([annotate(read, read_only=True), annotate(write)]))
    assert handler.config_for(read).delivery == Delivery.AT_LEAST_ONCE
    assert handler.config_for(write).delivery == Delivery.AT_LEAST_ONCE  # explicit wins


def test_contradictory_annotations_fail_at_definition_naming_the_fix() -> None:
    @tool(requires_approval=True)
    def approve_me(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="readOnlyHint with requires_approval"):
        annotate(approve_me, read_only=True)

    @tool(delivery="at_most_once")
    def once(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="contradicts readOnlyHint/idempotentHint"):
        annotate(once, idempotent=True)


def test_a_served_tool_without_a_delivery_of_its_own_is_refused_naming_the_fix() -> None:
    @tool
    def refund(order_id: str) -> str:
        return order_id

    handler = ToolHandler(ToolRegistry([refund]))
    app = Celery("t", broker="memory://", backend="cache+memory://")
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"], aaa_store_url="memory://",
                    worker_prefetch_multiplier=1)
    handler.bind(app)
    with pytest.raises(ConfigError, match=r"annotate\(refund"):
        GuardedMCPServer(handler, app)
    annotate(refund)
    assert GuardedMCPServer(handler, app).tools()[0].annotations.destructive_hint is True


def test_an_untrusted_servers_annotations_are_not_believed_and_pins_win() -> None:
    read = {"readOnlyHint": True}
    untrusted = RemoteServer("shop", "http://127.0.0.1:1/mcp")
    assert untrusted.delivery("balance", read) == Delivery.AT_MOST_ONCE
    trusted = RemoteServer("shop", "http://127.0.0.1:1/mcp", trusted=True, pins={"pay": "at_most_once"})
    assert trusted.delivery("balance", read) == Delivery.AT_LEAST_ONCE
    assert trusted.delivery("pay", read) == Delivery.AT_MOST_ONCE
    everything = RemoteServer("shop", "http://127.0.0.1:1/mcp", pins={"*": "at_least_once"})
    assert everything.delivery("anything") == Delivery.AT_LEAST_ONCE
    handler = ToolHandler(ToolRegistry([remote_tool(untrusted, "balance", annotations=read)]))
    assert handler.config_for(handler.registry["shop_balance"]).delivery == Delivery.AT_MOST_ONCE


@pytest.mark.parametrize("kwargs, field", [
    ({"name": "a b", "url": "http://x/mcp"}, "RemoteServer.name"),
    ({"name": "a", "url": "ftp://x"}, "RemoteServer.url"),
    ({"name": "a", "url": "http://x/mcp", "pins": {"pay": "twice"}}, "delivery"),
    ({"name": "a", "url": "http://x/mcp", "tries": 0}, "RemoteServer.tries"),
])
def test_bad_remote_server_config_fails_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        RemoteServer(**kwargs)  # type: ignore[arg-type]


def test_tasks_get_and_cancel_refuse_a_call_of_another_tenant_or_run() -> None:
    import anyio
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from aaa_celery.contrib.mcp import cancel_task, get_task
    from aaa_celery.protocol import call_id

    @tool(delivery="at_most_once")
    def pay(to: str) -> str:
        return to

    handler = ToolHandler(ToolRegistry([pay]))
    app = Celery("t2", broker="memory://", backend="cache+memory://")
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                    aaa_store_url="memory://", worker_prefetch_multiplier=1)
    handler.bind(app)
    server = GuardedMCPServer(handler, app, tenant="acme")
    mine = server.call_id_for(pay, {"to": "x"})
    assert server.owns(mine)
    foreign = [call_id("globex", "mcp", mine.rsplit(":", 1)[1]), call_id("acme", "other", "mcp.0"),
               call_id("acme", "mcp", "engine.0"), "plain-uuid"]

    async def main() -> list[str]:
        refused = []
        async with Client(server.server) as client:
            for task_id in foreign:
                for verb in (get_task, cancel_task):
                    with pytest.raises(MCPError) as e:
                        await verb(client.session, task_id)
                    refused.append(e.value.message)
        return refused

    assert all(m.startswith("unknown task") for m in anyio.run(main))
    with pytest.raises(ValueError, match="not a call of this server"):
        server.approve(foreign[0], by="ops")
