"""Issue 13, recovery without floods and fast for lost messages: real workers, real Redis.

Each test names the commit whose behaviour it reproduces. The backlog test runs a
scaled version by default (200 calls, a grace of 8 s, waiting 25 s: the ratios of
1,000 calls waiting 10 minutes on the 300 s default grace); ``AAA_RECOVERY_LONG=1``
runs the full one on default settings.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import redis

from aaa_celery import GuardedTask, open_store
from aaa_celery.lifecycle import COMPLETED, FAILED, STARTED
from aaa_celery.testing import wait_for
from aaa_celery.worker import registered_together

from ..servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

TTL = 2.0
TAKEOVER_S = TTL + 10
LONG = os.environ.get("AAA_RECOVERY_LONG") == "1"


def types(store, task_id):
    return [e.type for e in store.events(task_id)]


def started(fleet, task_id, n=1, timeout_s=30.0):
    return wait_for(lambda: (s := fleet.ledger.entries(task_id, "start")) and len(s) >= n and s,
                    timeout_s, f"{n} body start(s) of {task_id}")


@pytest.mark.parametrize("how", ["aaa_store_options", "use_store"])
def test_custom_key_prefix_and_shards_kill_9_mid_call_is_recovered(fleet, how):
    """Reproduces on 4a34578 (``use_store``): the sweeper opened its own store from the URL,
    with the default prefix and shard count, so it read keys nobody wrote and never
    brought back a call whose holder was killed; the broker's copy waits an hour."""
    options = json.dumps({"key_prefix": "acme", "shards": 3})
    f = fleet(TTL=TTL, STORE_OPTIONS=options, PIN_STORE="1" if how == "use_store" else "0")
    result = f.client.tasks["fleet.long"].delay(4.0)
    first = started(f, result.id)[0]
    assert f.store.key(result.id, "spec").startswith("acme:{acme:")
    killed_at = time.time()
    f.worker_of(first["pid"]).kill()
    second = started(f, result.id, 2, TAKEOVER_S)[1]
    assert second["at"] - killed_at < TAKEOVER_S and second["attempt"] == 2
    assert result.get(timeout=30)["attempt"] == 2
    default_keys = redis.Redis.from_url(f.env["AAA_FLEET_BROKER"]).keys(f"aaa:*{result.id}*")
    assert default_keys == []  # nothing went to the default prefix


def test_message_deleted_before_any_worker_took_it_completes_within_120_s_on_defaults(fleet):
    """Reproduces on 4a34578: a lost message waited for ``aaa_unclaimed_grace_s`` (300 s)."""
    defaults = {"RECOVERY_S": 2}  # the sweep interval's default (fleet_app's is 1 s)
    client = fleet.client(TTL=TTL, **defaults)
    result = client.tasks["fleet.quick"].delay(41)  # registered in the store, then published
    lost_at = time.monotonic()
    broker = redis.Redis.from_url(fleet.redis_url)
    assert broker.delete("celery") == 1  # the broker lost the message
    f = fleet(TTL=TTL, **defaults)
    assert result.get(timeout=120) == 42
    took = time.monotonic() - lost_at
    print(f"lost message completed {took:.1f} s after it was lost")
    assert took < 120
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert types(f.store, result.id) == [STARTED, COMPLETED]


def test_messages_sent_in_registered_together_are_registered_at_its_end_and_a_lost_one_completes(fleet):
    """Issue 23 item 2: calls sent in bulk are registered in one round trip per batch. The
    block's end registers them all, so the lost-message guarantee holds for each."""
    defaults = {"RECOVERY_S": 2}
    client = fleet.client(TTL=TTL, **defaults)
    store = open_store(fleet.redis_url)
    try:
        # Given three calls sent inside one block
        with registered_together(max_calls=10, max_delay_s=60):
            results = [client.tasks["fleet.quick"].delay(n) for n in range(3)]
            # (sent, not registered yet: the batch waits for the block's end)
            assert store.expired(unclaimed_grace_s=-3600) == []
        # Then the block's end registered each one
        assert {c.call_id for c in store.expired(unclaimed_grace_s=-3600)} == {r.id for r in results}
    finally:
        store.close()

    # When the broker loses all three messages before any worker took them
    lost_at = time.monotonic()
    broker = redis.Redis.from_url(fleet.redis_url)
    assert broker.delete("celery") == 1
    f = fleet(TTL=TTL, **defaults)

    # Then each completes, once, within 120 s
    assert [r.get(timeout=120) for r in results] == [1, 2, 3]
    assert time.monotonic() - lost_at < 120
    assert [len(f.ledger.entries(r.id, "start")) for r in results] == [1, 1, 1]


