"""A compression bomb for a guarded task is refused before it inflates (issue 21, item 4): a
raw message published through kombu to a real Redis broker, consumed by a real prefork
``celery worker``.

Reproduces on c79799f: kombu inflates a message with a ``compression`` header inside
``Message.__init__``, in the worker's main process, before the guard's size check ran; a
200 KiB message that inflates to 200 MiB took the worker's peak RSS up by hundreds of MB
before it was refused (a few MB on the wire would kill the worker).
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from pathlib import Path

import pytest
import redis
from kombu import Connection, Exchange

from aaa_celery import open_store
from aaa_celery.testing import WorkerProcess, wait_for

from .conftest import ROOT
from .test_trust_messages import EMBED, QUEUES, Row, proto2_headers
from .trust_app import make_app

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

INFLATED = 200 * 1024 * 1024


def peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def bomb() -> bytes:
    """A zlib stream (kombu's ``application/x-gzip``) of a task body padded to 200 MiB."""
    z = zlib.compressobj(9)
    head, tail = b'[["', b'"], {}, ' + json.dumps(EMBED).encode() + b"]"
    out = [z.compress(head)]
    chunk = b"x" * (1024 * 1024)
    out += [z.compress(chunk) for _ in range(INFLATED // len(chunk))]
    out += [z.compress(tail), z.flush()]
    return b"".join(out)


def test_a_gzip_bomb_is_refused_before_it_inflates_and_the_worker_keeps_serving(redis_url, tmp_path):
    env = {"AAA_TRUST_BROKER": redis_url}
    worker = WorkerProcess("tests.worker.trust_app", hostname=f"bomb-{uuid.uuid4().hex[:6]}@t", pool="prefork",
                           concurrency=1, env=env, workdir=tmp_path, cwd=ROOT).start().wait_ready()
    client, store, r = make_app(env), open_store(redis_url), redis.Redis.from_url(redis_url)
    try:
        assert client.tasks["trust.ping"].delay(1).get(timeout=30) == 2  # warm
        before = peak_rss_kb(worker.pid)
        # Given a guarded task's message of 200 KiB that inflates to 200 MiB
        body = bomb()
        assert len(body) < 1024 * 1024
        row = Row("gzip bomb", None, "refused")
        with Connection(redis_url) as conn:
            conn.Producer().publish(body, exchange=Exchange("celery", type="direct"), routing_key=QUEUES[row.task],
                                    content_type="application/json", content_encoding="utf-8",
                                    headers={**proto2_headers(row), "compression": "application/x-gzip"})
        # When the worker takes it, Then it is dropped (not back in the queue, not unacked) ...
        wait_for(lambda: r.llen("celery") == 0 and r.hlen("unacked") == 0 and store.result(row.id) is not None,
                 60, "the bomb was consumed and refused")
        # ... without inflating it: the worker's peak RSS grew by less than 50 MB
        grown_mb = (peak_rss_kb(worker.pid) - before) / 1024
        assert grown_mb < 50, f"peak RSS grew by {grown_mb:.0f} MB"
        outcome = store.result(row.id)
        assert outcome is not None and outcome.error == "ToolArgsError" and "inflate" in outcome.message, outcome
        # the worker keeps serving, and the bomb never comes back
        assert client.tasks["trust.ping"].delay(2).get(timeout=30) == 3
        for kind in ("gzip", "bzip2", "lzma"):  # a compressed message within the bound runs
            assert client.tasks["trust.ping"].apply_async((4,), compression=kind).get(timeout=30) == 5
        time.sleep(2)
        assert r.llen("celery") == 0 and r.hlen("unacked") == 0
        assert worker.log.count(row.id) <= 2, worker.log[-3000:]
        assert worker.alive
    finally:
        worker.stop()
        store.close()
