"""``examples/openai_agents_refund.py`` runs as its docstring says: a worker of its own on Redis,
the agent against its local stub model; run twice, it refunds once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from ..runtime.fleet import ROOT, Worker

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_the_example_runs_offline_and_a_second_run_refunds_nothing(redis_server: Any, tmp_path: Path):
    url = redis_server.url.rsplit("/", 1)[0] + "/12"  # a db of our own
    redis.Redis.from_url(url).flushdb()
    env = {"AAA_REDIS_URL": url}
    worker = Worker("example", ["aaa.default"], 1, env, tmp_path, app="examples.openai_agents_refund")
    try:
        worker.wait_ready()
        # both drives in one process: importing the SDK is most of a drive's time
        twice = "import asyncio, runpy; m = runpy.run_path('examples/openai_agents_refund.py'); " \
                "asyncio.run(m['main']()); asyncio.run(m['main']())"
        done = subprocess.run([sys.executable, "-c", twice], cwd=ROOT, timeout=180, capture_output=True, text=True,
                              env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.splitlines() == ["Done: order A-100: 30 EUR, paid (A-100); refunded 30 EUR on A-100"] * 2
    finally:
        worker.stop()
    assert worker.log.count("REFUND 30 EUR on A-100") == 1
