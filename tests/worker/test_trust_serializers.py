"""A worker refuses to start with content that can run code (issue 12, item 4), on a real
``celery worker`` over Redis."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import pytest
from kombu import Connection, Exchange

from aaa_celery.testing import WorkerProcess, wait_for

from .conftest import ROOT

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

APP = "tests.worker.trust_app"


class Touch:
    """A pickle whose loading creates a file: what an attacker's ``__reduce__`` would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_worker_refuses_to_start_when_accept_content_names_pickle_by_content_type(redis_url, tmp_path):
    """Reproduces on 4a34578: accept_content=['application/x-python-serialize', 'json'] passed
    worker start, and a pickled ``__reduce__`` payload ran in the worker."""
    env = {"AAA_TRUST_BROKER": redis_url, "AAA_TRUST_ACCEPT": "application/x-python-serialize,json"}
    worker = WorkerProcess(APP, hostname=f"pickle-{uuid.uuid4().hex[:6]}@t", pool="solo", env=env,
                           workdir=tmp_path, cwd=ROOT).start()
    marker = tmp_path / "pwned"
    try:
        wait_for(lambda: not worker.alive or worker.is_ready(), 60, "the worker exits or becomes ready")
        if worker.is_ready():
            body = pickle.dumps(((Touch(marker),), {}, {"callbacks": None, "errbacks": None, "chain": None,
                                                       "chord": None}))
            with Connection(redis_url) as conn:
                conn.Producer().publish(
                    body, exchange=Exchange("celery", type="direct"), routing_key="celery",
                    content_type="application/x-python-serialize", content_encoding="binary",
                    headers={"lang": "py", "task": "trust.ping", "id": uuid.uuid4().hex, "retries": 0,
                             "argsrepr": "", "kwargsrepr": "{}", "root_id": None, "parent_id": None},
                )
            wait_for(marker.exists, 10, "the pickle ran")
        wait_for(lambda: not worker.alive, 30, "the worker exits")
    finally:
        worker.stop()
    assert not marker.exists()
    assert worker.proc.returncode != 0
    assert "accept_content: 'application/x-python-serialize'" in worker.log, worker.log[-3000:]
    assert "set accept_content=['json']" in worker.log
