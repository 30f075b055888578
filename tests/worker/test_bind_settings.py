"""bind()/install() refuse settings that break the guard, and warn about weak ones (no worker)."""

from __future__ import annotations

import functools
import pickle
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


@pytest.mark.parametrize("setting", [
    {"accept_content": ["application/x-python-serialize", "json"]},
    {"accept_content": ["json", "application/x-yaml"]},
    {"accept_content": ["yaml"]},
    {"result_accept_content": ["json", "pickle"]},
    {"result_accept_content": ["application/x-python-serialize"]},
    {"event_serializer": "pickle"},
    {"event_serializer": "application/x-yaml"},
    {"task_serializer": "yaml"},
    {"result_serializer": "application/x-python-serialize"},
])
def test_bind_refuses_code_running_content_by_content_type_and_by_name_in_every_setting(setting):
    """Reproduces on 4a34578: a content type (not the name 'pickle'), result_accept_content
    and event_serializer all passed bind()."""
    (name, value), = setting.items()
    with pytest.raises(ConfigError) as err:
        handler().bind(json_app(**setting))
    assert name in str(err.value) and "json" in str(err.value)


@pytest.fixture
def registered():
    from kombu.serialization import registry

    saved = [dict(d) for d in (registry._encoders, registry._decoders, registry.type_to_name, registry.name_to_type)]

    def register(name, decoder, content_type):
        registry.register(name, lambda v: b"", decoder, content_type=content_type, content_encoding="binary")

    yield register
    for current, before in zip((registry._encoders, registry._decoders, registry.type_to_name,
                                registry.name_to_type), saved, strict=True):
        current.clear()
        current.update(before)


def test_bind_refuses_an_alias_of_pickle_and_msgpack_with_extension_hooks(registered):
    # a harmless-looking name for the pickle content type, found through kombu's registry
    registered("safe-binary", pickle.loads, "application/x-python-serialize")
    with pytest.raises(ConfigError, match="accept_content: 'safe-binary'"):
        handler().bind(json_app(accept_content=["json", "safe-binary"]))
    # a custom content type whose decoder is pickle's
    registered("fastcodec", functools.partial(pickle.loads, fix_imports=False), "application/x-fastcodec")
    with pytest.raises(ConfigError, match="pickle"):
        handler().bind(json_app(accept_content=["application/x-fastcodec"]))
    # msgpack re-registered with an extension hook that builds objects (msgpack.unpackb's
    # ext_hook; a stand-in function here, since msgpack itself need not be installed)
    def unpackb(data, ext_hook=None):
        return ext_hook(1, data)

    registered("msgpack", functools.partial(unpackb, ext_hook=lambda code, data: data), "application/x-msgpack")
    with pytest.raises(ConfigError, match="msgpack"):
        handler().bind(json_app(accept_content=["json", "msgpack"]))


def test_bind_accepts_json_and_kombus_own_msgpack():
    handler().bind(json_app(accept_content=["json", "application/json"], result_accept_content=["json"],
                            event_serializer="json"))
    handler().bind(json_app(accept_content=["json", "msgpack"]))


def test_bind_refuses_a_non_redis_broker_without_aaa_store_url():
    with pytest.raises(ConfigError, match="aaa_store_url"):
        handler().bind(json_app("amqp://guest@127.0.0.1//"))
    app = handler().bind(json_app("amqp://guest@127.0.0.1//", aaa_store_url="redis://127.0.0.1:1/0"))
    assert "aaa.tool.ping" in app.tasks


def test_bind_warns_about_prefetch_multiplier_above_one():
    with pytest.warns(UserWarning, match="prefetch"):
        handler().bind(json_app(worker_prefetch_multiplier=4))
    # only the prefetch warning is in question: other tests' shared tasks may warn here
    # about duplicate task names when a new app takes them in
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        handler().bind(json_app())
    assert not [w for w in seen if "prefetch" in str(w.message)], [str(w.message) for w in seen]


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
