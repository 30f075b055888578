"""Bad guard configuration fails early, naming the field and the fix."""

from __future__ import annotations

import pytest

from aaa_celery.errors import ConfigError
from aaa_celery.runtime import Engine
from aaa_celery.tools import GuardConfig, ToolHandler, ToolRegistry, tool


def noop() -> str:
    """Do nothing."""
    return "ok"


def test_max_attempts_zero_fails_at_decoration():
    with pytest.raises(ConfigError) as e:
        tool(guard={"max_attempts": 0})(noop)
    assert "max_attempts" in str(e.value)
    assert "greater than or equal to 1" in str(e.value)


def test_unknown_delivery_fails_at_decoration():
    with pytest.raises(ConfigError) as e:
        tool(delivery="sometimes")(noop)
    assert "delivery" in str(e.value)
    assert "at_least_once" in str(e.value) and "at_most_once" in str(e.value)


def test_unknown_guard_key_fails_at_decoration():
    with pytest.raises(ConfigError) as e:
        tool(guard={"lease_ttl": 5})(noop)
    assert "lease_ttl" in str(e.value)
    assert "lease_ttl_s" in str(e.value)  # the message lists the real options


def test_heartbeat_not_below_ttl_in_one_tools_overrides_fails_at_decoration():
    with pytest.raises(ConfigError) as e:
        tool(guard={"heartbeat_s": 10, "lease_ttl_s": 5})(noop)
    assert "heartbeat_s" in str(e.value) and "lease_ttl_s" in str(e.value)


@pytest.mark.parametrize(
    "field, value",
    [("lease_ttl_s", 0), ("lease_ttl_s", -1), ("wait_poll_s", 0), ("heartbeat_s", 0), ("on_lost_lease", "explode")],
)
def test_each_invalid_value_names_its_field(field, value):
    with pytest.raises(ConfigError) as e:
        tool(guard={field: value})(noop)
    assert field in str(e.value)


def test_guardconfig_constraints_hold_on_the_model_itself():
    with pytest.raises(ValueError, match="max_attempts"):
        GuardConfig(max_attempts=0)
    with pytest.raises(ValueError, match="heartbeat_s"):
        GuardConfig(lease_ttl_s=5, heartbeat_s=5)


def test_conflict_with_handler_default_defines_fine_and_fails_at_attach():
    # Given a tool whose heartbeat is valid on its own
    slow_beat = tool(guard={"heartbeat_s": 10}, name="slow_beat")(noop)
    # When its handler's default TTL is shorter than that heartbeat
    handler = ToolHandler(ToolRegistry([slow_beat]), guard=GuardConfig(lease_ttl_s=5))
    engine = Engine()
    # Then attach() refuses, naming the tool and the fields
    with pytest.raises(ConfigError) as e:
        handler.attach(engine)
    assert "slow_beat" in str(e.value)
    assert "heartbeat_s" in str(e.value) and "lease_ttl_s" in str(e.value)


def test_config_for_also_reports_the_conflict():
    slow_beat = tool(guard={"heartbeat_s": 10}, name="slow_beat")(noop)
    handler = ToolHandler(ToolRegistry([slow_beat]), guard={"lease_ttl_s": 5})
    with pytest.raises(ConfigError, match="heartbeat_s"):
        handler.config_for(slow_beat)


def test_bad_handler_guard_dict_fails_at_construction():
    with pytest.raises(ConfigError, match="ToolHandler.guard.max_attempts"):
        ToolHandler(ToolRegistry([]), guard={"max_attempts": -1})


def test_other_tool_options_are_validated():
    with pytest.raises(ConfigError, match="timeout_s"):
        tool(timeout_s=0)(noop)
    with pytest.raises(ConfigError, match="idempotency_key"):
        tool(idempotency_key="refund")(noop)
    with pytest.raises(ConfigError, match="pool"):
        tool(pool="")(noop)
