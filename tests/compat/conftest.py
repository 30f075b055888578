"""Fixtures for the compatibility tests: one real worker of ``compat_app`` per mode.

``compat`` is parametrized over ``plain`` and ``guarded``: each test runs twice and
asserts the same behaviour. Workers are stopped by PID at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aaa_celery.testing import Fleet, Ledger

from .compat_app import make_app

ROOT = Path(__file__).resolve().parents[2]


class Compat:
    """A running worker of one mode, and the same app as a client (``.app``)."""

    def __init__(self, mode: str, fleet: Fleet, app: Any, url: str) -> None:
        self.mode, self.fleet, self.app = mode, fleet, app
        self.ledger = Ledger(url)

    def replace_worker(self, worker: Any, *, kill: bool = False) -> None:
        """Stop one worker (``kill -9`` if ``kill``) and start a fresh one in its place."""
        worker.kill() if kill else worker.stop()
        self.fleet.workers.remove(worker)
        self.fleet.add()

    def restart(self) -> None:
        """Every worker stopped and new ones started (their in-memory revoked sets are gone)."""
        for worker in list(self.fleet.workers):
            self.replace_worker(worker)

    def starts(self, task_id: str) -> list[dict[str, Any]]:
        """The body starts of a call, from the ledger."""
        return self.ledger.entries(task_id, "start")

    @property
    def guarded(self) -> bool:
        return self.mode == "guarded"


@pytest.fixture(scope="module", params=["plain", "guarded"])
def compat(request: pytest.FixtureRequest, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compat]:
    # a db of its own: other tests flush db 0, with the broker's queue bindings in it
    url = redis_server.url.rsplit("/", 1)[0] + "/5"
    env = {"AAA_COMPAT_BROKER": url, "AAA_COMPAT_GUARDED": "1" if request.param == "guarded" else "0"}
    fleet = Fleet("tests.compat.compat_app", size=2, env=env, cwd=ROOT, prefix=f"compat-{request.param}-",
                  workdir=tmp_path_factory.mktemp(f"compat-{request.param}"))
    fleet.start()
    try:
        compat = Compat(request.param, fleet, make_app(env), url)
        yield compat
    finally:
        fleet.stop()
    compat.ledger.close()
