"""``AgentTools`` without a fleet: the tools the SDK is handed, and bad configuration named early."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Runner, UserError
from celery import Celery

from aaa_celery.contrib.openai_agents import AgentTools
from aaa_celery.errors import ConfigError

from ..llm.stub_server import StubModelServer
from . import agents_app as aa
from .agent import Script, guarded


def app() -> Celery:
    celery = Celery("agents-adapter", broker="memory://", backend="cache+memory://")
    celery.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                       worker_prefetch_multiplier=1, aaa_store_url="memory://agents-adapter")
    return celery


def test_each_tool_is_a_function_tool_with_the_function_s_schema_and_approval():
    tools = {t.name: t for t in AgentTools(app(), aa.handler()).function_tools()}
    assert sorted(tools) == ["lookup", "refund", "search", "transfer"]
    assert "ctx" not in tools["lookup"].params_json_schema["properties"]  # the guard's context is no argument
    refund = tools["refund"]
    assert refund.description.startswith("Refund an order")
    assert refund.params_json_schema["required"] == ["order_id", "amount"]
    assert refund.params_json_schema["properties"]["amount"]["type"] == "integer"
    assert refund.strict_json_schema and not refund.needs_approval
    assert tools["transfer"].needs_approval is True


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"raise_on": {"Nope"}}, "raise_on"),
    ({"raise_on": "OutcomeUnknown"}, "raise_on"),
    ({"failure_error_function": "text"}, "failure_error_function"),
    ({"approval_ttl_s": 0}, "approval_ttl_s"),
])
def test_bad_configuration_fails_at_construction_naming_the_field(kwargs: dict[str, Any], named: str):
    with pytest.raises(ConfigError, match=named):
        AgentTools(app(), aa.handler(), **kwargs)


def test_an_unknown_tool_name_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="refund"):
        AgentTools(app(), aa.handler()).function_tools(["refnud"])


def test_a_tool_called_outside_a_guarded_run_fails_the_run_naming_the_fix():
    guard = AgentTools(app(), aa.handler())
    with StubModelServer("openai", Script([("c1", "search", {"query": "x"})])) as server:
        with pytest.raises(UserError, match=r"with agent_tools.run\(run_id="):
            asyncio.run(Runner.run(guarded(guard, server.base_url), "go"))
