"""The Django example's README says to run ``manage.py migrate`` once, and then its runs start
with no "unapplied migration" warning (issue 42, item 4).

Red on 03c27cd: the example kept its database in memory, so what ``migrate`` made was gone
with its process, and every ``runserver`` warned of the aaa_celery app's unapplied migration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_project"

pytest.importorskip("django")


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env, capture_output=True,
                          text=True, timeout=180)


def test_migrate_once_then_no_migration_is_left_unapplied(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{ROOT}", "AAA_DJANGO_DB": str(tmp_path / "db.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    readme = (EXAMPLE / "README.md").read_text()
    assert "python manage.py migrate" in readme
    done = manage("migrate", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    left = manage("migrate", "--check", env=env)  # what runserver's warning reads
    assert left.returncode == 0, left.stdout + left.stderr
