"""Effects applied once on a real fleet (issue 24): real ``celery worker`` processes run a
refund tool writing to the shop's orders table through ``once`` (SQLAlchemy on SQLite and
PostgreSQL, Django's ORM on PostgreSQL); the holder is killed with kill -9 right after its
transaction committed, or frozen with SIGSTOP past its lease."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aaa_celery.testing import Fleet, Ledger, freeze, wait_for
from tests.fleet_apps import started
from tests.servers import libpq_url

from .conftest import make_shop, orders

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

ROOT = Path(__file__).resolve().parents[2]


def django_shop(postgres_url: str) -> tuple[str, dict[str, str]]:
    """The shop's tables made by ``manage.py migrate`` (the aaa app's migration and the shop's
    orders), order A-100 in them; returns the SQLAlchemy URL and the workers' env."""
    url = sa.engine.make_url(postgres_url)
    env = {"AAA_EFFECTS_PG": f"{url.host} {url.port} {url.database} {url.username}",
           "DJANGO_SETTINGS_MODULE": "tests.effects.django_settings"}
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS shop_orders, django_migrations"))
    engine.dispose()
    done = subprocess.run([sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO shop_orders (id, refunded_cents, refunds) VALUES ('A-100', 0, 0)"))
    engine.dispose()
    return postgres_url, env


class Shop:
    def __init__(self, url: str, table: str, env: dict[str, str]) -> None:
        self.url, self.table, self.env = url, table, env

    def orders(self) -> list[tuple[str, int, int]]:
        if self.table == "orders":
            return orders(self.url)
        engine = sa.create_engine(self.url)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text("SELECT id, refunded_cents, refunds FROM shop_orders"))]
        engine.dispose()
        return rows  # type: ignore[return-value]

    def effects(self) -> list[tuple[str, int]]:
        engine = sa.create_engine(self.url)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text("SELECT key, attempt FROM aaa_effects"))]
        engine.dispose()
        return rows  # type: ignore[return-value]


@pytest.fixture(params=["sqlalchemy-sqlite", "sqlalchemy-postgresql", "django-postgresql"])
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Shop:
    if request.param == "sqlalchemy-sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
        make_shop(url)
        return Shop(url, "orders", {"AAA_EFFECTS_DB": url})
    postgres_url = request.getfixturevalue("postgres_url")
    if request.param == "sqlalchemy-postgresql":
        make_shop(postgres_url)
        return Shop(postgres_url, "orders", {"AAA_EFFECTS_DB": postgres_url})
    url, env = django_shop(postgres_url)
    return Shop(url, "shop_orders", env)


@pytest.fixture
def fleet(shop: Shop, redis_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    env = {"AAA_EFFECTS_BROKER": redis_url, **shop.env}
    with started(Fleet("tests.effects.app", size=2, env=env, cwd=ROOT, workdir=tmp_path / "fleet")) as f:
        os.environ.update(env)  # the client app below reads the same settings
        try:
            from celery import Celery

            client = Celery("effects_client", broker=redis_url, backend=redis_url)
            client.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
            f.client, f.ledger = client, Ledger(redis_url)  # type: ignore[attr-defined]
            yield f
        finally:
            for k in env:
                os.environ.pop(k, None)


def entries(f: Any, task_id: str, event: str) -> Callable[[], list[dict[str, Any]]]:
    return lambda: f.ledger.entries(task_id, event)


def test_kill_9_right_after_the_commit_attempt_2_returns_the_committed_value_and_one_effect(fleet, shop):
    # Given a refund whose attempt 1 kills its own process right after its transaction committed
    result = fleet.client.send_task("effects.refund", args=("A-100", 500), kwargs={"kill_after_commit": True})
    # When attempt 2 takes the call over (the guard's recovery, at_least_once)
    value = result.get(timeout=90)
    # Then it returns attempt 1's committed value without applying the refund again
    assert value == {"order_id": "A-100", "refunded_cents": 500, "attempt": 1}
    assert [e["attempt"] for e in fleet.ledger.entries(result.id, "applied")] == [1]
    assert sorted({e["attempt"] for e in fleet.ledger.entries(result.id, "start")}) == [1, 2]
    assert shop.orders() == [("A-100", 500, 1)]
    assert [a for _, a in shop.effects()] == [1]


def test_a_frozen_holder_commits_nothing_after_attempt_2_took_over(fleet, shop):
    # Given attempt 1 frozen (SIGSTOP, heartbeat included) before its transaction
    result = fleet.client.send_task("effects.refund", args=("A-100", 500), kwargs={"pause_s": 4.0})
    first = wait_for(entries(fleet, result.id, "start"), 60, "attempt 1's start")[0]
    frozen = freeze(fleet.worker_of(first["pid"]))
    try:
        # When attempt 2 takes over past the lease and commits the refund
        wait_for(lambda: [e for e in fleet.ledger.entries(result.id, "committed") if e["attempt"] == 2], 90,
                 "attempt 2's commit")
    finally:
        frozen.thaw()
    assert result.get(timeout=60) == {"order_id": "A-100", "refunded_cents": 500, "attempt": 2}
    # Then the thawed attempt 1 reaches its transaction, and the database refuses it
    wait_for(lambda: [e for e in fleet.ledger.entries(result.id, "rejected") if e["attempt"] == 1], 60,
             "attempt 1's refused transaction")
    assert [e["attempt"] for e in fleet.ledger.entries(result.id, "applied")] == [2]
    assert [e["attempt"] for e in fleet.ledger.entries(result.id, "committed")] == [2]
    assert shop.orders() == [("A-100", 500, 1)]
    assert [a for _, a in shop.effects()] == [2]
