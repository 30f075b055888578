"""Passwords in ``aaa_*`` settings are masked where Celery shows the settings (issue 21, item 6):
``celery inspect conf`` from another process against a real worker, and ``celery report``.

Reproduces on c79799f: both printed ``aaa_store_url = redis://:s3cretpw@...`` in clear (anyone
on the broker can ask a worker for its settings), while the broker and backend URLs were
masked; a PostgreSQL DSN leaked the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from aaa_celery.testing import WorkerProcess

from .conftest import ROOT

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

APP = "tests.worker.trust_app"


def with_password(url: str, password: str) -> str:
    """The test server's URL with a password in it (its default user takes any password)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://default:{password}@{rest}"


def celery(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "celery", "-A", APP, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_store_passwords_are_masked_in_inspect_conf_and_report(redis_url, tmp_path):
    store = with_password(redis_url, "s3cretpw")
    env = {"AAA_TRUST_BROKER": redis_url, "AAA_TRUST_STORE": store}
    hostname = f"masked-{uuid.uuid4().hex[:6]}@t"
    worker = WorkerProcess(APP, hostname=hostname, pool="solo", env=env, workdir=tmp_path, cwd=ROOT).start()
    try:
        worker.wait_ready()
        # When another process asks the worker for its settings
        shown = celery("inspect", "conf", "-d", hostname, "--json", "--timeout", "10",
                       env={"AAA_TRUST_BROKER": redis_url})
        # Then the store's URL is there, its password masked
        assert "aaa_store_url" in shown, shown
        assert "s3cretpw" not in shown, shown
        assert "default:********@" in shown, shown
    finally:
        worker.stop()
    # and celery report masks a PostgreSQL DSN's password alike (both URL and keyword forms)
    for dsn in ("postgresql+psycopg://app:pgs3cret@127.0.0.1:5432/shop",
                "postgresql+psycopg:///shop?host=127.0.0.1&password=pgs3cret"):
        report = celery("report", env={"AAA_TRUST_BROKER": redis_url, "AAA_TRUST_STORE": dsn})
        assert "aaa_store_url" in report, report
        assert "pgs3cret" not in report, report
