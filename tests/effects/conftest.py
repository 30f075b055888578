"""The shop's databases for the effects tests: ``shop_db`` is a SQLAlchemy URL, a SQLite
file or the session PostgreSQL (its ``orders`` and ``aaa_effect*`` tables made fresh)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from aaa_celery.effects import EffectLog

ORDERS = ("CREATE TABLE orders (id VARCHAR(40) PRIMARY KEY, refunded_cents INTEGER NOT NULL DEFAULT 0,"
          " refunds INTEGER NOT NULL DEFAULT 0)")


def make_shop(url: str) -> None:
    """A fresh ``orders`` table holding order A-100, and the effect tables (EffectLog.create)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS orders"))
            conn.execute(sa.text(ORDERS))
            conn.execute(sa.text("INSERT INTO orders (id) VALUES ('A-100')"))
        log = EffectLog()
        log.metadata.drop_all(engine)
        log.create(engine)
    finally:
        engine.dispose()


def orders(url: str) -> list[tuple[str, int, int]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT id, refunded_cents, refunds FROM orders"))]
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def shop_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url")
    make_shop(url)
    yield url
