"""The PostgreSQL store's server-side functions (0.2.0): ``aaa_begin_planned`` and
``aaa_finish_planned`` (:mod:`...pg_functions`), one prepared statement per ``begin`` and
``finish``. No table changes; nothing on SQLite.

``CREATE OR REPLACE FUNCTION`` takes no lock on the tables, so it runs beside live 0.1.0
workers (which never call the functions). A later revision that changes a function replaces
it again, so this one creates the functions as this release writes them.
"""

from __future__ import annotations

from alembic import op

from aaa_celery.stores.sql import pg_functions

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pg_functions.create(op.get_bind())


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for name in pg_functions.NAMES:
            bind.exec_driver_sql(f"DROP FUNCTION IF EXISTS {name}")
