"""The recovery sweep after a store outage: a lease that lapsed while nobody could reach the
store is left to its holder for one lease, so that the holder, cut off too, records why it
gave up before a sweep republishes the call. Otherwise the first worker to reach the store
decides what the call's refusal names: a sweep that wins (by 9 ms, in a CI run of 6cc758c)
has the republished attempt refused as ``worker_lost``, where the store was what was lost
(``tests/worker/test_one_truth.py``'s at-most-once case)."""

from __future__ import annotations

import time

import pytest
import redis
from celery import Celery

from aaa_celery import GuardedTask
from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import Claimed, Refused
from aaa_celery.worker import app_store
from aaa_celery.worker.recovery import Sweeper

from .test_fleet_results import store_server  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis

TTL = 2.0


def test_a_lease_that_lapsed_in_an_outage_is_left_to_its_holder_for_one_lease(redis_url, store_server):  # noqa: F811
    # Given an at-most-once call whose attempt 1 holds a lease of TTL, and a worker's sweeper
    app = Celery("outage", broker=redis_url, set_as_current=False)
    app.conf.update(aaa_store_url=store_server.url, aaa_recovery_hold_s=0.1, task_serializer="json",
                    accept_content=["json"])

    @app.task(base=GuardedTask, name="outage.send", shared=False, delivery="at_most_once",
              guard={"lease_ttl_s": TTL})
    def send(x: int) -> int:
        return x

    @app.task(base=GuardedTask, name="outage.slow", shared=False, guard={"lease_ttl_s": 60})
    def slow() -> None:
        """A task of a longer lease: its calls' holders get longer, not this one's."""

    call_id = send.delay(1).id
    redis.Redis.from_url(redis_url).delete("celery")  # the holder took the message
    store = app_store(app)
    spec = next(c for c in store.expired(unclaimed_grace_s=0) if c.call_id == call_id)
    claimed = store.begin(spec, "holder@test", send.guard_config)
    assert isinstance(claimed, Claimed)
    sweeper = Sweeper(app, "sweeper@test", interval_s=1.0)
    try:
        assert sweeper.sweep_once() == []  # the lease is live

        # When the store is out of reach for longer than the lease (the sweeps meanwhile fail)
        store_server._halt(kill=False)
        try:
            deadline = time.monotonic() + 2 * TTL + 1
            while time.monotonic() < deadline:
                assert sweeper.sweep_once() == []
                time.sleep(0.5)
        finally:
            store_server._spawn()

        # Then the first sweeps that reach it again leave the lapsed lease alone
        back = time.monotonic()
        assert sweeper.sweep_once() == []
        # while the holder, which gave up for want of the store, records why
        until = time.monotonic() + 5
        while True:  # as the guard does: the pool's connections from before the outage fail once each
            try:
                store.fenced(claimed.lease, "store_unreachable")
                break
            except StoreUnavailable:
                assert time.monotonic() < until
        while time.monotonic() < back + TTL - 0.5:  # a margin: the hold is one lease from the first sweep
            assert sweeper.sweep_once() == []
            time.sleep(0.25)

        # and one lease (its task's) later the sweep brings the call back, and its refusal names the store
        while not (sent := sweeper.sweep_once()) and time.monotonic() < back + TTL + 10:
            time.sleep(0.25)
        assert sent == [call_id]
        refused = store.begin(spec, "other@test", send.guard_config)
        assert isinstance(refused, Refused), refused
        assert refused.result.error == "OutcomeUnknown" and "(cause: store_unreachable)" in refused.result.message
    finally:
        sweeper.stop()
