"""Store trouble during a call: the heartbeat survives an unexpected store error.

Reproduced on 507e4bb: the watchdog caught only ``StoreError``. A Redis that turns
read-only (a failover demotes it to a replica: ``READONLY`` replies, a ``ResponseError``
that is not a connection error) stopped the call's renewals for good, with no cancel:
when the store came back, another worker claimed attempt 2 while attempt 1's body ran
on uncancelled.
"""

from __future__ import annotations

import time

import pytest
import redis

from aaa_celery.lifecycle import COMPLETED, STARTED

from .test_fleet_faults import started, types
from .test_fleet_results import store_server  # noqa: F401 - a fixture

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

TTL = 2.0


def test_a_read_only_store_cancels_the_body_instead_of_letting_it_overlap_attempt_2(fleet, store_server, redis_url):  # noqa: F811
    f = fleet(TTL=TTL, STORE=store_server.url, LEDGER=redis_url)
    result = f.client.tasks["fleet.long"].delay(8.0)
    first = started(f, result.id)[0]
    admin = redis.Redis.from_url(store_server.url)
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # demoted: every write is READONLY now
    try:
        time.sleep(TTL + 2.5)  # past the TTL since the last renewal: the holder must give up
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()
    # attempt 1 was cancelled: its body never reached the line after its sleep
    second = started(f, result.id, 2, 30)[1]
    assert result.get(timeout=30)["attempt"] == 2
    assert f.ledger.entries(result.id, "after") and all(
        e["attempt"] == 2 for e in f.ledger.entries(result.id, "after")
    ), f.ledger.entries(result.id, "after")
    assert second["at"] > first["at"]
    # one result, attempt 2's; attempt 1 left none (its fenced audit may not have been writable)
    assert types(f.store, result.id).count(STARTED) == 2
    assert f.store.result(result.id).attempt == 2


def test_store_paused_through_finish_longer_than_the_lease_gives_one_result_and_no_attempt_2(
    fleet, store_server, redis_url  # noqa: F811
):
    """Issue 13, item 1: the lease lives until the result is durable.

    Redis (the store) is paused (``CLIENT PAUSE``, from a second connection) from just before
    the body returns until well past the lease TTL and past the store's socket timeout, so
    ``finish`` and the renewals time out and are retried. When the store answers again the
    result is recorded: one result, attempt 1's, and no attempt 2 ever starts, though the
    other worker's recovery sweep runs every second.

    This passes on 4a34578 too: with no socket timeout, its ``finish`` simply waited out the
    pause and ran first when Redis resumed. It guards the socket timeouts added since (a
    timed-out ``finish`` is retried at once, under a lease still renewed); the lapse itself
    is reproduced by tests/guard/test_lease_lifetime.py.
    """
    f = fleet(TTL=TTL, STORE=store_server.url, LEDGER=redis_url)
    body_s = 3.0
    result = f.client.tasks["fleet.long"].delay(body_s)
    first = started(f, result.id)[0]
    time.sleep(max(0.0, first["at"] + body_s - 0.4 - time.time()))
    admin = redis.Redis.from_url(store_server.url)
    try:
        admin.execute_command("CLIENT", "PAUSE", int((3 * TTL + 1.5) * 1000), "ALL")
        value = result.get(timeout=60)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    assert value["attempt"] == 1
    time.sleep(3 * TTL)  # room for a wrong attempt 2 to show
    assert len(f.ledger.entries(result.id, "start")) == 1, f.ledger.entries(result.id, "start")
    assert types(f.store, result.id) == [STARTED, COMPLETED]
    assert f.store.result(result.id).attempt == 1
