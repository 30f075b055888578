"""The sweeper's look into a Redis broker (``aaa_celery.worker.broker``): where kombu
holds a task's message, read in one script, on real Redis with real kombu messages."""

from __future__ import annotations

import json

import pytest
import redis
from celery import Celery

from aaa_celery.worker.broker import ABSENT, QUEUED, TAKEN, UNKNOWN, RedisBrokerProbe

pytestmark = pytest.mark.redis


def app_on(url: str, **transport) -> Celery:
    app = Celery("probe", broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"], broker_transport_options=transport)
    return app


def test_probe_tells_queued_taken_absent_and_unknown(redis_url):
    # Given three messages sent to the default queue, with a key prefix and a priority
    app = app_on(redis_url, global_keyprefix="pre:")
    queued = app.send_task("t.queued").id
    prio = app.send_task("t.prio", priority=6).id
    taken = app.send_task("t.taken").id
    client = redis.Redis.from_url(redis_url)
    # (a worker took "taken": kombu moved it to its unacked hash)
    raw = next(m for m in client.lrange("pre:celery", 0, -1) if taken.encode() in m)
    client.lrem("pre:celery", 1, raw)
    client.hset("pre:unacked", "tag-1", json.dumps([json.loads(raw), "", "celery"]))
    probe = RedisBrokerProbe.for_app(app)
    assert probe is not None and probe.queue_keys("celery")[0] == "pre:celery"

    # When the sweeper looks for them (and for one the broker never had)
    found = probe.find([queued, prio, taken, "never-sent"], ["celery"])

    # Then each is where kombu holds it
    assert found == {queued: QUEUED, prio: QUEUED, taken: TAKEN, "never-sent": ABSENT}

    # And past its scan limit, a probe reads the oldest end and cannot tell about the rest
    for _ in range(5):
        app.send_task("t.newer")
    short = RedisBrokerProbe(redis_url, {"global_keyprefix": "pre:"}, scan_limit=3)
    assert short.find([queued, "never-sent"], ["celery"]) == {queued: QUEUED, "never-sent": UNKNOWN}
    probe.close()
    short.close()


def test_probe_is_only_for_redis_brokers():
    assert RedisBrokerProbe.for_app(Celery("x", broker="amqp://guest@localhost//")) is None
    assert RedisBrokerProbe.for_app(Celery("x", broker="memory://")) is None
