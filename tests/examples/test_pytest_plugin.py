"""The pytest plugin for users' tests (issue 22 item 7), run as a user runs it: pytest in a
process of its own with ``-p aaa_celery.testing.pytest_plugin``.

* The worked example of docs/testing-your-tools.md, examples/testing/test_refund.py: a
  refund tool under kill -9 (whole worker, pool child), a frozen holder, a duplicate
  delivery, eager mode;
  real workers on the session Redis.
* The checker (in eager mode) fails a test whose tool breaks an invariant, naming it.
* Loaded without an app, the plugin changes nothing for a suite that uses none of its
  fixtures; a fixture asked for without ``--aaa-app`` says what to set.
* It is registered through the ``pytest11`` entry point under its module's name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "aaa_celery.testing.pytest_plugin"

def run_pytest(*args: str, cwd: Path = ROOT, redis_url: str | None = None,
               timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)])}
    if redis_url:
        env["AAA_TEST_REDIS_URL"] = redis_url
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.redis
@pytest.mark.fleet
def test_the_worked_example_passes_on_real_workers(redis_server):
    done = run_pytest("--aaa-app", "examples.testing.refund_app", "examples/testing", "-q",
                      redis_url=redis_server.url)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "5 passed" in done.stdout, done.stdout[-3000:]


BROKEN_APP = '''
from celery import Celery
from aaa_celery import GuardedTask, ToolContext
from aaa_celery.testing import effects

app = Celery("broken_app", broker="memory://")
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])


@app.task(base=GuardedTask, name="broken.pay")
def pay(order_id: str, ctx: ToolContext) -> dict:
    effects.started(ctx)
    effects.apply(ctx)
    effects.returned(ctx, {"paid": order_id})
    return {"paid": "someone else"}          # not what the attempt said it returned
'''

BROKEN_TEST = '''
from broken_app import pay


def test_pay(aaa_eager, aaa_check):
    assert pay.delay("A-1").get() == {"paid": "someone else"}
    aaa_check()
'''


def test_the_checker_fails_a_test_whose_tool_breaks_an_invariant(tmp_path: Path):
    (tmp_path / "broken_app.py").write_text(BROKEN_APP)
    (tmp_path / "test_broken.py").write_text(BROKEN_TEST)
    done = run_pytest("--aaa-app", "broken_app", "-q", cwd=tmp_path, timeout_s=120)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "guard invariants violated" in done.stdout and "I7" in done.stdout, done.stdout[-3000:]


def test_loaded_without_an_app_the_plugin_changes_nothing_until_a_fixture_is_asked_for(tmp_path: Path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    (tmp_path / "test_wants.py").write_text("def test_wants(aaa_eager):\n    pass\n")
    plain = run_pytest("-q", "test_plain.py", cwd=tmp_path, timeout_s=120)
    assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout + plain.stderr
    wants = run_pytest("-q", "test_wants.py", cwd=tmp_path, timeout_s=120)
    assert wants.returncode != 0 and "--aaa-app" in wants.stdout + wants.stderr, wants.stdout + wants.stderr


def test_the_plugin_is_registered_as_a_pytest11_entry_point_under_its_module_name():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}
