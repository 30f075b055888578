"""bind()/install() refuse settings that break the guard, and warn about weak ones (no worker)."""

from __future__ import annotations

import warnings

import pytest
from celery import Celery

from aaa_celery import ConfigError, GuardedTask, ToolContext
from aaa_celery.tools import ToolHandler, ToolRegistry, tool


@tool
def ping(text: str) -> str:
    """Ping."""
    return text


def handler() -> ToolHandler:
    return ToolHandler(ToolRegistry([ping]))


def json_app(broker: str = "redis://127.0.0.1:1/0", **conf: object) -> Celery:
    app = Celery("t", broker=broker)
    app.conf.update({"task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
                     "worker_prefetch_multiplier": 1, **conf})
    return app


@pytest.mark.parametrize("setting", [{"accept_content": ["json", "pickle"]}, {"task_serializer": "pickle"},
                                     {"result_serializer": "pickle"}])
def test_bind_refuses_an_app_that_accepts_pickle(setting):
    with pytest.raises(ConfigError, match="pickle"):
        handler().bind(json_app(**setting))


def test_bind_refuses_a_non_redis_broker_without_aaa_store_url():
    with pytest.raises(ConfigError, match="aaa_store_url"):
        handler().bind(json_app("amqp://guest@127.0.0.1//"))
    app = handler().bind(json_app("amqp://guest@127.0.0.1//", aaa_store_url="redis://127.0.0.1:1/0"))
    assert "aaa.tool.ping" in app.tasks


def test_bind_warns_about_prefetch_multiplier_above_one():
    with pytest.warns(UserWarning, match="prefetch"):
        handler().bind(json_app(worker_prefetch_multiplier=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handler().bind(json_app())


def test_guarded_task_defaults_and_send_time_argument_check_without_ctx():
    app = json_app()

    @app.task(base=GuardedTask, delivery="at_most_once", guard={"lease_ttl_s": 10})
    def refund(order_id: str, ctx: ToolContext) -> str:
        return order_id

    assert refund.acks_late and refund.reject_on_worker_lost
    assert refund.guard_config.delivery.value == "at_most_once" and refund.guard_config.lease_ttl_s == 10
    refund.__header__("A-1")  # ctx is injected by the guard, not sent
    with pytest.raises(TypeError):
        refund.__header__()


def test_guard_options_are_validated_when_the_task_is_defined():
    app = json_app()
    with pytest.raises(ConfigError):
        @app.task(base=GuardedTask, shared=False, guard={"lease_ttl_s": -1})
        def bad() -> None: ...
        bad.guard_config  # noqa: B018 - tasks are created lazily; touching one builds it
    with pytest.raises(ConfigError):
        @app.task(base=GuardedTask, shared=False, delivery="sometimes")
        def worse() -> None: ...
        worse.guard_config  # noqa: B018
