"""Finished calls out of the recovery sweep's reads (0.2.0): a row whose result is recorded
keeps ``'Infinity'`` as its sweep hint (``lifecycle.FINISHED_HINT``) instead of no expiry,
which the sweep reads as lapsed. Finished rows stay until ``aaa purge``, so before this every
worker's sweep, every few seconds, read every finished call.

- ``aaa_finish_planned`` is replaced by one that writes the hint (PostgreSQL);
- the finished rows already kept get it, on both SQL stores: a row with a result, no lease
  and no expiry.

No column or index changes. Rows an older worker finishes beside this release keep no
expiry, and are read by each sweep as before (then skipped for their result); 0.1.0 reads
a lease only with its token, which a finished row does not have. The backfill is one
``UPDATE`` of finished rows, which no worker writes again. The function is written out
here as this revision made it, not read from :mod:`...pg_functions`, which moves on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FINISH_PLANNED = """
CREATE OR REPLACE FUNCTION aaa_finish_planned(
  p_key bigint, p_call_id varchar, p_attempt integer, p_name text, p_outcome json, p_now double precision,
  e_id varchar, e_type varchar, e_attempt integer, e_data json, e_at double precision,
  OUT ok boolean, OUT pid integer)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  pid := pg_backend_pid();
  PERFORM 1 FROM aaa_calls WHERE call_id = p_call_id FOR UPDATE;
  SELECT EXISTS (
    SELECT 1 FROM aaa_calls c
     WHERE c.call_id = p_call_id AND c.attempts = p_attempt AND c.spec->>'name' = p_name AND NOT EXISTS (SELECT 1 FROM aaa_results r WHERE r.call_id = c.call_id))
    INTO ok;
  IF NOT ok THEN
    RETURN;
  END IF;
  INSERT INTO aaa_results (call_id, outcome, recorded_at) VALUES (p_call_id, p_outcome, p_now);
  UPDATE aaa_calls SET lease_token = NULL, lease_worker = NULL, lease_attempt = NULL,
         lease_expires_at = 'Infinity'
   WHERE call_id = p_call_id;
  IF e_id IS NOT NULL THEN
    INSERT INTO aaa_events (event_id, call_id, type, attempt, data, at)
    VALUES (e_id, p_call_id, e_type, e_attempt, e_data, e_at) ON CONFLICT (event_id) DO NOTHING;
  END IF;
  -- the key stays held until this commits (see the module's docstring)
  PERFORM pg_advisory_xact_lock(p_key);
  PERFORM pg_advisory_unlock(p_key);
END
$fn$"""

_FINISHED = ("lease_token IS NULL AND EXISTS (SELECT 1 FROM aaa_results r"
             " WHERE r.call_id = aaa_calls.call_id)")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        bind.exec_driver_sql(FINISH_PLANNED)
    bind.execute(sa.text(f"UPDATE aaa_calls SET lease_expires_at = :never WHERE lease_expires_at IS NULL AND {_FINISHED}"),
                 {"never": float("inf")})


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        previous = op.get_context().script.get_revision("0003")  # type: ignore[union-attr]
        bind.exec_driver_sql(previous.module.FINISH_PLANNED)
    bind.execute(sa.text(f"UPDATE aaa_calls SET lease_expires_at = NULL WHERE lease_expires_at = :never AND {_FINISHED}"),
                 {"never": float("inf")})
