"""The conformance run (``conformance.py``, Django's public task API only) on the guarded
backend: here (Django 5.2 and the ``django-tasks`` backport on this Python), and on Django 6.1
in a virtualenv of its own wherever the machine has a Python of 3.12 or later."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ("python3.13", "python3.12", "/root/.pyenv/versions/3.13.0/bin/python3",
              "/root/.pyenv/versions/3.12.1/bin/python3")


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


def newer_python() -> str | None:
    """A Python of 3.12 or later (Django 6 needs one), or None."""
    for name in CANDIDATES:
        found = shutil.which(name) or (name if os.path.exists(name) else None)
        if not found:
            continue
        version = subprocess.run([found, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                 capture_output=True, text=True)
        if version.stdout.strip() == "True":
            return found
    return None


NEWER = newer_python()


# the test id names the Python it ran on (``--durations`` and ``-v`` show it in CI's log)
@pytest.mark.build
@pytest.mark.parametrize("python", [NEWER], ids=[f"python={NEWER or 'none'}"])
def test_conformance_on_django_6(python, tmp_path):
    if python is None:
        pytest.skip("no Python >= 3.12 on this machine: Django 6 cannot be installed, its run is skipped")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, f"{ROOT}[django-tasks]", "django>=6.1,<6.2"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    out = conformance(str(venv / "bin" / "python"), tmp_path)
    print(f"django.tasks conformance on Django 6 with {python}: {out.strip()}")
    assert "on django.tasks (Django 6.1" in out
