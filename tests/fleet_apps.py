"""What the Celery apps of the fleet tests share: one Redis for broker, results and store, and a
Redis client per worker process."""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery import Celery

if TYPE_CHECKING:
    from aaa_celery.testing import Fleet

# Each process of a fleet app (a worker, its pool children) writes every thread's stack to its
# stderr (the worker's log) on SIGUSR2: what a test shows when a call it waits for never starts
# (tests/runtime/fleet.py, fleet_logs).
faulthandler.register(signal.SIGUSR2, all_threads=True)

#: JSON only, one message prefetched, results kept 10 minutes.
FLEET_CONF: dict[str, Any] = {
    "task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
    "worker_prefetch_multiplier": 1, "broker_connection_retry_on_startup": True, "result_expires": 600,
}


def redis_app(name: str, url: str) -> Celery:
    """An app whose broker, results and guard store are the Redis at ``url``, swept every 0.5 s."""
    app = Celery(name, broker=url, backend=url)
    app.conf.update(**FLEET_CONF, aaa_store_url=url, aaa_recovery_interval_s=0.5)
    return app


class ProcessRedis:
    """A Redis client of the URL in environment variable ``env``, opened at first use in each
    process (a pool child forked from the worker opens its own)."""

    def __init__(self, env: str) -> None:
        self.env = env
        self._client: Any = None

    def __call__(self) -> Any:
        import redis

        if self._client is None or self._client.connection_pool.pid != os.getpid():
            self._client = redis.Redis.from_url(os.environ[self.env], decode_responses=True)
        return self._client


class ProcessLedger:
    """A :class:`~aaa_celery.testing.Ledger` on the Redis at ``url``, opened at first use in each process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._ledger: Any = None

    def record(self, event: str, ctx: Any, **fields: Any) -> None:
        from aaa_celery.testing import Ledger

        if self._ledger is None or self._ledger._redis.connection_pool.pid != os.getpid():
            self._ledger = Ledger(self.url)
        self._ledger.record(event, ctx=ctx, **fields)


@contextmanager
def started(fleet: Fleet) -> Iterator[Fleet]:
    """``fleet`` started, and stopped at the end; its workers' logs printed if the set-up fails."""
    try:
        yield fleet.start()
    except BaseException:
        print(fleet.logs())
        raise
    finally:
        fleet.stop()
