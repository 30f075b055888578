"""The main-process kill and the duplicate delivery with RabbitMQ as the broker.

Real ``celery worker`` processes of ``fleet_app`` consume from a private RabbitMQ
node (tests/rabbitmq_server.py: Debian's ``rabbitmq-server`` on a loopback port,
``consumer_timeout`` 5 s, checked every 1 s); the guard's store, the result
backend and the effect ledger are the session Redis.

RabbitMQ differs from Redis exactly where the guard works:

- a consumer's death returns its unacked messages to the queue at once (Redis
  waits ``visibility_timeout``, an hour by default), so the copy reaches the other
  worker while the dead holder's lease is still live;
- a consumer that holds a message past ``consumer_timeout`` loses its channel and
  the message is redelivered while the first run goes on (Redis does the same
  after ``visibility_timeout``).

A RabbitMQ node is missing here: the tests skip, and fail under ``CI=true``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from aaa_celery.lifecycle import COMPLETED, STARTED
from aaa_celery.testing import wait_for

from ..conftest import _serve
from ..rabbitmq_server import RabbitMQServer
from .test_fleet_faults import (
    TTL,
    kill_main_mid_call_and_see_attempt_2_elsewhere,
    started,
    types,
)

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

#: The node's consumer_timeout (tests/rabbitmq_server.py's default).
CONSUMER_TIMEOUT_S = 5.0


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitMQServer]:
    yield from _serve(RabbitMQServer)


@pytest.fixture
def amqp_url(rabbitmq_server: RabbitMQServer) -> str:
    """The node's URL, the fleet's queues emptied for this test."""
    rabbitmq_server.purge("celery", "aaa.default")
    return rabbitmq_server.url


@pytest.fixture
def rabbit_fleet(fleet, amqp_url: str, redis_url: str):
    """``rabbit_fleet(**env)``: a fleet over RabbitMQ with the Redis store, backend and ledger."""

    def start(**env):
        return fleet(BROKER=amqp_url, BACKEND=redis_url, STORE=redis_url, LEDGER=redis_url, **env)

    return start


def deliveries(f, task_id: str) -> int:
    return sum(w.log.count(f"[{task_id}] received") for w in f)


def received_at(worker, task_id: str) -> list[float]:
    """When ``worker`` logged each delivery of the call (epoch seconds)."""
    out = []
    for line in worker.log.splitlines():
        if f"[{task_id}] received" in line and line.startswith("["):
            stamp = line[1:24]  # [2026-01-01 12:00:00,123: INFO/MainProcess] ...
            out.append(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def test_rabbitmq_kill_9_main_mid_call_at_least_once_runs_attempt_2_on_other_worker(rabbit_fleet):
    """What happens (measured): RabbitMQ hands the dead worker's message to the other
    worker within milliseconds, while the holder's lease (``lease_ttl_s`` 2 s) is still
    live. That copy finds the call Busy, re-checks for ``4 × wait_poll_s`` (1 s) and is
    dropped (logged ``ignored``, acked). When the lease lapses, a recovery sweep
    republishes the call, and it runs as attempt 2 on the live worker about 3 s after
    the kill. Without the guard, the instant redelivery would itself be attempt 2."""
    f = rabbit_fleet(TTL=TTL)
    result, first, holder = kill_main_mid_call_and_see_attempt_2_elsewhere(f)
    value = result.get(timeout=30)
    assert value["attempt"] == 2
    assert len(f.ledger.entries(result.id, "start")) == 2
    assert types(f.store, result.id) == [STARTED, STARTED, COMPLETED]
    assert f.store.result(result.id).value == value
    # RabbitMQ redelivered at once (Redis would wait visibility_timeout, an hour)
    copies = received_at(f.others(holder)[0], result.id)
    assert copies and copies[0] - first["at"] < 1.5


def test_rabbitmq_redelivery_past_consumer_timeout_runs_once_without_slot_starvation(rabbit_fleet, rabbitmq_server):
    """What happens (measured), a 12 s call with ``consumer_timeout`` 5 s checked every 1 s:

    - about 5.9 s in, RabbitMQ closes the holder's channel (``PRECONDITION_FAILED -
      delivery acknowledgement on channel 1 timed out``) and requeues the message; the
      other worker receives it in the same millisecond;
    - that copy finds the call Busy (the holder's heartbeat keeps the lease) and is
      dropped after 1 s, so quick calls sent meanwhile keep completing on that worker;
    - Celery logs ``Unrecoverable error: PreconditionFailed`` in the holder and begins a
      warm shutdown: its pool child keeps running, the body reaches the line after its
      sleep, attempt 1's result is recorded, and then the holder process exits;
    - so: 1 body start, 1 result (attempt 1), 2 deliveries. Plain Celery runs the body
      twice here (celery-facts.md §8). The worker lost is the cost of the timeout:
      run workers under a supervisor, and set ``consumer_timeout`` above the longest call.
    """
    if not rabbitmq_server.owned:
        pytest.skip("needs the test's own node (its consumer_timeout is set low)")
    f = rabbit_fleet(TTL=TTL)
    result = f.client.tasks["fleet.long"].delay(12.0)
    first = started(f, result.id)[0]
    holder = f.worker_of(first["pid"])
    quick = []
    for i in range(8):
        quick.append(f.client.tasks["fleet.quick"].delay(i))
        time.sleep(1.0)
    assert [q.get(timeout=20) for q in quick] == [i + 1 for i in range(8)]
    value = result.get(timeout=30)
    assert value["attempt"] == 1
    time.sleep(1.0)
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert [a["attempt"] for a in f.ledger.entries(result.id, "after")] == [1]
    assert types(f.store, result.id) == [STARTED, COMPLETED]
    assert "PRECONDITION_FAILED" in holder.log, "RabbitMQ did not enforce consumer_timeout"
    assert deliveries(f, result.id) >= 2, "RabbitMQ did not redeliver the live call"
    # Celery treats the closed channel as unrecoverable: the holder shuts down warm
    wait_for(lambda: not holder.alive, 20, "the holder's exit after PRECONDITION_FAILED")