@pytest.mark.timeout(1800 if LONG else 300)
def test_healthy_backlog_costs_at_most_one_republished_copy_per_call(fleet):
    """Reproduces on 4a34578: a call waiting in a queue was republished once per hold
    period (10 s) from the grace on; 1,000 queued calls gave 6,000 copies a minute."""
    n, wait_s = (1000, 600.0) if LONG else (200, 25.0)
    settings = {} if LONG else {"GRACE": 8, "LOST_AFTER": 2, "LOST_CHECK": 1, "HOLD": 3}
    # Given one live worker (and its sweeper) that consumes another queue than the backlog's
    f = fleet(1, TTL=TTL, extra_args=("-Q", "aaa.default"), **settings)
    broker = redis.Redis.from_url(f.env["AAA_FLEET_BROKER"])
    quick = f.client.tasks["fleet.quick"]
    results = [quick.delay(i) for i in range(n)]
    assert broker.llen("celery") == n

    # When the calls wait in the queue past the grace
    time.sleep(wait_s)
    copies = broker.llen("celery") - n
    print(f"{n} calls waited {wait_s:.0f} s in a backlog: {copies} republished copies")

    # Then they cost at most one copy each (the broker probe: none), and a worker
    # that consumes the queue runs each call once
    assert copies <= n
    assert copies == 0
    f.add(extra_args=("-Q", "celery"))
    assert [r.get(timeout=120) for r in results] == [i + 1 for i in range(n)]
    starts = [len(f.ledger.entries(r.id, "start")) for r in results[:50]]
    assert starts == [1] * 50


def test_call_no_worker_can_claim_ends_failed_with_a_reason_instead_of_forever(fleet):
    """Reproduces on 4a34578: an unknown task name was republished every hold, forever."""
    settings = {"LOST_AFTER": 1, "LOST_CHECK": 1, "HOLD": 1, "MAX_TRIES": 2}
    f = fleet(1, TTL=TTL, **settings)
    client = fleet.client(TTL=TTL, **settings)

    @client.task(base=GuardedTask, name="fleet.only_in_the_client")
    def only_in_the_client() -> int:
        return 1

    result = only_in_the_client.delay()
    outcome = wait_for(lambda: f.store.result(result.id), 60, "the abandoned call's result")
    assert outcome.error == "ExecutionAbandoned"
    assert "republished 2 times" in outcome.message and "fleet.only_in_the_client" in outcome.message
    assert "not registered on this worker" in outcome.message
    assert types(f.store, result.id) == [FAILED]
    sent = broker_copies = redis.Redis.from_url(f.env["AAA_FLEET_BROKER"]).llen("celery")
    assert broker_copies == 0, sent


def ran_once(f, result, timeout_s):
    assert result.get(timeout=timeout_s) == 7
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert types(f.store, result.id) == [STARTED, COMPLETED]


def test_call_sent_while_the_store_was_down_then_its_worker_killed_is_recovered(fleet):
    """Reproduces on 4a34578 (seen in the chaos run with store_restart): a call published
    while the store was down is sent but not registered; the worker that took it died
    before ``begin`` reached the store, so the message waited in kombu's ``unacked`` for
    the visibility timeout (an hour) and the store knew nothing to recover."""
    store_server = RedisServer.start()
    try:
        settings = {"STORE": store_server.url, "LOST_AFTER": 1, "LOST_CHECK": 1, "GRACE": 3}
        f = fleet(1, TTL=TTL, **settings)
        broker = redis.Redis.from_url(f.env["AAA_FLEET_BROKER"])
        taker = next(iter(f))
        store_server._halt(kill=True)  # the store is down: the publish is not registered
        result = f.client.tasks["fleet.quick"].delay(6)
        wait_for(lambda: any(result.id in (v or b"").decode() for v in broker.hvals("unacked")), 10,
                 "a worker took the message")
        taker.kill()  # before its begin reached the store (it waits for the store, then hands back)
        time.sleep(0.5)
        # the message is an orphan: in the dead worker's unacked, in no queue
        assert any(result.id in (v or b"").decode() for v in broker.hvals("unacked"))
        assert broker.llen("celery") == 0
        store_server._spawn()
        f.add()
        ran_once(f, result, 60)
    finally:
        store_server.stop(kill=True)


def test_call_sent_while_the_store_was_down_then_lost_by_the_broker_is_registered_late_and_recovered(fleet):
    """Reproduces on d797fdd (the CI chaos run, seed 7): a call published while the store
    restarted was sent but not registered, and the broker lost its message (a worker frozen
    with a BRPOP pending, then killed -9): no trace anywhere. The publishing process now
    registers it once the store is back, so recovery finds it as a call the broker lost."""
    store_server = RedisServer.start()
    try:
        settings = {"STORE": store_server.url, "LOST_AFTER": 1, "LOST_CHECK": 1, "GRACE": 3}
        f = fleet(0, TTL=TTL, **settings)
        broker = redis.Redis.from_url(f.env["AAA_FLEET_BROKER"])
        store_server._halt(kill=True)
        result = f.client.tasks["fleet.quick"].delay(6)
        assert broker.llen("celery") == 1
        broker.delete("celery")  # the broker lost the call's only message
        store_server._spawn()
        wait_for(lambda: f.store.expired(unclaimed_grace_s=0), 20, "the call registered once the store is back")
        f.add()
        ran_once(f, result, 45)
    finally:
        store_server.stop(kill=True)
