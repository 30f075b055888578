"""The SQL stores' tables: one :data:`metadata` that both backends create.

Tables:

``aaa_calls``
    One row a call: its spec (how to republish it), the attempt counter (the
    fence), when it was registered, the current lease (token, worker, attempt,
    expiry) and until when its recovery is claimed.
``aaa_results``
    The one result of a call, ever: ``call_id`` is the primary key.
``aaa_events``
    The audit trail; ``id`` orders it and ``event_id`` makes each event unique.
``aaa_recoveries``
    How often recovery republished a call (``tries``) since its attempt count was
    ``attempts``: a claim counts an attempt, which restarts the count.
``aaa_checkpoints``
    The last checkpoint a tool saved for a call (``ctx.checkpoint``), for its next attempt.
``aaa_slots``
    The holders of a concurrency key's slots (``policy.Concurrency``; revision ``0005``):
    one row a key (the row lock's row), ``holders`` mapping call id to slot expiry.

Run records (:mod:`.runs`):

``aaa_runs``
    One row a run, by its key (``<tenant>:<run id>``): the record as JSON, with its run id, tenant (as an index key), times,
    status and lease (holder, expiry: a TTL lease on both backends, renewed by the
    driver's heartbeat).
``aaa_run_events``
    The run's events, primary key ``(run_key, seq)``.
``aaa_run_turns``
    The model's recorded answers, primary key ``(run_key, turn)``: first writer wins.
``aaa_run_decisions``
    Approval decisions, primary key ``(run_key, call_id, digest)``: first writer wins.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

calls = sa.Table(
    "aaa_calls",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("registered_at", sa.Double, nullable=False),
    sa.Column("lease_token", sa.String),
    sa.Column("lease_worker", sa.String),
    sa.Column("lease_attempt", sa.Integer),
    sa.Column("lease_expires_at", sa.Double),
    sa.Column("recovery_until", sa.Double, nullable=False, default=0.0),
    sa.Column("handed_on", sa.Integer, nullable=False, default=0),
    sa.Column("handed", sa.Integer, nullable=False, default=0),
)

results = sa.Table(
    "aaa_results",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("outcome", sa.JSON, nullable=False),
    sa.Column("recorded_at", sa.Double, nullable=False),
)

events = sa.Table(
    "aaa_events",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.String, nullable=False, unique=True),
    sa.Column("call_id", sa.String, nullable=False, index=True),
    sa.Column("type", sa.String, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
)

budgets = sa.Table(
    "aaa_budgets",
    metadata,
    sa.Column("budget_key", sa.String, primary_key=True),
    sa.Column("window_no", sa.BigInteger, nullable=False),
    sa.Column("total", sa.Double, nullable=False),
)

budget_tokens = sa.Table(
    "aaa_budget_tokens",
    metadata,
    sa.Column("budget_key", sa.String, primary_key=True),
    sa.Column("token", sa.String, primary_key=True),
)

recoveries = sa.Table(
    "aaa_recoveries",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("tries", sa.Integer, nullable=False),
)

checkpoints = sa.Table(
    "aaa_checkpoints",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("checkpoint", sa.Text, nullable=False),
    sa.Column("saved_at", sa.Double, nullable=False),
)

slots = sa.Table(
    "aaa_slots",
    metadata,
    sa.Column("slot_key", sa.String, primary_key=True),
    sa.Column("holders", sa.JSON, nullable=False),
)

#: The time index of calls (``aaa calls``, ``aaa purge``); created with the tables.
calls_by_time = sa.Index("ix_aaa_calls_registered_at", calls.c.registered_at)

#: A call nobody claimed since it was registered or handed on (``lifecycle.awaits_recovery``'s
#: second half), as ``queries.select_unfinished`` and the index below both write it.
UNCLAIMED = sa.or_(calls.c.attempts == 0, calls.c.handed_on == calls.c.attempts)

#: The recovery sweep's two ranges (``queries.select_unfinished``; revision ``0002``): leases
#: by expiry (a TTL lease's, or a session lease's sweep hint), and the unclaimed calls by
#: when they were seen (not every finished call, as ``calls_by_time`` is).
calls_by_expiry = sa.Index("ix_aaa_calls_lease_expires_at", calls.c.lease_expires_at)
unclaimed_by_time = sa.Index("ix_aaa_calls_unclaimed", calls.c.registered_at,
                             postgresql_where=UNCLAIMED, sqlite_where=UNCLAIMED)


runs = sa.Table(
    "aaa_runs",
    metadata,
    sa.Column("run_key", sa.String, primary_key=True),
    sa.Column("run_id", sa.String, nullable=False, index=True),
    sa.Column("tenant_key", sa.String, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("status", sa.String, nullable=False),
    sa.Column("record", sa.JSON, nullable=False),
    sa.Column("lease_holder", sa.String),
    sa.Column("lease_expires_at", sa.Double),
    sa.Index("ix_aaa_runs_tenant_started", "tenant_key", "started_at", "run_key"),
    sa.Index("ix_aaa_runs_started", "started_at", "run_key"),
)

run_events = sa.Table(
    "aaa_run_events",
    metadata,
    sa.Column("run_key", sa.String, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("event", sa.JSON, nullable=False),
)

run_turns = sa.Table(
    "aaa_run_turns",
    metadata,
    sa.Column("run_key", sa.String, primary_key=True),
    sa.Column("turn", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("response", sa.JSON, nullable=False),
)

run_decisions = sa.Table(
    "aaa_run_decisions",
    metadata,
    sa.Column("run_key", sa.String, primary_key=True),
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("digest", sa.String, primary_key=True),
    sa.Column("decision", sa.JSON, nullable=False),
)
