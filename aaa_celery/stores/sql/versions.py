"""The SQL stores' schema versions: Alembic revisions shipped in the package.

The revisions live in ``migrations/versions`` (``0001``: the 0.1.0 schema; each later one
adds what its release changed: ``0002``, the recovery sweep's indexes; ``0003``, the PostgreSQL
store's functions; ``0004``, finished calls out of the sweep's reads; ``0005``, concurrency slots; ``0006``, the
functions again, their writes assembled from the store's statements). The version a database is at is kept in the table
:data:`VERSION_TABLE`, apart from an application's own ``alembic_version`` in the same
database. Every function here runs on a connection inside a write transaction that holds
the store's schema lock (PostgreSQL: an advisory lock; SQLite: the database's write lock).

- :func:`prepare` (at every open): a database without the store's tables gets them at the
  latest schema, stamped; any other is left as it is, for :func:`upgrade`.
- :func:`version`: the revision a database is at, and this release's.
- :func:`upgrade`: run the revisions from the database's to the latest.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..base import StoreVersion
from . import pg_functions
from .schema import calls, metadata

if TYPE_CHECKING:
    from alembic.config import Config

#: Where a database keeps its revision (not ``alembic_version``: the application's own).
VERSION_TABLE = "aaa_alembic_version"
#: This release's revisions, oldest first: the files of ``migrations/versions``, named here
#: so that opening a store reads its version without loading Alembic (which only stamps and
#: upgrades); ``tests/stores/test_schema_version.py`` checks the two agree.
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006")

_version = sa.table(VERSION_TABLE, sa.column("version_num", sa.String))


def alembic_config() -> Config:
    """Alembic's configuration of the package's revisions (``script_location``)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files(__package__) / "migrations"))
    return config


def head() -> str:
    """The revision this release runs on."""
    return REVISIONS[-1]


def _current(conn: Connection) -> str | None:
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(sa.select(_version.c.version_num)).scalar_one_or_none()


def version(conn: Connection) -> StoreVersion:
    current = _current(conn)
    empty = current is None and not sa.inspect(conn).has_table(calls.name)
    return StoreVersion(current, head(), REVISIONS, empty)


def _run(conn: Connection, what: str) -> None:
    """Run Alembic's command ``what`` (``stamp`` or ``upgrade``) to the head revision."""
    from alembic import command

    config = alembic_config()  # one per run: it carries the connection to migrations/env.py
    config.attributes["connection"] = conn
    getattr(command, what)(config, "head")


def prepare(conn: Connection) -> None:
    """Create the tables (and PostgreSQL's functions) of an empty database, at the latest
    schema, and stamp it."""
    if version(conn).empty:
        metadata.create_all(conn)
        pg_functions.create(conn)
        _run(conn, "stamp")


def upgrade(conn: Connection) -> StoreVersion:
    """Bring the database to the latest revision; returns its version now."""
    found = version(conn)
    if found.newer:
        return found
    if found.empty:
        prepare(conn)
    elif found.outdated:
        _run(conn, "upgrade")
    return version(conn)
