"""PostgreSQL recovery times come from the database's clock, not the worker's (issue 13).

Reproduces on 4a34578: ``PostgresStore`` stamped registrations and recovery holds with
``time.time`` of the process, so a worker whose clock ran 1,000 s behind registered calls
that every sweep saw as 1,000 s old, and republished them at once.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from aaa_celery.lifecycle import CallSpec
from aaa_celery.stores import open_store

pytestmark = pytest.mark.postgres

#: A worker process whose wall clock is 1,000 s behind: it registers one call.
SKEWED_WORKER = """
import sys, time
real = time.time
time.time = lambda: real() - 1000.0
from aaa_celery.lifecycle import CallSpec
from aaa_celery.stores import open_store
store = open_store(sys.argv[1])
store.register(CallSpec(sys.argv[2], "refund", request={"task": "refund"}))
print(store.now() - real())
store.close()
"""


def test_a_worker_with_a_skewed_clock_registers_calls_on_the_database_clock(postgres_url):
    call_id = f"c-{uuid.uuid4().hex}"
    done = subprocess.run([sys.executable, "-c", SKEWED_WORKER, postgres_url, call_id],
                          capture_output=True, text=True, timeout=60, check=True)
    store = open_store(postgres_url)
    try:
        # The skewed worker's store clock is the database's, not its own
        assert abs(float(done.stdout.strip())) < 5, done.stdout
        # And a sweep on a worker with a right clock sees the call as just registered
        assert call_id not in {c.call_id for c in store.expired(unclaimed_grace_s=60)}
        assert abs(store.now() - time.time()) < 5
        store.register(CallSpec(f"c-{uuid.uuid4().hex}"))
    finally:
        store.close()
