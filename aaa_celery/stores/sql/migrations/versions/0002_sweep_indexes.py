"""The recovery sweep's indexes (0.2.0): ``aaa_calls`` by lease expiry, and its unclaimed calls
by when they were seen (``queries.select_unfinished`` reads those two ranges).

No column changes: a PostgreSQL lease's row now keeps a sweep hint in ``lease_expires_at``
(``lifecycle.sweep_hint``), which 0.1.0 leaves NULL, and the sweep reads a NULL expiry as
lapsed, so rows 0.1.0 writes beside this release are still found (read each sweep, and
asked the lock). An index that exists by its name is kept: on a large table an operator
may build them first with ``CREATE INDEX CONCURRENTLY`` (``docs/stores.md``), and this
revision then takes no lock that stalls writes.

The indexes are written out as they were, not read from :mod:`..schema`, which moves on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def indexes() -> list[sa.Index]:
    meta = sa.MetaData()
    calls = sa.Table("aaa_calls", meta, sa.Column("registered_at", sa.Double),
                     sa.Column("lease_expires_at", sa.Double), sa.Column("attempts", sa.Integer),
                     sa.Column("handed_on", sa.Integer))
    unclaimed = sa.or_(calls.c.attempts == 0, calls.c.handed_on == calls.c.attempts)
    return [sa.Index("ix_aaa_calls_lease_expires_at", calls.c.lease_expires_at),
            sa.Index("ix_aaa_calls_unclaimed", calls.c.registered_at,
                     postgresql_where=unclaimed, sqlite_where=unclaimed)]


def upgrade() -> None:
    bind = op.get_bind()
    found = {i["name"] for i in sa.inspect(bind).get_indexes("aaa_calls")}
    for index in indexes():
        if index.name not in found:
            index.create(bind)


def downgrade() -> None:
    bind = op.get_bind()
    for index in indexes():
        index.drop(bind, checkfirst=True)
