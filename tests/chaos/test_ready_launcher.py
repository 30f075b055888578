"""The launcher of ``aaa_celery.testing``: a real ``celery worker`` that writes its ready file.

The ready file is a test-only hook, so it lives in ``aaa_celery.testing`` and is
connected only by the launcher ``python -m aaa_celery.testing.worker``, never at import.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aaa_celery.testing import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.fleet
def test_a_worker_of_a_plain_celery_app_is_ready_by_its_ready_file(tmp_path):
    (tmp_path / "plainapp.py").write_text("from celery import Celery\napp = Celery('plain', broker='memory://')\n")
    w = WorkerProcess("plainapp", hostname="plain@test", pool="solo", loglevel="WARNING", cwd=tmp_path,
                      workdir=tmp_path / "w")
    assert w.command()[1:5] == ["-m", "aaa_celery.testing.worker", "-A", "plainapp"]
    assert w.command()[5] == "worker"
    with w:
        assert w.ready_path.read_text() == str(w.pid)
        assert " ready." not in w.log  # WARNING hides Celery's line: the file alone said so
    assert w.proc is not None and w.proc.returncode == 0


def test_importing_testing_connects_nothing_and_the_launcher_connects_once(tmp_path):
    code = (
        "import os, sys\n"
        "from celery.signals import worker_ready\n"
        "import aaa_celery.testing\n"
        "assert 'aaa_celery.chaos' not in sys.modules\n"
        "assert not worker_ready.receivers, worker_ready.receivers\n"
        "from aaa_celery.testing.ready import READY_FILE_ENV, connect_ready_file\n"
        "connect_ready_file(); connect_ready_file()\n"
        "assert len(worker_ready.receivers) == 1, worker_ready.receivers\n"
        f"os.environ[READY_FILE_ENV] = {str(tmp_path / 'ready')!r}\n"
        "worker_ready.send(sender=None)\n"
        f"assert open({str(tmp_path / 'ready')!r}).read() == str(os.getpid())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
