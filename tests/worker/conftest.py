"""Fixtures for fleet tests: real ``celery worker`` processes of ``fleet_app``.

``fleet(size=2, **env)`` starts workers configured by ``AAA_FLEET_*`` variables
(see fleet_app.py) over the session Redis, waits until they are ready, and
returns the :class:`~aaa_celery.testing.Fleet` with ``.client`` (the same app in
this process, for sending calls), ``.ledger`` and ``.store``. Every worker is
stopped by PID at teardown, also when the test fails (their logs are printed then).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aaa_celery.stores import open_store
from aaa_celery.testing import Fleet, Ledger

from .fleet_app import make_app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.worker.fleet_app"


class Fleets:
    """``fleets(size=2, pool=..., concurrency=..., **env)`` starts a ready fleet;
    ``fleets.client(**env)`` is the app alone (to publish before any worker runs)."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.redis_url, self.workdir = redis_url, workdir
        self.started: list[Fleet] = []
        self.opened: list[Any] = []

    def env(self, **env: Any) -> dict[str, str]:
        """The workers' environment: ``TTL=2`` becomes ``AAA_FLEET_TTL=2`` (see fleet_app)."""
        return {"AAA_FLEET_BROKER": self.redis_url, **{f"AAA_FLEET_{k}": str(v) for k, v in env.items()}}

    def client(self, **env: Any) -> Any:
        return make_app(self.env(**env))

    def __call__(self, size: int = 2, *, pool: str = "prefork", concurrency: int = 1,
                 extra_args: tuple[str, ...] = (), worker_env: tuple[dict[str, str], ...] = (), **env: Any) -> Fleet:
        """``worker_env``: more environment for the first workers, one dict each (a skewed clock)."""
        full = self.env(**env)
        f = Fleet(APP, size=size, pool=pool, concurrency=concurrency, env=full, cwd=ROOT, extra_args=extra_args,
                  workdir=self.workdir / f"fleet{len(self.started)}", prefix=f"w{len(self.started)}-")
        for worker, more in zip(f.workers, worker_env):
            worker.env.update(more)
        self.started.append(f)
        f.start()
        f.env = full  # type: ignore[attr-defined]
        f.client = make_app(full)  # type: ignore[attr-defined]
        f.ledger = Ledger(full.get("AAA_FLEET_LEDGER") or self.redis_url)  # type: ignore[attr-defined]
        options = json.loads(full.get("AAA_FLEET_STORE_OPTIONS") or "{}")
        f.store = open_store(full.get("AAA_FLEET_STORE") or self.redis_url, **options)  # type: ignore[attr-defined]
        self.opened.extend([f.ledger, f.store])  # type: ignore[attr-defined]
        return f

    def stop(self, show_logs: bool) -> None:
        for f in self.started:
            if show_logs:
                print(f.logs())
            f.stop()
        for o in self.opened:
            o.close()


@pytest.fixture
def fleet(redis_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleets]:
    fleets = Fleets(redis_url, tmp_path)
    try:
        yield fleets
    finally:
        rep = getattr(request.node, "rep_call", None)
        fleets.stop(show_logs=rep is not None and rep.failed)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
