"""``manage.py check`` on the guarded backend (aaa_celery.E001…E007), and guard options that
fail when the task's module is imported, naming the field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis]


def manage(case: str, redis_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.django_tasks.check_settings",
           "AAA_DT_CHECK": case, "AAA_DT_BROKER": redis_url, "AAA_DT_SQLITE": str(tmp_path / "db.sqlite3")}
    return subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("case", "ids"), [
    ("ok", []),
    ("faults", ["E002", "E003", "E004", "E005"]),
    ("store+installed", ["E007", "W001"]),  # unreachable: a warning, so migrate and runserver go on
    ("app", ["E006"]),
    ("nostore", ["E001"]),
])
def test_manage_py_check_reports_each_misconfiguration_by_its_id(case, ids, redis_url, tmp_path):
    done = manage(case, redis_url, tmp_path, "check")
    found = sorted(set(re.findall(r"\(aaa_celery\.([EW]\d{3})\)", done.stdout + done.stderr)))
    assert found == ids, done.stdout + done.stderr
    assert (done.returncode == 0) == (not [i for i in ids if i.startswith("E")]), done.stderr


BAD_OPTIONS = {
    "task(delivery='sometimes')(refund)": "delivery",
    "task(max_attempts=0)(refund)": "max_attempts",
    "task(guard={'lease_ttl_s': -1})(refund)": "lease_ttl_s",
    "task(guard={'lease_tll_s': 5})(refund)": "lease_tll_s",
    "task(idempotency_key='refund')(refund)": "idempotency_key",
    "task(guarded(delivery='sometimes')(refund))": "delivery",
    "guarded(deliver='at_most_once')": "deliver",
}

IMPORT_EACH = """
import json, sys
import django
django.setup()
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task
from aaa_celery.contrib.django.tasks import guarded
import badtasks

refused = {}
for line in sys.argv[1:]:
    try:
        exec(line, {"task": task, "guarded": guarded, "refund": badtasks.refund})
    except Exception as e:
        refused[line] = [type(e).__name__, str(e)]
print(json.dumps(refused))
"""


def test_a_bad_guard_option_fails_when_the_task_is_defined_naming_the_field(redis_url, tmp_path):
    (tmp_path / "badtasks.py").write_text("def refund(order_id):\n    return order_id\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "AAA_DT_BROKER": redis_url,
           "DJANGO_SETTINGS_MODULE": "tests.django_tasks.check_settings", "AAA_DT_SQLITE": str(tmp_path / "db")}
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, *BAD_OPTIONS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused = json.loads(done.stdout.strip().splitlines()[-1])
    for line, field in BAD_OPTIONS.items():
        assert line in refused, f"{line} was accepted"
        kind, message = refused[line]
        assert kind in ("InvalidTask", "InvalidTaskError", "ConfigError"), (line, kind, message)
        assert field in message, (line, message)


def test_manage_py_check_passes_on_the_example_and_its_refund_task_runs(redis_url, tmp_path):
    example = ROOT / "examples" / "django_project"
    env = {**os.environ, "PYTHONPATH": f"{example}{os.pathsep}{ROOT}", "AAA_REDIS_URL": redis_url}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=example, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    # the refund, eagerly (no worker): enqueued, run under the guard, its result read from the store
    script = ("from django.core.management import call_command; call_command('migrate', verbosity=0); "
              "from proj.celery import app; app.conf.task_always_eager = True; "
              "from shop.tasks import refund; r = refund.enqueue('A-100', 500); d = refund.get_result(r.id); "
              "print(d.status, d.attempts, d.return_value)")
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=example, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "SUCCESSFUL 1 {'order_id': 'A-100', 'refunded_cents': 500}"
