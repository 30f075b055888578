"""The 0.1.0 schema: the tables as 0.1.0 (commit c79799f) created them.

A database that 0.1.0 created has every table, column and index already: this revision
only stamps it. One created by a build before 0.1.0 may lack tables (``aaa_checkpoints``,
``aaa_recoveries``, the budget and run tables), columns (the ``handed_on`` and ``handed``
of ``aaa_calls``, from fc9a97d) or indexes: they are added here, columns with their
default of 0.

The tables are written out as they were, not read from :mod:`..schema`, which moves on
with later revisions.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def tables() -> sa.MetaData:
    meta = sa.MetaData()
    double, text, integer, json = sa.Double, sa.String, sa.Integer, sa.JSON
    sa.Table("aaa_calls", meta,
             sa.Column("call_id", text, primary_key=True), sa.Column("spec", json, nullable=False),
             sa.Column("attempts", integer, nullable=False), sa.Column("registered_at", double, nullable=False),
             sa.Column("lease_token", text), sa.Column("lease_worker", text), sa.Column("lease_attempt", integer),
             sa.Column("lease_expires_at", double), sa.Column("recovery_until", double, nullable=False),
             sa.Column("handed_on", integer, nullable=False), sa.Column("handed", integer, nullable=False),
             sa.Index("ix_aaa_calls_registered_at", "registered_at"))
    sa.Table("aaa_results", meta, sa.Column("call_id", text, primary_key=True),
             sa.Column("outcome", json, nullable=False), sa.Column("recorded_at", double, nullable=False))
    sa.Table("aaa_events", meta,
             sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
             sa.Column("event_id", text, nullable=False, unique=True),
             sa.Column("call_id", text, nullable=False, index=True), sa.Column("type", text, nullable=False),
             sa.Column("attempt", integer, nullable=False), sa.Column("data", json, nullable=False),
             sa.Column("at", double, nullable=False))
    sa.Table("aaa_budgets", meta, sa.Column("budget_key", text, primary_key=True),
             sa.Column("window_no", sa.BigInteger, nullable=False), sa.Column("total", double, nullable=False))
    sa.Table("aaa_budget_tokens", meta, sa.Column("budget_key", text, primary_key=True),
             sa.Column("token", text, primary_key=True))
    sa.Table("aaa_recoveries", meta, sa.Column("call_id", text, primary_key=True),
             sa.Column("attempts", integer, nullable=False), sa.Column("tries", integer, nullable=False))
    sa.Table("aaa_checkpoints", meta, sa.Column("call_id", text, primary_key=True),
             sa.Column("checkpoint", sa.Text, nullable=False), sa.Column("saved_at", double, nullable=False))
    sa.Table("aaa_runs", meta,
             sa.Column("run_key", text, primary_key=True), sa.Column("run_id", text, nullable=False, index=True),
             sa.Column("tenant_key", text, nullable=False), sa.Column("started_at", double, nullable=False),
             sa.Column("updated_at", double, nullable=False), sa.Column("status", text, nullable=False),
             sa.Column("record", json, nullable=False), sa.Column("lease_holder", text),
             sa.Column("lease_expires_at", double),
             sa.Index("ix_aaa_runs_tenant_started", "tenant_key", "started_at", "run_key"),
             sa.Index("ix_aaa_runs_started", "started_at", "run_key"))
    sa.Table("aaa_run_events", meta, sa.Column("run_key", text, primary_key=True),
             sa.Column("seq", integer, primary_key=True, autoincrement=False), sa.Column("event", json, nullable=False))
    sa.Table("aaa_run_turns", meta, sa.Column("run_key", text, primary_key=True),
             sa.Column("turn", integer, primary_key=True, autoincrement=False),
             sa.Column("response", json, nullable=False))
    sa.Table("aaa_run_decisions", meta, sa.Column("run_key", text, primary_key=True),
             sa.Column("call_id", text, primary_key=True), sa.Column("digest", text, primary_key=True),
             sa.Column("decision", json, nullable=False))
    return meta


def upgrade() -> None:
    bind = op.get_bind()
    meta = tables()
    found = sa.inspect(bind)
    for table in meta.sorted_tables:
        if not found.has_table(table.name):
            table.create(bind)
            continue
        columns = {c["name"] for c in found.get_columns(table.name)}
        for column in table.columns:
            if column.name not in columns:  # a NOT NULL column of a row already there starts at 0
                default = None if column.nullable else sa.text("0")
                op.add_column(table.name, sa.Column(column.name, column.type, nullable=column.nullable,
                                                    server_default=default))
        indexes = {i["name"] for i in found.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(bind)


def downgrade() -> None:
    raise NotImplementedError("0.1.0 is the first schema: there is nothing to go back to")
