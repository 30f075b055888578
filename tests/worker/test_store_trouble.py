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

from aaa_celery.lifecycle import STARTED

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
