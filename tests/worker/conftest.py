"""Fixtures for fleet tests: real ``celery worker`` processes of ``fleet_app``.

``fleet(size=2, **env)`` starts workers configured by ``AAA_FLEET_*`` variables
(see fleet_app.py) over the session Redis, waits until they are ready, and
returns the :class:`~aaa_celery.testing.Fleet` with ``.client`` (the same app in
this process, for sending calls), ``.ledger`` and ``.store``. Every worker is
stopped by PID at teardown, also when the test fails (their logs are printed then).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aaa_celery.stores import open_store
from aaa_celery.testing import Fleet, Ledger

from .fleet_app import make_app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.worker.fleet_app"


@pytest.fixture
def fleet(redis_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    started: list[Fleet] = []
    opened: list[Any] = []

    def start(size: int = 2, *, pool: str = "prefork", concurrency: int = 1, **env: Any) -> Fleet:
        full = {"AAA_FLEET_BROKER": redis_url, **{k: str(v) for k, v in env.items()}}
        f = Fleet(APP, size=size, pool=pool, concurrency=concurrency, env=full, cwd=ROOT,
                  workdir=tmp_path / f"fleet{len(started)}", prefix=f"w{len(started)}-")
        started.append(f)
        f.start()
        f.env = full  # type: ignore[attr-defined]
        f.client = make_app(full)  # type: ignore[attr-defined]
        f.ledger = Ledger(full.get("AAA_FLEET_LEDGER") or redis_url)  # type: ignore[attr-defined]
        f.store = open_store(full.get("AAA_FLEET_STORE") or redis_url)  # type: ignore[attr-defined]
        opened.extend([f.ledger, f.store])  # type: ignore[attr-defined]
        return f

    try:
        yield start
    finally:
        failed = getattr(request.node, "rep_call", None)
        for f in started:
            if failed is not None and failed.failed:
                print(f.logs())
            f.stop()
        for o in opened:
            o.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
