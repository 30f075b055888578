"""One truth (issue 13, item 3): what the caller hears never contradicts the store.

Real ``celery worker`` processes; the store is a Redis of its own that the test kills and
brings back (the broker and the result backend stay up).
"""

from __future__ import annotations

import threading
import time

import pytest

from aaa_celery import OutcomeUnknown
from aaa_celery.lifecycle import COMPLETED

from .test_fleet_faults import started, types
from .test_fleet_results import store_server  # noqa: F401 - a fixture

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

TTL = 2.0


def watch_states(result, stop: threading.Event) -> list[str]:
    """Every Celery state the caller could read, polled until ``stop``."""
    seen: list[str] = []

    def poll() -> None:
        while not stop.is_set():
            state = result.state
            if not seen or seen[-1] != state:
                seen.append(state)
            time.sleep(0.1)

    threading.Thread(target=poll, daemon=True).start()
    return seen


@pytest.mark.parametrize("task", ["fleet.long", "fleet.long_amo"])
def test_store_killed_mid_call_never_shows_the_caller_a_failure_that_later_flips(
    fleet, store_server, redis_url, task  # noqa: F811
):
    """The store dies mid-call for longer than the lease and comes back: the caller never
    sees a FAILURE before the final state, and the final state is the store's record
    (at_least_once: attempt 2's SUCCESS; at_most_once: the recorded OutcomeUnknown).

    The issue reported a final ``StoreUnavailable`` FAILURE here that later flipped; in
    this setup (a store Redis of its own, killed with ``kill -9``) it passes on 4a34578
    too, so it guards the changed fault paths; the flip itself is reproduced by the
    ``READONLY`` test below."""
    f = fleet(TTL=TTL, STORE=store_server.url, LEDGER=redis_url)
    result = f.client.tasks[task].delay(3.0)
    started(f, result.id)
    stop = threading.Event()
    seen = watch_states(result, stop)
    store_server._halt(kill=True)  # the store dies mid-call (its AOF keeps what reached disk)
    try:
        time.sleep(4 * TTL + 2)
    finally:
        store_server._spawn()
    try:
        outcome = result.get(timeout=60, propagate=False)
        final = result.state
    finally:
        time.sleep(1.0)
        stop.set()
    assert "FAILURE" not in seen[:-1], seen  # never a failure before the final state
    recorded = f.store.result(result.id)
    assert recorded is not None
    # the caller's final state is the store's recorded result
    assert (final == "SUCCESS") == recorded.ok, (final, outcome, recorded)
    if recorded.ok:
        assert types(f.store, result.id)[-1] == COMPLETED
    else:
        # at_most_once: the refusal says the store, not the worker, was lost (issue 13, item 3)
        assert recorded.error == "OutcomeUnknown" and isinstance(outcome, OutcomeUnknown), outcome
        assert outcome.cause == "store_unreachable", str(outcome)


def test_a_read_only_store_at_finish_is_retried_never_a_failure(fleet, store_server, redis_url):  # noqa: F811
    """Reproduces on 4a34578: a ``READONLY`` reply to ``finish`` (a failover demoted the
    store) escaped the guard as the task's FAILURE (``ReadOnlyError``), while the store,
    once writable again, had the call run again and recorded its SUCCESS."""
    import redis

    # A lease of 2 * TTL: when the store turns read-only, the lease has that less one renewal
    # period left (TTL * 2 / 3), over a second more than the read-only spell below, which a
    # loaded CI machine's late heartbeat must not eat (with TTL it lapsed there once, at 92dbc68).
    f = fleet(TTL=2 * TTL, STORE=store_server.url, LEDGER=redis_url)
    body_s = 3.0
    result = f.client.tasks["fleet.long"].delay(body_s)
    first = started(f, result.id)[0]
    stop = threading.Event()
    seen = watch_states(result, stop)
    time.sleep(max(0.0, first["at"] + body_s - 0.5 - time.time()))
    admin = redis.Redis.from_url(store_server.url)
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # every write is READONLY now
    try:
        time.sleep(TTL * 0.75)  # finish is refused for a while, within the lease
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()
    try:
        assert result.get(timeout=60)["attempt"] == 1
    finally:
        stop.set()
    assert "FAILURE" not in seen, seen
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert types(f.store, result.id)[-1] == COMPLETED
    assert f.store.result(result.id).attempt == 1


def test_a_publish_that_fails_registers_nothing_so_caller_and_store_agree(redis_url):
    """Issue 13, item 3: a publish that fails leaves no registration behind, so recovery
    never sends a call whose caller was told it failed. (Already true on 4a34578, whose
    ``apply_async`` registers only after the broker took the message; this guards it.)"""
    from aaa_celery.stores import open_store

    from .fleet_app import make_app

    client = make_app({"AAA_FLEET_BROKER": "redis://127.0.0.1:1/0", "AAA_FLEET_BACKEND": redis_url,
                       "AAA_FLEET_STORE": redis_url})
    client.conf.broker_connection_retry = False
    client.conf.broker_connection_max_retries = 0
    store = open_store(redis_url)
    try:
        with pytest.raises(Exception):  # noqa: B017 - kombu's OperationalError, whatever wraps it
            client.tasks["fleet.quick"].apply_async((1,), task_id="never-sent", retry=False)
        far = store.now() + 10 * 24 * 3600
        assert [c.call_id for c in store.expired(now=far, unclaimed_grace_s=0)] == []
        assert store.events("never-sent") == [] and store.result("never-sent") is None
    finally:
        store.close()
        client.close()
