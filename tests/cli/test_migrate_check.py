"""``celery -A proj aaa migrate --check`` only reads: on an empty database it creates
nothing, exits 1 and names the command that would; on a current store it exits 0.

Red on 03c27cd: ``--check`` opened the store as a worker does, which creates the tables of
an empty database, then printed "schema: 0004" with exit code 0 (issue 42, item 3).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from aaa_celery.stores.sql import versions

from . import cli_app
from .test_cli import cli

app = cli_app.app


def aaa_tables(url: str) -> list[str]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return sorted(n for n in sa.inspect(conn).get_table_names() if n.startswith("aaa"))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_store(request: Any, tmp_path: Any) -> Iterator[str]:
    url = (f"sqlite:///{tmp_path / 'empty.sqlite3'}" if request.param == "sqlite"
           else request.getfixturevalue("postgres_url"))
    old = app.conf.get("aaa_store_url")
    app.conf.aaa_store_url = url
    if hasattr(app, "_aaa_store"):
        del app._aaa_store
    try:
        yield url
    finally:
        app.conf.aaa_store_url = old


def test_check_on_an_empty_database_creates_nothing_and_names_migrate(empty_store):
    result = cli("migrate", "--check")
    assert result.exit_code == 1, result.output
    assert "empty" in result.output and "celery -A cli_app aaa migrate" in result.output, result.output
    assert aaa_tables(empty_store) == [], result.output


def test_check_on_a_current_store_exits_0(empty_store):
    migrated = cli("migrate")
    assert migrated.exit_code == 0, migrated.output
    result = cli("migrate", "--check")
    assert result.exit_code == 0, result.output
    assert versions.head() in result.output
