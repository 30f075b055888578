"""Concurrency slots (0.3.0): the table ``aaa_slots``, one row a ``policy.Concurrency`` key
with the calls that hold its slots (call id -> slot expiry, ``lifecycle.plan_slot``).

Only a new table: no row of another table changes. A release before this one never reads
it: its workers run calls whatever the rule says (they do not know the rule), so a fleet
that runs two releases at once holds the limit only among its workers of this release;
upgrade every worker before relying on a limit (docs/concurrency.md). The downgrade drops
the table (slots in flight are forgotten; each would lapse within a lease TTL anyway).

The table is written out as this revision made it, not read from :mod:`..schema`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("aaa_slots"):
        op.create_table(
            "aaa_slots",
            sa.Column("slot_key", sa.String, primary_key=True),
            sa.Column("holders", sa.JSON, nullable=False),
        )


def downgrade() -> None:
    op.drop_table("aaa_slots")
