"""A call whose spec the store cannot write fails once; it is never handed back forever.

Reproduces on bffa76a: ``begin`` took any exception for store trouble, retried it for a
lease TTL and handed the message back to the broker, which delivered it again: a call
whose arguments did not encode (bytes or ``Decimal`` arguments under stdlib ``json``,
before 10a4c93) was requeued forever and never ran nor failed.

Reproduced again on 4dfc08d for SQLite and PostgreSQL (the one-transaction begin writes the
spec only for a call it has not seen, so a registered call's unencodable delivery ran its
body), and on the memory store always (it never encodes): the runner now checks that the
spec encodes before it begins, once for every store.
"""

from __future__ import annotations

import time

import pytest

from aaa_celery.config import GuardConfig
from aaa_celery.guard import GuardRunner
from aaa_celery.lifecycle import CallSpec
from aaa_celery.stores import open_store


@pytest.fixture(params=["memory", "sqlite", "postgresql", "redis"])
def store(request, tmp_path):
    urls = {"memory": lambda: "memory://", "sqlite": lambda: f"sqlite:///{tmp_path}/store.db",
            "postgresql": lambda: request.getfixturevalue("postgres_url"),
            "redis": lambda: request.getfixturevalue("redis_url")}
    url = urls[request.param]()
    store = open_store(url)
    yield store
    store.close()


def test_a_call_the_store_cannot_write_fails_once_with_its_error_recorded(store):
    store.register(CallSpec("call-1", "refund", request={"task": "refund"}))  # as sent
    unencodable = CallSpec("call-1", "refund", request={"task": "refund", "args": [object()]})
    runner = GuardRunner(store, GuardConfig(lease_ttl_s=5))
    started = time.monotonic()
    with pytest.raises(TypeError, match="could not record this call"):
        runner.run(unencodable, "w1", lambda attempt: pytest.fail("the body ran"))
    assert time.monotonic() - started < 4.0  # not retried as store trouble for the lease TTL
    recorded = store.result("call-1")
    assert recorded is not None and recorded.error == "TypeError" and recorded.attempt == 0
    again = GuardRunner(store, GuardConfig(lease_ttl_s=5))
    with pytest.raises(TypeError):  # a later copy gets the same recorded answer, still not run
        again.run(CallSpec("call-1", "refund", request={"task": "refund"}), "w2",
                  lambda attempt: pytest.fail("the body ran"))
