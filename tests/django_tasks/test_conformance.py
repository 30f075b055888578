"""The conformance run (``conformance.py``, Django's public task API only) on the guarded
backend: here (Django 5.2 and the ``django-tasks`` backport on this Python), and on Django 6.1
in a virtualenv of its own wherever the machine has a Python of 3.12 or later."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .django6 import newer_python

ROOT = Path(__file__).resolve().parents[2]
NEWER = newer_python()


def conformance(python: str, tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AAA_DT_SQLITE": str(tmp_path / "db.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([python, "-m", "tests.django_tasks.conformance"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    return done.stdout


def test_conformance_on_this_python(tmp_path):
    out = conformance(sys.executable, tmp_path)
    assert "checks passed on" in out


# the test id names the Python it ran on (``--durations`` and ``-v`` show it in CI's log)
@pytest.mark.build
@pytest.mark.parametrize("python", [NEWER], ids=[f"python={NEWER or 'none'}"])
def test_conformance_on_django_6(python, django6_python, tmp_path):
    out = conformance(str(django6_python), tmp_path)
    print(f"django.tasks conformance on Django 6 with {python}: {out.strip()}")
    assert "on django.tasks (Django 6.1" in out
