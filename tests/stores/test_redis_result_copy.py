"""The Redis store writes a copy of an accepted success in ``finish``'s own script (``ResultCopy``:
Celery's result of the call, for a store on the result backend's server), and only then.

The copy goes with the one accepted success: never with a failure, a stale result, or to
another server; a copy the server refuses leaves ``written`` False (the worker writes it then)
and the result is recorded all the same.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from aaa_celery.config import GuardConfig
from aaa_celery.lifecycle import Accepted, CallSpec, Claimed, Outcome, Stale
from aaa_celery.stores import open_store
from aaa_celery.stores.base import ResultCopy
from aaa_celery.stores.redis import RedisStore

pytestmark = pytest.mark.redis

CFG = GuardConfig(lease_ttl_s=30)
DB = 3  # the backend's database: another one than the store's


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    s = open_store(redis_url)
    assert isinstance(s, RedisStore)
    yield s
    s.close()


@pytest.fixture
def backend_db(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis(**{**on_server(redis_url), "decode_responses": True})
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def on_server(redis_url: str, **more: Any) -> dict[str, Any]:
    """The store's server as Celery's Redis backend names it (``connparams``), in ``DB``."""
    params = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    return {"host": params["host"], "port": params["port"], "db": DB, "password": params.get("password"), **more}


def claimed(store: RedisStore) -> Any:
    call = CallSpec(f"copy-{uuid.uuid4().hex[:10]}", name="t")
    got = store.begin(call, "w1", CFG)
    assert isinstance(got, Claimed)
    return got.lease


def copy_of(call_id: str, server: dict[str, Any] | None, ttl_s: int | None = 600) -> ResultCopy:
    value = json.dumps({"status": "SUCCESS", "result": 42, "task_id": call_id})
    return ResultCopy(f"celery-task-meta-{call_id}", value, ttl_s, server)


@pytest.fixture
def published(redis_url: str) -> Iterator[Callable[[str], list[str]]]:
    """Messages PUBLISHed on a channel since the test subscribed to it (pub/sub is the server's,
    not a database's)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    pubsub = client.pubsub()

    def read(channel: str) -> list[str]:
        got = []
        while (m := pubsub.get_message(timeout=0.5)) is not None:
            if m["type"] == "message" and m["channel"] == channel:
                got.append(m["data"])
        return got

    read.subscribe = pubsub.subscribe  # type: ignore[attr-defined]
    yield read
    pubsub.close()
    client.close()


def test_an_accepted_success_writes_its_copy_in_the_same_script(store, redis_url, backend_db, published):
    lease = claimed(store)
    copy = copy_of(lease.call_id, on_server(redis_url))
    published.subscribe(copy.key)  # type: ignore[attr-defined]
    assert isinstance(store.finish(lease, Outcome.success(42, lease.attempt), CFG, copy), Accepted)
    assert copy.written
    assert backend_db.get(copy.key) == copy.value
    assert 0 < backend_db.ttl(copy.key) <= 600
    assert published(copy.key) == [copy.value]
    assert store.result(lease.call_id) == Outcome.success(42, lease.attempt)


def test_a_copy_without_ttl_is_kept_for_good(store, redis_url, backend_db):
    lease = claimed(store)
    copy = copy_of(lease.call_id, on_server(redis_url), ttl_s=None)
    store.finish(lease, Outcome.success(1, lease.attempt), CFG, copy)
    assert copy.written and backend_db.ttl(copy.key) == -1


def test_a_failure_or_a_stale_result_writes_no_copy(store, redis_url, backend_db):
    failed = claimed(store)
    copy = copy_of(failed.call_id, on_server(redis_url))
    store.finish(failed, Outcome.failure("ValueError", "no", failed.attempt), CFG, copy)
    assert not copy.written and backend_db.get(copy.key) is None

    old = claimed(store)
    store.release(old)  # attempt 1 lost the call; attempt 2 claims it
    new = claimed_again(store, old.call_id)
    stale = copy_of(old.call_id, on_server(redis_url))
    assert isinstance(store.finish(old, Outcome.success(1, old.attempt), CFG, stale), Stale)
    assert not stale.written and backend_db.get(stale.key) is None
    fresh = copy_of(new.call_id, on_server(redis_url))
    assert isinstance(store.finish(new, Outcome.success(2, new.attempt), CFG, fresh), Accepted)
    assert fresh.written and backend_db.get(fresh.key) == fresh.value


def claimed_again(store: RedisStore, call_id: str) -> Any:
    got = store.begin(CallSpec(call_id, name="t"), "w2", CFG)
    assert isinstance(got, Claimed) and got.lease.attempt == 2, got
    return got.lease


@pytest.mark.parametrize("elsewhere", [
    {"port": 1},  # another server
    {"password": "another-user's"},  # the same server, as another user
    {"connection_class": redis.SSLConnection},  # over TLS: another listener
])
def test_a_copy_for_another_server_or_user_is_left_to_the_caller(store, redis_url, backend_db, elsewhere):
    lease = claimed(store)
    copy = copy_of(lease.call_id, on_server(redis_url, **elsewhere))
    assert isinstance(store.finish(lease, Outcome.success(3, lease.attempt), CFG, copy), Accepted)
    assert not copy.written and backend_db.get(copy.key) is None


def test_a_copy_the_server_refuses_is_left_to_the_caller_and_the_result_stands(store, redis_url):
    lease = claimed(store)
    copy = copy_of(lease.call_id, {**on_server(redis_url), "db": 100_000})  # no such database
    assert isinstance(store.finish(lease, Outcome.success(4, lease.attempt), CFG, copy), Accepted)
    assert not copy.written
    assert store.result(lease.call_id) == Outcome.success(4, lease.attempt)


def test_a_finish_retried_after_it_landed_leaves_the_copy_to_the_caller(store, redis_url, backend_db):
    lease = claimed(store)
    outcome = Outcome.success(5, lease.attempt)
    store.finish(lease, outcome, CFG)  # landed; its reply lost, say
    copy = copy_of(lease.call_id, on_server(redis_url))
    assert isinstance(store.finish(lease, outcome, CFG, copy), Accepted)
    assert not copy.written  # the store wrote nothing this time: the worker writes the copy
