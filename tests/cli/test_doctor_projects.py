"""``celery -A ... aaa doctor`` on real projects, run as a user runs it (a subprocess in the
project's directory): the Django example (with a real worker answering pings), a Django
project without the aaa pages (tests/django_plain), and the Flask example.

Red on c79799f: the page-less Django project failed "web authorize" (the check ran whenever
DJANGO_SETTINGS_MODULE was set) and exited 1; ``--flask-app app:app`` (the example has
``create_app``) crashed with a traceback; a project whose tasks set no timeout read
"timeouts (0 s)"; a mistyped setting and a memory:// store passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aaa_celery.testing import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
DJANGO_EXAMPLE = ROOT / "examples" / "django_project"
FLASK_EXAMPLE = ROOT / "examples" / "flask_app"

pytestmark = pytest.mark.redis
pytest.importorskip("django")
pytest.importorskip("flask")


def doctor(app: str, cwd: Path, env: dict[str, str], *args: str) -> tuple[int, dict[str, str], str]:
    """Run the doctor; its exit code, each check's status by name, and its whole output."""
    paths = os.pathsep.join(p for p in (str(cwd), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", app, "aaa", "doctor", "--ping-timeout", "2", *args],
                          cwd=cwd, env={**os.environ, **env, "PYTHONPATH": paths}, capture_output=True, text=True,
                          timeout=180)
    output = proc.stdout + proc.stderr
    statuses = {}
    for line in proc.stdout.splitlines():
        status, _, rest = line.partition(" ")
        statuses[rest.strip().partition(":")[0]] = status.lower()
    return proc.returncode, statuses, output


@pytest.fixture
def django_worker(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """A real worker of the Django example on the test Redis (broker and store)."""
    worker = WorkerProcess("proj", hostname="doctor-django@t", pool="solo", env={"AAA_REDIS_URL": redis_url},
                           workdir=tmp_path, cwd=DJANGO_EXAMPLE)
    worker.start()
    try:
        worker.wait_ready(90)
        yield redis_url
    finally:
        worker.stop()


def test_the_django_example_passes_every_check(django_worker):
    code, statuses, output = doctor("proj", DJANGO_EXAMPLE, {"AAA_REDIS_URL": django_worker})
    assert code == 0, output
    assert set(statuses.values()) == {"pass"}, output
    assert {"setting names", "store reachable", "store shared", "redis persistence", "worker node names",
            "web authorize"} <= set(statuses), output
    assert "Traceback" not in output


def test_a_django_project_without_the_pages_passes_with_no_web_check(redis_url):
    code, statuses, output = doctor("tests.django_plain.celery_app", ROOT, {"AAA_PLAIN_BROKER": redis_url})
    assert code == 0, output
    assert "web authorize" not in statuses, output
    assert statuses["store reachable"] == "pass" and statuses["setting names"] == "pass", output
    assert "(0 s)" not in output and "no task sets timeout_s" in output  # it has no timeout_s
    assert set(statuses.values()) <= {"pass", "warn"}, output  # no worker: node names warn


def test_a_django_projects_setting_mistakes_are_check_lines(redis_url):
    code, statuses, output = doctor("tests.django_plain.celery_app", ROOT,
                                    {"AAA_PLAIN_BROKER": redis_url, "AAA_PLAIN_UNPREFIXED": "1", "AAA_PLAIN_TYPO": "1"})
    assert code == 1, output
    assert statuses["setting names"] == "fail", output
    assert "rename it CELERY_AAA_STORE_URL" in output and "did you mean 'CELERY_AAA_STORE_URL'" in output
    assert "Traceback" not in output


def test_the_flask_example_passes_and_a_wrong_app_name_is_a_failed_check_line(redis_url):
    env = {"AAA_REDIS_URL": redis_url}
    for target in ("app:create_app", "app"):  # as `flask --app app` finds the factory
        code, statuses, output = doctor("worker", FLASK_EXAMPLE, env, "--flask-app", target)
        assert code == 0, output
        assert statuses["web authorize"] == "pass" and "fail" not in statuses.values(), output
    code, statuses, output = doctor("worker", FLASK_EXAMPLE, env, "--flask-app", "app:app")
    assert code == 1, output
    assert statuses["web authorize"] == "fail", output
    assert "try app:create_app" in output and "Traceback" not in output
    assert statuses["store reachable"] == "pass", output  # the other checks still ran
    code, statuses, output = doctor("worker", FLASK_EXAMPLE, env, "--flask-app", "no_such_module:app")
    assert code == 1 and statuses["web authorize"] == "fail" and "No module named" in output, output


def test_the_flask_example_passes_from_its_own_directory_as_a_user_runs_it(redis_url):
    """Red on 03c27cd: run from ``examples/flask_app`` with nothing but the installed package
    on the path, as its README says, ``--flask-app app`` failed with ``No module named 'app'``:
    Celery had taken the current directory off ``sys.path`` before the doctor imported it
    (``flask --app app`` finds it there)."""
    env = {**os.environ, "AAA_REDIS_URL": redis_url}
    env.pop("PYTHONPATH", None)
    celery = str(Path(sys.executable).with_name("celery"))  # the console script: no `-m`, so no '' on sys.path
    proc = subprocess.run([celery, "-A", "worker", "aaa", "doctor", "--ping-timeout", "2",
                           "--flask-app", "app"], cwd=FLASK_EXAMPLE, env=env, capture_output=True, text=True,
                          timeout=180)
    output = proc.stdout + proc.stderr
    assert "No module named" not in output, output
    assert "PASS web authorize" in output, output
    assert proc.returncode == 0, output  # issue 42's acceptance: it exits 0 on the example
