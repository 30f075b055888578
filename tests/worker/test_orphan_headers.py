"""The recovery sweep adopts a worker's unacked orphans (calls the store never heard of) from
kombu's ``unacked`` hash on a real Redis broker. That hash holds whatever a sender put in a
message: headers of another shape than Celery's must be passed over, never end the sweep
(a TypeError there ended every sweep before it adopted anything, so every orphan behind
the bad message stayed lost until the visibility timeout)."""

from __future__ import annotations

import json

import pytest
import redis
from celery import Celery

from aaa_celery import GuardedTask
from aaa_celery.worker import app_store
from aaa_celery.worker.broker import RedisBrokerProbe
from aaa_celery.worker.recovery import Recovery

pytestmark = pytest.mark.redis


def test_an_unacked_message_with_foreign_headers_does_not_stop_the_adoption_of_orphans(redis_url):
    # Given a guarded task on a Redis broker
    app = Celery("orphans", broker=redis_url, set_as_current=False)
    app.conf.update(aaa_store_url="memory://orphan-headers", task_serializer="json", accept_content=["json"])

    @app.task(base=GuardedTask, name="orphans.echo", shared=False)
    def echo(x: int) -> int:
        return x

    # and, in kombu's unacked hash, messages taken long ago by a worker that died: first
    # four whose headers or body no Celery sender makes, then one real, never registered call
    client = redis.Redis.from_url(redis_url)
    orphan = app.send_task("orphans.echo", args=[1]).id  # send_task: not registered at publish
    raw = json.loads(client.lpop("celery"))
    foreign = [
        {**raw, "headers": ["not", "a", "mapping"]},
        {**raw, "headers": {**raw["headers"], "task": ["orphans.echo"], "id": "c-list-task"}},
        {**raw, "headers": {**raw["headers"], "id": {"not": "a string"}}},
        {**raw, "headers": {**raw["headers"], "id": "c-bad-body"}, "body": "W1tdLCA1LCB7fV0="},  # [[], 5, {}]
    ]
    for n, message in enumerate([*foreign, raw]):
        client.hset("unacked", f"tag-{n}", json.dumps([message, "", "celery"]))
        client.zadd("unacked_index", {f"tag-{n}": n})  # taken at the epoch's start: long ago

    # When the sweep looks into the broker
    probe = RedisBrokerProbe.for_app(app)
    try:
        Recovery(app, app_store(app), "sweeper@test", probe=probe).sweep()
    finally:
        if probe is not None:
            probe.close()

    # Then the real orphan is adopted (registered, so it is recovered), the others passed over
    assert [record.call_id for record in app_store(app).calls()] == [orphan]
