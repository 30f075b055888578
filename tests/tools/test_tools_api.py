"""The spec's aaa.tools surface: names, schema, config merging."""

from __future__ import annotations

import inspect

import pytest

import aaa_celery
import aaa_celery.tools as tools
from aaa_celery.config import Delivery, LostLease
from aaa_celery.errors import ConfigError, ToolArgsError
from aaa_celery.tools import GuardConfig, Tool, ToolContext, ToolHandler, ToolRegistry, tool


def test_public_names_of_aaa_celery_tools_are_frozen():
    assert sorted(tools.__all__) == sorted(
        [
            "Tool", "ToolRegistry", "tool", "search_tool", "Index", "Secret",
            "Happened", "NotHappened",  # issue 14: a reconcile step's answers
            "ToolHandler", "ToolContext",
            "GuardConfig", "Delivery", "LostLease", "RetryPolicy", "GuardPolicy",
            "ToolError", "ToolArgsError", "OutcomeUnknown", "ExecutionAbandoned", "PolicyDenied",
        ]
    )
    for name in tools.__all__:
        assert getattr(tools, name) is not None


def test_public_names_of_aaa_celery_are_frozen():
    assert sorted(aaa_celery.__all__) == sorted(
        [
            "GuardedTask", "install", "open_store", "Store",
            "GuardConfig", "Delivery", "LostLease", "RetryPolicy", "GuardPolicy", "ToolContext",
            "AAACeleryError", "ConfigError", "ToolError", "ToolArgsError", "ToolTimeout",
            "OutcomeUnknown", "ExecutionAbandoned", "PolicyDenied", "StoreError", "StoreUnavailable",
            "CallSkipped",  # issue 40: a call skipped for want of a concurrency slot
        ]
    )


def test_public_names_of_aaa_celery_runtime_and_testing_are_frozen():
    import aaa_celery.runtime as runtime
    import aaa_celery.testing as testing

    assert sorted(runtime.__all__) == sorted(
        [
            "Engine", "RunHandle", "RunOutcome", "ToolFact", "ANY_TENANT",
            "SyncEngine", "SyncRunHandle",
            "PendingApproval", "APPROVAL_GRANTED", "APPROVAL_DENIED",
        ]
    )
    assert sorted(testing.__all__) == sorted(
        [
            "Call", "EffectLedger", "Violation", "check_history", "Fleet", "Frozen", "Ledger",
            "WorkerProcess", "duplicate_delivery", "freeze", "kill9", "kill_child", "pid_alive",
            "pool_children", "wait_for",
        ]
    )


def test_public_names_of_aaa_celery_worker_are_frozen():
    import aaa_celery.worker as worker

    assert sorted(worker.__all__) == [
        "GuardedTask", "RecoveryStep", "app_store", "attach", "check_settings", "install",
        "registered_together", "store_url", "use_store",
    ]
    params = inspect.signature(worker.registered_together).parameters
    assert {k: p.default for k, p in params.items()} == {"max_calls": 100, "max_delay_s": 0.1}


