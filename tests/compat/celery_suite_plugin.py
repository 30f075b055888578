"""A pytest plugin for running Celery's own ``t/integration`` suite (``scripts/celery-compat``).

Loaded with ``-p tests.compat.celery_suite_plugin`` into a pytest session rooted in
Celery's unpacked source distribution; it never edits Celery's files. Environment:

- ``AAA_CELERY_SUITE_MODE``: ``plain`` (the suite as shipped) or ``guarded``. Guarded
  overrides the ``celery_parameters`` fixture of ``celery.contrib.pytest``, which both the
  session app (the embedded worker's) and the per-test ``app`` are built from, with
  ``task_cls="aaa_celery.worker:GuardedTask"`` and ``aaa_store_url``. ``Celery(**kwargs)``
  takes unknown keywords as settings, so ``aaa_store_url`` lands in ``app.conf``.
- ``AAA_CELERY_SUITE_STORE``: the store URL for guarded mode.
- ``AAA_CELERY_SUITE_TIMEOUT``: a cap in seconds on every test's pytest-timeout, the
  suite's own ``@pytest.mark.timeout(300)`` included (some tests hang on a Redis broker).
- ``AAA_CELERY_SUITE_RESULTS``: where to write each test's outcome as JSON.

Plain mode changes nothing but the timeout cap and the outcome file.

``read_known`` reads the allow-list of open regressions (``celery_suite_known.txt``)
for the script and for tests/compat/test_celery_integration_suite.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

GUARDED_TASK_CLS = "aaa_celery.worker:GuardedTask"

MODE = os.environ.get("AAA_CELERY_SUITE_MODE", "plain")


def read_known(path: Path) -> dict[str, str]:
    """``{node id: reason}`` from an allow-list with ``<node id>  # <reason>`` per line
    (``#`` lines are comments). A line without a reason, or a test listed twice, is an error."""
    known: dict[str, str] = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        test_id, sep, reason = line.partition(" # ")
        test_id, reason = test_id.strip(), reason.strip()
        if not sep or not reason or not test_id:
            raise ValueError(f"{path}:{n}: expected '<node id>  # <reason>', got {line!r}")
        if test_id in known:
            raise ValueError(f"{path}:{n}: {test_id} is listed twice")
        known[test_id] = reason
    return known


class _Guarded:
    """Registered at configure time, after every entry-point plugin (``pytest_celery``
    re-exports ``celery.contrib.pytest``), so this ``celery_parameters`` is the one used.
    The suite's conftest does not define ``celery_parameters`` itself."""

    @pytest.fixture(scope="session")
    def celery_parameters(self) -> dict[str, Any]:
        return {"task_cls": GUARDED_TASK_CLS, "aaa_store_url": os.environ["AAA_CELERY_SUITE_STORE"]}

    @pytest.fixture(scope="session", autouse=True)
    def _aaa_guarded_app_check(self, celery_session_app: Any) -> None:
        """Fail loudly rather than run a vacuous 'guarded' session."""
        from aaa_celery.worker import GuardedTask

        task_cls = celery_session_app.Task
        if not issubclass(task_cls, GuardedTask) or not celery_session_app.conf.get("aaa_store_url"):
            pytest.exit(f"celery-compat: guarded mode did not take: task_cls={task_cls!r}", returncode=3)


class _Outcomes:
    """One outcome per test id: passed, xpassed (its body passed), failed, error,
    skipped, xfailed, and the first lines of the failure."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tests: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()

    def _entry(self, nodeid: str) -> dict[str, Any]:
        return self.tests.setdefault(nodeid, {"outcome": "passed", "reason": "", "duration": 0.0})

    @staticmethod
    def _reason(report: pytest.TestReport) -> str:
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None and getattr(crash, "message", None):
            text = crash.message
        elif isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
            text = str(report.longrepr[2])
        else:
            text = str(report.longrepr or "")
        lines = [line for line in text.splitlines() if line.strip()]
        return " | ".join(lines[:3])[:500]

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self._entry(report.nodeid)
        entry["duration"] = round(entry["duration"] + report.duration, 3)
        if entry["outcome"] in ("failed", "error"):
            return  # the first failure is the one to report
        if report.skipped and hasattr(report, "wasxfail"):
            entry["outcome"], entry["reason"] = "xfailed", f"xfail: {report.wasxfail}"
        elif report.passed and hasattr(report, "wasxfail"):
            # a non-strict xfail whose body passed: it passed (a strict one is a failure)
            entry["outcome"], entry["reason"] = "xpassed", f"xfail: {report.wasxfail}"
        elif report.skipped:
            entry["outcome"], entry["reason"] = "skipped", self._reason(report)
        elif report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["reason"] = (f"[{report.when}] " if report.when != "call" else "") + self._reason(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        import aaa_celery

        data = {"mode": MODE, "exitstatus": int(exitstatus), "aaa_celery": os.path.dirname(aaa_celery.__file__),
                "duration_s": round(time.monotonic() - self.started, 1), "tests": self.tests}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def pytest_configure(config: pytest.Config) -> None:
    if MODE not in ("plain", "guarded"):
        raise pytest.UsageError(f"AAA_CELERY_SUITE_MODE must be plain or guarded, not {MODE!r}")
    if MODE == "guarded":
        config.pluginmanager.register(_Guarded(), "aaa-celery-suite-guarded")
    results = os.environ.get("AAA_CELERY_SUITE_RESULTS")
    if results:
        config.pluginmanager.register(_Outcomes(results), "aaa-celery-suite-outcomes")


def pytest_report_header(config: pytest.Config) -> str:
    extra = f" (task_cls={GUARDED_TASK_CLS}, aaa_store_url={os.environ.get('AAA_CELERY_SUITE_STORE')})"
    return f"celery-compat: {MODE} mode" + (extra if MODE == "guarded" else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cap = float(os.environ.get("AAA_CELERY_SUITE_TIMEOUT") or 0)
    if cap <= 0:
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        current = None
        if marker is not None:
            current = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if current is None or float(current) > cap:
            # prepended, so pytest-timeout's get_closest_marker sees it first
            item.add_marker(pytest.mark.timeout(timeout=cap), append=False)
