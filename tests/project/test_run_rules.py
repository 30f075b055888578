"""The rules tests/conftest.py sets for a whole test run, each checked on a small pytest run
of its own: a process a test leaves alive fails the run, named (and is killed by its pid);
under ``CI=true`` a skip for a missing module fails instead of hiding an undeclared
test dependency. Each rule holds under pytest-xdist too (``.ci/run`` runs the suite with ``-n``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The rules as a run's conftest.py takes them from tests/conftest.py (a short grace here).
CONFTEST = """\
import tests.conftest as rules
rules.LEFTOVER_GRACE_S = 1.0
from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport, pytest_sessionfinish
from tests.conftest import pytest_configure, pytest_configure_node
"""

LEAKING = """\
import os, subprocess
from pathlib import Path

def test_starts_a_server_and_forgets_it():
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    # an orphan: its parent shell exits at once, so it no longer descends from pytest
    orphan = subprocess.run(["bash", "-c", "sleep 301 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True).stdout.strip()
    Path(os.environ["PIDS_FILE"]).write_text(f"{child.pid} {orphan}")
"""

TIDY = """\
import multiprocessing, subprocess

def test_starts_a_process_and_stops_it():
    multiprocessing.get_context("spawn").Lock()  # pytest's own resource tracker stays: not a leftover
    child = subprocess.Popen(["sleep", "300"])
    child.terminate()
    child.wait()
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


#: How a run is split: in this process, or over two xdist workers as ``.ci/run`` does.
SPLITS = {"serial": [], "xdist": ["-p", "xdist.plugin", "-n", "2"]}


def run_pytest(tmp_path: Path, test: str, split: str = "serial", **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(test)
    full = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "CI": "", **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SPLITS[split],
                           "--rootdir", str(tmp_path), str(tmp_path / "test_it.py")], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("split", SPLITS)
def test_a_process_left_alive_fails_the_run_named_and_is_killed(tmp_path: Path, split: str) -> None:
    pids_file = tmp_path / "pids"
    done = run_pytest(tmp_path, LEAKING, split, PIDS_FILE=str(pids_file))
    pids = [int(p) for p in pids_file.read_text().split()]
    try:
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "1 passed" in out, out
        for pid in pids:  # the child by descent, the orphan by the run's mark in its environment
            assert f"left behind: sleep (pid {pid})" in out, out
        assert not [pid for pid in pids if alive(pid)]
    finally:
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("split", SPLITS)
def test_a_run_that_stops_what_it_started_passes(tmp_path: Path, split: str) -> None:
    done = run_pytest(tmp_path, TIDY, split)  # under xdist: the workers themselves are no leftovers
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left behind" not in done.stdout + done.stderr


@pytest.mark.parametrize("split", SPLITS)
def test_under_ci_a_module_skipped_for_a_missing_import_fails(tmp_path: Path, split: str) -> None:
    done = run_pytest(tmp_path, SKIPS_AT_COLLECTION, split, CI="true")
    assert done.returncode != 0, done.stdout
    assert "CI=true: a missing test dependency is a failure" in done.stdout, done.stdout
    assert "aaa_no_such_module_anywhere" in done.stdout, done.stdout

    local = run_pytest(tmp_path, SKIPS_AT_COLLECTION)  # exit 5: the only module skipped, no test ran
    assert local.returncode == 5 and "1 skipped" in local.stdout, local.stdout


@pytest.mark.parametrize("split", SPLITS)
def test_under_ci_a_test_skipped_for_a_missing_import_fails(tmp_path: Path, split: str) -> None:
    done = run_pytest(tmp_path, SKIPS_IN_A_TEST, split, CI="true")
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
    assert "CI=true: a missing test dependency is a failure" in done.stdout, done.stdout

    local = run_pytest(tmp_path, SKIPS_IN_A_TEST)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout
