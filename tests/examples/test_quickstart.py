"""The README's quickstart command, ``python examples/refund.py``, as a new user runs it: in a
fresh virtualenv with ``pip install -e .`` only, so without the optional extras' packages
(simulated here by making them unimportable)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Packages that only extras bring (secrets, postgres, flask, django, metrics, tracing).
EXTRAS_ONLY = ("cryptography", "psycopg", "flask", "django", "prometheus_client", "opentelemetry")

RUN_WITHOUT_EXTRAS = f"""
import importlib.abc, runpy, sys

class NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
        return None

sys.meta_path.insert(0, NoExtras())
sys.argv = ["examples/refund.py"]
runpy.run_path("examples/refund.py", run_name="__main__")
"""


def test_the_quickstart_example_runs_without_any_extra():
    """Reproduces on c149d8d: the embedded worker unsealed every call's arguments with a
    generated Fernet key, so without cryptography the refund failed with ModuleNotFoundError."""
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT_EXTRAS], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refunded A-100 (key=refund:A-100, attempt=1, fence=1)" in done.stdout, done.stdout + done.stderr