def test_public_names_and_signatures_of_the_effects_api_are_frozen():
    # issue 24: effects applied once in the app's own database transaction
    import aaa_celery.contrib.django.effects as django_effects
    import aaa_celery.effects as effects
    from aaa_celery.fencing import StaleFence

    assert sorted(effects.__all__) == ["EffectLog", "StaleFence", "once"]
    assert effects.StaleFence is StaleFence
    # issue 35: records per tenant and tool; shared= (keyword only) lets tools share them
    assert list(inspect.signature(effects.once).parameters) == ["db", "ctx", "fn", "shared"]
    assert list(inspect.signature(effects.EffectLog.once).parameters) == ["self", "db", "ctx", "fn", "shared"]
    assert list(inspect.signature(effects.EffectLog.upgrade).parameters) == ["self", "bind"]
    log = inspect.signature(effects.EffectLog).parameters
    assert {k: p.default for k, p in log.items()} == {
        "metadata": None, "table": "aaa_effects", "fences_table": "aaa_effect_fences"}
    assert django_effects.__all__ == ["once"]
    params = inspect.signature(django_effects.once).parameters
    assert list(params) == ["ctx", "fn", "using", "shared"]
    for name in ("using", "shared"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None
    assert inspect.signature(effects.once).parameters["shared"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("module", ["aaa_celery", "aaa_celery.tools", "aaa_celery.runtime", "aaa_celery.testing"])
def test_dir_of_a_public_package_shows_only_its_public_names(module):
    # issue 19: dir(aaa_celery) showed typing's Any and TYPE_CHECKING and every submodule
    # imported so far (config, errors, stores...); a user's tab completion offered them all.
    import importlib

    mod = importlib.import_module(module)
    importlib.import_module("aaa_celery.lifecycle")  # a submodule imported later is no public name either
    shown = [n for n in dir(mod) if not n.startswith("__")]
    assert shown == sorted(mod.__all__)
    for name in mod.__all__:
        assert getattr(mod, name) is not None
    # the submodules stay importable and reachable as attributes, as before
    assert importlib.import_module("aaa_celery.config").GuardConfig is aaa_celery.config.GuardConfig


def test_signatures_and_defaults_match_the_spec():
    sig = inspect.signature(Tool)
    defaults = {k: p.default for k, p in sig.parameters.items() if p.default is not p.empty}
    assert defaults == {
        "name": None, "description": None, "requires_approval": False, "timeout_s": 60.0,
        "pool": "default", "delivery": None, "idempotency_key": None, "guard": None,
        "reconcile": None,  # issue 14: asks the called system before OutcomeUnknown
    }
    handler = inspect.signature(ToolHandler).parameters
    assert [k for k in handler] == ["registry", "pools", "guard", "result_retry", "guards"]
    assert all(handler[k].default is None for k in ["pools", "guard", "result_retry", "guards"])
    ctx = ToolContext(engine=None, run_id="r", call_id="c")
    assert (ctx.attempt, ctx.fence, ctx.idempotency_key, ctx.tenant, ctx.meta) == (1, 1, "", None, {})


def test_guardconfig_defaults_match_the_spec():
    g = GuardConfig()
    assert g.enabled is True
    assert g.delivery is Delivery.AT_LEAST_ONCE
    assert g.max_attempts == 3
    assert g.lease_ttl_s == 15.0
    assert g.heartbeat_s is None and g.heartbeat_period_s == 5.0
    assert g.wait_poll_s == 0.5
    assert g.on_lost_lease is LostLease.CANCEL
    assert g.fence_results is True
    assert Delivery("at_most_once").value == "at_most_once"
    assert LostLease("finish") == "finish"


def test_tool_works_bare_and_with_options():
    @tool
    def a(x: int) -> int:
        """A."""
        return x

    @tool(requires_approval=True, pool="slow")
    def b(x: int) -> int:
        """B."""
        return x

    assert isinstance(a, Tool) and isinstance(b, Tool)
    assert (a.name, a.requires_approval, a.pool) == ("a", False, "default")
    assert (b.requires_approval, b.pool) == (True, "slow")


def test_schema_comes_from_type_hints_and_description_from_docstring():
    @tool
    async def refund(order_id: str, amount_cents: int, ctx: ToolContext, reason: str = "customer") -> str:
        """Refund an order.

        Longer text.
        """
        return ""

    assert refund.description == "Refund an order.\n\nLonger text."
    schema = refund.schema
    assert set(schema["properties"]) == {"order_id", "amount_cents", "reason"}  # ctx excluded
    assert schema["properties"]["order_id"]["type"] == "string"
    assert schema["properties"]["amount_cents"]["type"] == "integer"
    assert schema["properties"]["reason"]["default"] == "customer"
    assert sorted(schema["required"]) == ["amount_cents", "order_id"]
    assert refund.spec()["name"] == "refund"


def test_bad_arguments_become_tool_args_error():
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    with pytest.raises(ToolArgsError, match="b"):
        add.validate_args({"a": 1})
    with pytest.raises(ToolArgsError, match="a"):
        add.validate_args({"a": "not a number", "b": 2})
    with pytest.raises(ToolArgsError, match="(?i)extra"):
        add.validate_args({"a": 1, "b": 2, "c": 3})
    assert add.validate_args({"a": "1", "b": 2}) == {"a": 1, "b": 2}


def _spec_tools():
    @tool(delivery="at_most_once", idempotency_key=lambda a: f"refund:{a['order_id']}")
    async def refund(order_id: str, ctx: ToolContext) -> str:
        """Refund an order."""
        return ""

    @tool
    async def search(query: str) -> str:
        """Search."""
        return ""

    @tool(delivery="at_most_once")
    async def send_email(to: str, body: str) -> str:
        """Send an email."""
        return ""

    return refund, search, send_email


def test_config_for_merges_the_handler_default_with_tool_overrides():
    refund, search, send_email = _spec_tools()
    handler = ToolHandler(ToolRegistry([refund, search, send_email]), guard=GuardConfig(lease_ttl_s=30, max_attempts=3))
    assert handler.config_for(refund).delivery.value == "at_most_once"
    assert handler.config_for(refund).max_attempts == 3
    assert handler.config_for(refund).lease_ttl_s == 30
    assert handler.config_for(search).delivery.value == "at_least_once"
    assert handler.config_for(search).lease_ttl_s == 30
    assert handler.config_for(send_email).delivery is Delivery.AT_MOST_ONCE
    assert refund.delivery == "at_most_once" and search.delivery is None


def test_config_for_without_a_handler_default_uses_the_spec_defaults():
    refund, search, send_email = _spec_tools()
    handler = ToolHandler(ToolRegistry([refund, search, send_email]))
    assert handler.config_for(search) == GuardConfig()
    assert handler.config_for(refund).delivery is Delivery.AT_MOST_ONCE
    assert handler.config_for(refund).lease_ttl_s == 15.0


def test_several_overrides_apply_together():
    @tool(guard={"max_attempts": 1, "lease_ttl_s": 60})
    async def refund(order_id: str) -> str:
        """Refund."""
        return ""

    cfg = ToolHandler(ToolRegistry([refund]), guard={"lease_ttl_s": 30, "max_attempts": 3}).config_for(refund)
    assert (cfg.max_attempts, cfg.lease_ttl_s, cfg.heartbeat_period_s) == (1, 60, 20)


def test_merged_validates_the_result():
    with pytest.raises(ConfigError, match="max_attempts"):
        GuardConfig().merged({"max_attempts": 0})
    assert GuardConfig(lease_ttl_s=9).merged(None).lease_ttl_s == 9
    assert GuardConfig().merged(GuardConfig(fence_results=False)).fence_results is False


def test_registry_refuses_two_tools_with_one_name():
    def f() -> None:
        """F."""

    with pytest.raises(ConfigError, match="rename"):
        ToolRegistry([Tool(f, name="x"), Tool(f, name="x")])
    with pytest.raises(ConfigError, match="@tool"):
        ToolRegistry([f])  # type: ignore[list-item]


def test_public_methods_of_the_handler_and_its_task_handles_are_frozen():
    from aaa_celery.tools.handler import ToolTaskHandle

    def public(cls):
        return sorted(n for n, v in vars(cls).items() if not n.startswith("_") and callable(v))

    assert public(ToolHandler) == ["attach", "bind", "check", "config_for", "queue_for", "task"]
    assert public(ToolTaskHandle) == ["apply_async", "delay", "s"]
    assert ToolContext.direct().guarded is False
    assert ToolContext(engine=None, run_id="r", call_id="c").guarded is True
