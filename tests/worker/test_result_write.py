"""Celery's result of a guarded call, written once the store accepted it, on real workers.

Celery's key-value backends read a task's result before they write it (a stored SUCCESS is
never overwritten). For a guarded call the store's ``finish`` has decided that already, so
Celery's result is written without the read: by ``finish``'s own script when the store is on
the backend's server (no round trip of its own), else by the worker after ``finish``. What is
stored must be what Celery stores, and every case the fast path does not cover must take
Celery's own path (``aaa_celery/worker/results.py``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from aaa_celery.lifecycle import STALE_RESULT
from aaa_celery.testing import wait_for

from ..servers import RedisServer
from .test_fleet_faults import TTL, freeze_until_taken_over, types

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


@pytest.fixture(scope="module")
def another_redis() -> Iterator[str]:
    """A Redis server of its own: a store on another server than Celery's backend."""
    server = RedisServer.start(appendonly=False)
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def commands_on(url: str, key: str) -> Iterator[list[list[str]]]:
    """The commands the server at ``url`` runs on ``key`` meanwhile (``MONITOR``), each as
    its words after who sent it: ``lua`` for a script's, else the client's connection type."""
    seen: list[list[str]] = []
    client = redis.Redis.from_url(url)
    stop = threading.Event()
    ready = threading.Event()

    def watch() -> None:
        with client.monitor() as m:
            ready.set()
            for entry in m.listen():
                words = entry["command"].split()
                if any(key in w for w in words):
                    seen.append([entry.get("client_type", "?"), *words])
                if stop.is_set() and entry["command"].startswith("PING"):
                    return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert ready.wait(5)
    try:
        yield seen
    finally:
        stop.set()
        client.ping()
        t.join(10)
        client.close()


def verbs(seen: list[list[str]], by: str | None = None) -> list[str]:
    """The commands' names, of those sent by ``by`` (``lua``: a script) if given."""
    return [words[1].strip('"').upper() for words in seen if by is None or words[0] == by]


def meta(url: str, task_id: str) -> dict[str, Any]:
    raw = redis.Redis.from_url(url).get(f"celery-task-meta-{task_id}")
    assert raw is not None, f"no result stored for {task_id}"
    return json.loads(raw)  # type: ignore[no-any-return]


def in_db(url: str, db: int) -> str:
    return f"{url.rsplit('/', 1)[0]}/{db}"


@pytest.mark.parametrize("store_on", ["the backend's server", "another server"])
def test_an_accepted_result_is_written_without_reading_it_first_and_as_celery_writes_it(
        fleet, redis_url, store_on, request):
    backend = in_db(redis_url, 2)  # another database than the store's (and the broker's)
    store = redis_url if store_on == "the backend's server" else request.getfixturevalue("another_redis")
    f = fleet(TTL=5, BACKEND=backend, STORE=store)
    plain = f.client.tasks["fleet.threads"].delay()
    assert plain.get(timeout=15)["pid"] > 0
    call = f.client.tasks["fleet.quick"].apply_async((41,), task_id="result-write-1")
    key = "celery-task-meta-result-write-1"
    with commands_on(backend, key) as seen:  # watched by EXISTS: AsyncResult.get() would GET it too
        wait_for(lambda: redis.Redis.from_url(backend).exists(key), timeout_s=15)
        wait_for(lambda: "PUBLISH" in verbs(seen), timeout_s=5)
    assert call.get(timeout=15) == 42
    assert "GET" not in verbs(seen), seen  # Celery's read before the write: the store decided already
    if store_on == "the backend's server":  # with the result, in finish's script: no round trip of its own
        assert verbs(seen, "lua") == ["SET", "PUBLISH"], seen
        # the worker's only command naming the key is finish's EVALSHA (more than one if the
        # server had to load the script first: NOSCRIPT)
        assert set(verbs(seen, "tcp")) == {"EXISTS", "EVALSHA"}, seen
    else:  # after the result, by the worker: Celery's own SETEX + PUBLISH
        assert [v for v in verbs(seen) if v != "EXISTS"] == ["SETEX", "PUBLISH"], seen
    # the same fields as Celery's own write for a plain task of this app, with the result's TTL
    stored, plain_meta = meta(backend, call.id), meta(backend, plain.id)
    assert sorted(stored) == sorted(plain_meta)
    assert stored["status"] == "SUCCESS" and stored["result"] == 42 and stored["task_id"] == call.id
    assert 0 < redis.Redis.from_url(backend).ttl(f"celery-task-meta-{call.id}") <= 600
    assert f.store.result(call.id).ok


def test_a_call_with_a_callback_takes_celerys_own_path_and_its_result_names_the_child(fleet):
    """Celery sends a call's callbacks before it stores the result, so that the result names
    them as children: such a call is left to Celery's own write."""
    f = fleet(TTL=5)
    url = f.env["AAA_FLEET_BROKER"]
    linked = f.client.tasks["fleet.quick"].apply_async((1,), link=f.client.tasks["fleet.quick"].s())
    assert linked.get(timeout=15) == 2
    wait_for(lambda: bool(meta(url, linked.id).get("children")), timeout_s=10)
    child_id = meta(url, linked.id)["children"][0][0][0]
    assert f.client.AsyncResult(child_id).get(timeout=15) == 3


def test_ignore_result_still_stores_nothing_in_celerys_backend(fleet):
    f = fleet(TTL=5)
    url = f.env["AAA_FLEET_BROKER"]
    call = f.client.tasks["fleet.quick"].apply_async((5,), ignore_result=True)
    wait_for(lambda: f.store.result(call.id) is not None, timeout_s=15)
    assert f.store.result(call.id).ok
    assert redis.Redis.from_url(url).get(f"celery-task-meta-{call.id}") is None


def test_a_stale_attempt_never_writes_celerys_result(fleet):
    """Attempt 1 frozen past its lease, thawed while attempt 2 runs: its late success is
    refused by the store, and Celery's backend holds nothing until attempt 2's result."""
    f = fleet(TTL=TTL)
    url = f.env["AAA_FLEET_BROKER"]
    result = f.client.tasks["fleet.long_finish"].delay(7.0)
    _holder, _second, frozen = freeze_until_taken_over(f, result.id, 7.0)
    frozen.thaw()
    wait_for(lambda: STALE_RESULT in types(f.store, result.id), 15, "aaa.tool.stale_result of attempt 1")
    time.sleep(0.5)  # a write after the refusal would be there by now; attempt 2 sleeps on
    assert f.store.result(result.id) is None
    assert redis.Redis.from_url(url).get(f"celery-task-meta-{result.id}") is None
    assert result.get(timeout=30)["attempt"] == 2
    assert meta(url, result.id)["result"]["attempt"] == 2
