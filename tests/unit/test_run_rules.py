"""The rules tests/conftest.py sets for a whole test run, each checked on a small pytest run
of its own: under ``CI=true`` a skip for a missing module fails instead of hiding an
undeclared test dependency."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The rules as a run's conftest.py takes them from tests/conftest.py (a short grace here).
CONFTEST = """\
from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport
"""

SKIPS_AT_COLLECTION = """\
import pytest
pytest.importorskip("aaa_no_such_module_anywhere")

def test_never_runs():
    pass
"""

SKIPS_IN_A_TEST = """\
import pytest

def test_needs_a_missing_module():
    pytest.importorskip("aaa_no_such_module_anywhere")
"""


def run_pytest(tmp_path: Path, test: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(test)
    full = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "CI": "", **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_it.py")], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_under_ci_a_module_skipped_for_a_missing_import_fails(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, SKIPS_AT_COLLECTION, CI="true")
    assert done.returncode != 0, done.stdout
    assert "CI=true: a missing test dependency is a failure" in done.stdout, done.stdout
    assert "aaa_no_such_module_anywhere" in done.stdout, done.stdout

    local = run_pytest(tmp_path, SKIPS_AT_COLLECTION)  # exit 5: the only module skipped, no test ran
    assert local.returncode == 5 and "1 skipped" in local.stdout, local.stdout


def test_under_ci_a_test_skipped_for_a_missing_import_fails(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, SKIPS_IN_A_TEST, CI="true")
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
    assert "CI=true: a missing test dependency is a failure" in done.stdout, done.stdout

    local = run_pytest(tmp_path, SKIPS_IN_A_TEST)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout
