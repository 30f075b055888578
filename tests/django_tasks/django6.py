"""Django 6.1 in a virtualenv of its own, on a Python of 3.12 or later (Django 6 needs one),
for the conformance run and the fleet: ``django.tasks`` itself, where this interpreter (3.11)
has only the ``django-tasks`` backport.

The venv gets this checkout's dependencies (``.[django-tasks,postgres]``) and Django 6.1, and a
``.pth`` line that puts this checkout first on ``sys.path``: its workers, which run without
``PYTHONPATH``, import this checkout's ``aaa_celery`` and ``tests`` as the web side does."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ("python3.13", "python3.12", "/root/.pyenv/versions/3.13.0/bin/python3",
              "/root/.pyenv/versions/3.12.1/bin/python3")


def newer_python() -> str | None:
    """A Python of 3.12 or later on this machine, or None."""
    for name in CANDIDATES:
        found = shutil.which(name) or (name if os.path.exists(name) else None)
        if not found:
            continue
        version = subprocess.run([found, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                 capture_output=True, text=True)
        if version.stdout.strip() == "True":
            return found
    return None


def build(where: Path, python: str) -> Path:
    """Make the venv in ``where`` with ``python``; its interpreter."""
    venv = where / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    exe = venv / "bin" / "python"
    done = subprocess.run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           f"{ROOT}[django-tasks,postgres]", "django>=6.1,<6.2"],
                          capture_output=True, text=True, timeout=900, cwd=where)
    assert done.returncode == 0, done.stderr
    site = subprocess.run([str(exe), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "aaa_checkout.pth").write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n")
    (where / "built").write_text(str(exe))
    return exe


def built(where: Path) -> Path | None:
    """The venv's interpreter, if :func:`build` finished in ``where`` before."""
    mark = where / "built"
    return Path(mark.read_text()) if mark.is_file() else None
