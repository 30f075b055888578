"""``policy.Concurrency`` as a rule of a ToolHandler's policy and as a GuardedTask's
``concurrency=`` / ``unique=`` options (issue 40): validated when made, keyed per tool and
tenant, and applied in the worker (one delivery at a time here, as a pool runs it)."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.exceptions import Retry

from aaa_celery import ConfigError, GuardedTask
from aaa_celery.errors import CallSkipped
from aaa_celery.lifecycle import FAILED
from aaa_celery.policy import Concurrency
from aaa_celery.protocol import TENANT_HEADER, WAITS_HEADER, call_id
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.tools import GuardPolicy, ToolHandler, ToolRegistry, tool
from aaa_celery.tools.handler import use_store

RAN: list[int] = []


@tool
def sync_inventory(shop_id: int) -> str:
    """Sync one shop's inventory."""
    RAN.append(shop_id)
    return f"synced {shop_id}"


def bound(rule: Concurrency, store: MemoryStore):
    app = Celery("concurrency-unit", broker="memory://", backend="cache+memory://")
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                    worker_prefetch_multiplier=1, aaa_store_url="memory://")
    ToolHandler(ToolRegistry([sync_inventory]), guards=GuardPolicy(rules=[rule])).bind(app)
    use_store(app, store)
    return app.tasks["aaa.tool.sync_inventory"]


def deliver(task, call, arguments, tenant=None):
    """Run one delivery of the call in this thread, as a worker's pool would."""
    headers = {TENANT_HEADER: tenant} if tenant else {}
    task.push_request(id=call, called_directly=False, hostname="unit", delivery_info={}, **headers)
    try:
        return task(arguments=arguments)
    finally:
        task.pop_request()


@pytest.mark.parametrize(("fields", "names"), [
    ({"on_busy": "queue"}, ["Concurrency.on_busy", "'wait', 'skip' or 'reject'"]),
    ({"limit": 0}, ["Concurrency.limit", "greater than or equal to 1"]),
    ({"key": 7}, ["Concurrency.key", "argument names"]),
    ({"key": ["shop id"]}, ["Concurrency.key", "'shop id' is not an argument name"]),
])
def test_a_bad_rule_is_refused_when_it_is_made_naming_the_field_and_the_fix(fields, names):
    with pytest.raises(ConfigError) as refused:
        Concurrency(**fields)
    assert all(n in str(refused.value) for n in names), str(refused.value)


def task_class(**options):
    return type("Task", (GuardedTask,), {"name": "t", **options})


def test_task_options_are_validated_when_the_task_class_is_made():
    with pytest.raises(ConfigError, match="unique=True is Concurrency"):
        task_class(unique=True, concurrency=Concurrency())
    with pytest.raises(ConfigError, match="concurrency: must be aaa_celery.policy.Concurrency"):
        task_class(concurrency=2)
    with pytest.raises(ConfigError, match="unique: must be True or False"):
        task_class(unique="yes")
    with pytest.raises(ConfigError, match="Concurrency.limit"):
        task_class(concurrency={"limit": -1})
    assert task_class(unique=True)._options.concurrency == Concurrency(limit=1, on_busy="skip", name="unique")
    assert task_class(concurrency={"key": "shop"})._options.concurrency == Concurrency(key="shop")
    # a subclass inherits its base's rule
    assert type("Sub", (task_class(unique=True),), {})._options.concurrency.name == "unique"


def test_a_skipped_call_records_its_outcome_and_keys_are_per_tenant():
    RAN.clear()
    store = MemoryStore()
    rule = Concurrency(tools="sync_inventory", key="shop_id", limit=1, on_busy="skip", name="one sync a shop")
    task = bound(rule, store)
    # acme's shop 7 is running (its slot held, as by a live call)
    acme_key = rule.slot_key("sync_inventory", "acme", {"shop_id": 7})
    assert store.take_slot(acme_key, "acme-holder", 1, 30).reply == "taken"

    skipped = call_id("acme", "inv")
    with pytest.raises(CallSkipped, match="'one sync a shop'"):
        deliver(task, skipped, {"shop_id": 7}, "acme")
    outcome = store.result(skipped)
    assert outcome.error == "CallSkipped" and "acme-holder" in outcome.message and outcome.attempt == 0
    assert [e.type for e in store.events(skipped)] == [FAILED]
    # the same shop id of another tenant, another shop of acme: keys of their own
    assert deliver(task, call_id("globex", "inv"), {"shop_id": 7}, "globex") == "synced 7"
    assert deliver(task, call_id("acme", "inv"), {"shop_id": 8}, "acme") == "synced 8"
    assert RAN == [7, 8]
    # a redelivery of the skipped call is answered with its outcome
    with pytest.raises(CallSkipped):
        deliver(task, skipped, {"shop_id": 7}, "acme")
    assert store.slot_holders(acme_key) == ["acme-holder"]


def test_wait_sends_the_call_again_later_and_counts_its_waits_not_its_retries():
    RAN.clear()
    store = MemoryStore()
    rule = Concurrency(key="shop_id", limit=1, on_busy="wait")
    task = bound(rule, store)
    assert store.take_slot(rule.slot_key("sync_inventory", None, {"shop_id": 1}), "holder", 1, 30).reply == "taken"
    with pytest.raises(Retry) as waited:
        deliver(task, "call-w", {"shop_id": 1})
    assert RAN == [] and store.result("call-w") is None
    sent = waited.value.sig
    assert 0 < waited.value.when <= 15 and sent.options["headers"][WAITS_HEADER] == 1
    assert sent.options.get("retries", 0) == 0 and sent.options["task_id"] == "call-w"
