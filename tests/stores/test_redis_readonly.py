"""A Redis store whose server answers READONLY (a primary demoted by a failover) is
unavailable, not broken: ``StoreUnavailable``, which every caller handles (issue 13).

Reproduces on 4a34578: ``register`` raised redis-py's ``ReadOnlyError`` to the code that
published the call (the chaos run's ``store_failover``), after the message was sent.
"""

from __future__ import annotations

import uuid

import pytest

from aaa_celery.errors import StoreUnavailable
from aaa_celery.lifecycle import CallSpec
from aaa_celery.stores import open_store

from ..conftest import unavailable
from ..servers import RedisServer, ServerUnavailable

pytestmark = pytest.mark.redis


def test_a_read_only_redis_store_is_unavailable():
    try:
        server = RedisServer.start(appendonly=False)
    except ServerUnavailable as e:
        unavailable(str(e))
    store = open_store(server.url)
    try:
        import redis

        admin = redis.Redis.from_url(server.url)
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica of nothing: read-only
        with pytest.raises(StoreUnavailable, match="read only"):
            store.register(CallSpec(f"c-{uuid.uuid4().hex}", "t"))
        admin.execute_command("REPLICAOF", "NO", "ONE")
        store.register(CallSpec(f"c-{uuid.uuid4().hex}", "t"))
        admin.close()
    finally:
        store.close()
        server.stop(kill=True)
