"""The recovery sweep after a store outage: a lease that lapsed while nobody could reach the
store is left to its holder for one lease, so that the holder, cut off too, records why it
gave up before a sweep republishes the call. Otherwise the first worker to reach the store
decides what the call's refusal names: a sweep that wins (by 9 ms, in a CI run of 6cc758c)
has the republished attempt refused as ``worker_lost``, where the store was what was lost
(``tests/worker/test_one_truth.py``'s at-most-once case). The hold outlives the Recovery object:
the sweeper rebuilds it when a sweep fails on the broker, as the first sweep back can when the
store is on the broker's Redis."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
import redis
from celery import Celery

from aaa_celery import GuardedTask
from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import Claimed, Refused
from aaa_celery.worker import app_store
from aaa_celery.worker.recovery import Sweeper

from ..servers import RedisServer
from .test_fleet_results import store_server  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis

TTL = 2.0
#: The lease of the broker-probe test: its hold is watched with margins of seconds on a loaded machine.
LONG_TTL = 5.0

T = TypeVar("T")


def _app(broker_url: str, store_url: str, ttl: float) -> tuple[Celery, Any]:
    """An app over ``broker_url`` and the store at ``store_url``, and its at-most-once task
    ``outage.send`` of a ``ttl`` lease."""
    app = Celery("outage", broker=broker_url, set_as_current=False)
    app.conf.update(aaa_store_url=store_url, aaa_recovery_hold_s=0.1, task_serializer="json",
                    accept_content=["json"])

    @app.task(base=GuardedTask, name="outage.send", shared=False, delivery="at_most_once",
              guard={"lease_ttl_s": ttl})
    def send(x: int) -> int:
        return x

    return app, send


def _out_of_reach(server: RedisServer, sweeper: Sweeper, seconds: float) -> None:
    """``server`` stopped for ``seconds`` (same port and data when it is back), ``sweeper``
    sweeping meanwhile: every sweep fails and republishes nothing."""
    server._halt(kill=False)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert sweeper.sweep_once() == []
            time.sleep(0.5)
    finally:
        server._spawn()


def _elsewhere(work: Callable[[], T]) -> T:
    """``work`` on a thread of its own that then ends, as another worker (the caller, the holder)
    would do it: the store lends each thread a connection for its scripts, and the sweeping
    thread's must not be one opened before the outage (its first script after the restart would
    fail once, a StoreUnavailable that marks the outage again and hides what is tested here; a
    sweeper thread that never ran a script has none)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result(timeout=30)


def _let_broker_in(admin: redis.Redis) -> None:
    """Create (again) the broker's ACL user on the shared server; a restart drops it (ACL SETUSER
    is not kept in the AOF), as it drops any user an operator added at run time."""
    admin.execute_command("ACL", "SETUSER", "broker", "on", ">secret", "~*", "&*", "+@all")


def test_a_lease_that_lapsed_in_an_outage_is_left_to_its_holder_for_one_lease(redis_url, store_server):  # noqa: F811
    # Given an at-most-once call whose attempt 1 holds a lease of TTL, and a worker's sweeper
    app, send = _app(redis_url, store_server.url, TTL)

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
        _out_of_reach(store_server, sweeper, 2 * TTL + 1)

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


def test_the_hold_survives_the_sweeper_rebuilding_its_recovery_when_the_first_sweep_back_fails_on_the_broker(
        store_server, caplog):  # noqa: F811
    """The default topology: the store on the broker's Redis. The first sweep that reaches the
    store after the outage then fails on the broker probe with an error that is not the store's,
    so the Sweeper throws its Recovery away and builds another: the lapsed lease must still be
    left to its holder for its task's lease_ttl_s from that sweep (a5660a2; with 55cf789's
    recovery.py, which kept the outage on the Recovery, the rebuilt one republishes the call at
    its first sweep and this test fails).

    All real, no test double: one redis-server, stopped and started again, holds the store and
    the broker. A restart alone does not fail the probe: redis-py (8.2) reopens a pooled
    connection the restart closed when it takes it, and retries connection errors (tried: the
    first sweep after the restart went through). So the broker signs in as its own ACL user,
    which the restart drops: in RedisBrokerProbe.find, after the sweep read the store, the
    probe's connection is found closed by the server and reopening it is refused (WRONGPASS:
    redis-py's AuthenticationError, a ConnectionError). The test creates the user again after
    that one failed sweep."""
    caplog.set_level(logging.ERROR, logger="aaa_celery.recovery")
    admin = redis.Redis.from_url(store_server.url)
    _let_broker_in(admin)
    broker_url = f"redis://broker:secret@127.0.0.1:{store_server.port}/0"
    # Given an at-most-once call whose attempt 1 holds a lease of LONG_TTL, store and broker on one Redis
    app, send = _app(broker_url, store_server.url, LONG_TTL)
    call_id = _elsewhere(lambda: send.delay(1).id)
    admin.delete("celery")  # the holder took the message
    store = app_store(app)
    spec = next(c for c in store.expired(unclaimed_grace_s=0) if c.call_id == call_id)
    assert isinstance(_elsewhere(lambda: store.begin(spec, "holder@test", send.guard_config)), Claimed)
    sweeper = Sweeper(app, "sweeper@test", interval_s=1.0)
    try:
        assert sweeper.sweep_once() == []  # the lease is live; the probe's connection is open
        first = sweeper._recovery
        assert first is not None and first.probe is not None

        # When the Redis is out of reach for longer than the lease
        _out_of_reach(store_server, sweeper, LONG_TTL + 2)

        # and the first sweep that reaches it again fails on the broker probe, not on the store
        back = time.monotonic()
        until = back + 10
        while not [r for r in caplog.records if r.getMessage() == "aaa recovery sweep failed"]:
            assert time.monotonic() < until, "no sweep failed on the broker"
            assert sweeper.sweep_once() == []
        failed = [r for r in caplog.records if r.getMessage() == "aaa recovery sweep failed"]
        assert len(failed) == 1 and failed[0].exc_info is not None
        error = failed[0].exc_info[1]
        assert isinstance(error, redis.exceptions.AuthenticationError), repr(error)
        frames = [(f.filename, f.name) for f in traceback.extract_tb(failed[0].exc_info[2])]
        assert any(path.endswith("broker.py") and name == "find" for path, name in frames), frames
        assert sweeper._recovery is None  # thrown away: the next sweep builds another
        _let_broker_in(admin)  # the broker answers again
        until = time.monotonic() + 5
        while True:  # the lease did lapse (the store's connections from before the outage may fail once)
            try:
                assert call_id in {c.call_id for c in store.expired(unclaimed_grace_s=1e12)}
                break
            except StoreUnavailable:
                assert time.monotonic() < until

        # Then the rebuilt Recovery still leaves the lapsed lease to its holder for one lease
        while time.monotonic() < back + LONG_TTL - 2:  # a margin: the hold is one lease from the sweep back
            assert sweeper.sweep_once() == []
            assert sweeper._recovery is not None and sweeper._recovery is not first
            time.sleep(0.5)
        assert admin.llen("celery") == 0

        # and one lease later it brings the call back
        while not (sent := sweeper.sweep_once()) and time.monotonic() < back + LONG_TTL + 10:
            time.sleep(0.25)
        assert sent == [call_id]
        assert time.monotonic() >= back + LONG_TTL  # not brought back before the hold ended
        assert admin.llen("celery") == 1  # republished on the broker
    finally:
        sweeper.stop()
        admin.close()
