"""``celery report`` and ``celery inspect conf`` mask the store's password for every app shape
the docs show: ``ToolHandler.bind()``, ``install()``, ``@app.task(base=GuardedTask)`` alone,
and ``Celery(task_cls=...)`` (issue 35, item 3).

Reproduces on 03c27cd: ``celery report`` printed ``aaa_store_url`` in clear for the last two
shapes. The masking was installed only when a guarded task was bound to the app, and
``celery report`` binds none; it is now installed by the ``celery`` command's ``aaa`` plugin,
which every ``celery`` command loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from aaa_celery.testing import WorkerProcess

from .test_masked_settings import with_password

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

PASSWORD = "s3cretpw"

SHAPES = {
    "bind": ("", """
        from aaa_celery.tools import ToolHandler, ToolRegistry, tool

        @tool
        def ping() -> str:
            \"\"\"Ping.\"\"\"
            return "pong"

        ToolHandler(ToolRegistry([ping])).bind(app)
        """),
    "install": ("", """
        import aaa_celery

        aaa_celery.install(app)
        """),
    "base": ("", """
        from aaa_celery import GuardedTask

        @app.task(base=GuardedTask)
        def refund(order_id: int) -> str:
            return "ok"
        """),
    "task_cls": (', task_cls="aaa_celery.worker:GuardedTask"', """
        @app.task
        def refund(order_id: int) -> str:
            return "ok"
        """),
}


def write_app(where: Path, shape: str) -> str:
    extra, body = SHAPES[shape]
    module = f"shape_{shape}"
    (where / f"{module}.py").write_text(
        "import os\n\nfrom celery import Celery\n\n"
        f'app = Celery("{module}", broker=os.environ["SHAPE_BROKER"]{extra})\n'
        'app.conf.aaa_store_url = os.environ["SHAPE_STORE"]\n' + textwrap.dedent(body))
    return module


def celery(module: str, where: Path, *args: str, env: dict[str, str]) -> str:
    pythonpath = os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-m", "celery", "-A", module, *args], capture_output=True, text=True,
                          timeout=120, cwd=where, env={**os.environ, **env, "PYTHONPATH": pythonpath})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("shape", list(SHAPES))
def test_celery_report_masks_the_store_password(shape, redis_url, tmp_path):
    module = write_app(tmp_path, shape)
    env = {"SHAPE_BROKER": redis_url, "SHAPE_STORE": with_password(redis_url, PASSWORD)}
    report = celery(module, tmp_path, "report", env=env)
    assert "aaa_store_url" in report, report
    assert PASSWORD not in report, report
    assert "default:********@" in report, report


@pytest.mark.parametrize("shape", ["base", "task_cls"])
def test_celery_inspect_conf_masks_the_store_password(shape, redis_url, tmp_path):
    module = write_app(tmp_path, shape)
    env = {"SHAPE_BROKER": redis_url, "SHAPE_STORE": with_password(redis_url, PASSWORD),
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)}
    hostname = f"shape-{uuid.uuid4().hex[:6]}@t"
    worker = WorkerProcess(module, hostname=hostname, pool="solo", env=env, workdir=tmp_path, cwd=tmp_path).start()
    try:
        worker.wait_ready()
        shown = celery(module, tmp_path, "inspect", "conf", "-d", hostname, "--json", "--timeout", "10", env=env)
    finally:
        worker.stop()
    assert "aaa_store_url" in shown, shown
    assert PASSWORD not in shown, shown
