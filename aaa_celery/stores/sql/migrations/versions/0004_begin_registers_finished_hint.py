"""One round trip for more calls, and finished calls out of the recovery sweep's reads (0.2.0).

- ``aaa_begin_planned`` takes two more arguments: a spec to register the call with when
  nobody did (a message sent by name, ``app.send_task``), and when; finding no row, it inserts
  one as ``register`` does and locks it, so that call's first ``begin`` is one round trip, not
  three (PostgreSQL; the function of ``0003`` is dropped: its signature differs).
- A row whose result is recorded keeps ``'Infinity'`` as its sweep hint
  (``lifecycle.FINISHED_HINT``) instead of no expiry, which the sweep reads as lapsed.
  Finished rows stay until ``aaa purge``, so before this every worker's sweep, every few
  seconds, read every finished call. ``aaa_finish_planned`` is replaced by one that writes
  it (PostgreSQL), and the finished rows already kept get it, on both SQL stores: a row with
  a result, no lease and no expiry.

No column or index changes. Rows an older worker finishes beside this release keep no
expiry, and are read by each sweep as before (then skipped for their result); 0.1.0 reads
a lease only with its token, which a finished row does not have, and calls no function. The
backfill is one ``UPDATE`` of finished rows, which no worker writes again. The functions are
written out here as this revision made them, not read from :mod:`...pg_functions`, which
moves on; the downgrade puts ``0003``'s back (read from that revision).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BEGIN_PLANNED = """
CREATE OR REPLACE FUNCTION aaa_begin_planned(
  p_key bigint, p_call_id varchar, p_spec text, p_name text, p_idem text, p_no_request boolean,
  p_new text, p_now double precision,
  p_attempt integer, p_token varchar, p_worker varchar, p_hint double precision,
  e_id varchar, e_type varchar, e_attempt integer, e_data json, e_at double precision,
  OUT got boolean, OUT ok boolean, OUT pid integer)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  pid := pg_backend_pid();
  ok := false;
  got := pg_try_advisory_lock(p_key);
  IF NOT got THEN
    RETURN;
  END IF;
  PERFORM 1 FROM aaa_calls WHERE call_id = p_call_id FOR UPDATE;
  IF NOT FOUND THEN  -- nobody registered it: as register does
    INSERT INTO aaa_calls (call_id, spec, attempts, registered_at, recovery_until, handed_on, handed)
    VALUES (p_call_id, coalesce(p_spec, p_new)::json, 0, p_now, 0.0, 0, 0) ON CONFLICT (call_id) DO NOTHING;
    PERFORM 1 FROM aaa_calls WHERE call_id = p_call_id FOR UPDATE;
  END IF;
  SELECT EXISTS (
    SELECT 1 FROM aaa_calls c
     WHERE c.call_id = p_call_id AND c.attempts = 0 AND c.lease_token IS NULL AND c.handed_on = 0
       AND c.handed = 0 AND NOT EXISTS (SELECT 1 FROM aaa_results r WHERE r.call_id = c.call_id)
       AND CASE WHEN p_spec IS NOT NULL THEN c.spec::text = p_spec
           ELSE c.spec->>'name' = p_name AND c.spec->>'idempotency_key' = p_idem AND (p_no_request OR CASE
             WHEN json_typeof(c.spec->'request') = 'object'
             THEN EXISTS (SELECT 1 FROM json_object_keys(c.spec->'request')) ELSE false END) END)
    INTO ok;
  IF NOT ok THEN
    RETURN;
  END IF;
  UPDATE aaa_calls SET attempts = p_attempt, lease_token = p_token, lease_worker = p_worker,
         lease_attempt = p_attempt, lease_expires_at = p_hint, recovery_until = 0.0
   WHERE call_id = p_call_id;
  IF e_id IS NOT NULL THEN
    INSERT INTO aaa_events (event_id, call_id, type, attempt, data, at)
    VALUES (e_id, p_call_id, e_type, e_attempt, e_data, e_at) ON CONFLICT (event_id) DO NOTHING;
  END IF;
END
$fn$"""

#: ``aaa_begin_planned`` as ``0003`` made it, by its arguments' types (dropped: a function
#: is known by its name and those types, and the new one takes two more).
BEGIN_0003 = ("aaa_begin_planned(bigint, varchar, text, text, text, boolean, integer, varchar, varchar,"
              " double precision, varchar, varchar, integer, json, double precision)")
BEGIN_0004 = ("aaa_begin_planned(bigint, varchar, text, text, text, boolean, text, double precision, integer,"
              " varchar, varchar, double precision, varchar, varchar, integer, json, double precision)")

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
        bind.exec_driver_sql(f"DROP FUNCTION IF EXISTS {BEGIN_0003}")
        for ddl in (BEGIN_PLANNED, FINISH_PLANNED):
            bind.exec_driver_sql(ddl)
    bind.execute(sa.text(f"UPDATE aaa_calls SET lease_expires_at = :never WHERE lease_expires_at IS NULL AND {_FINISHED}"),
                 {"never": float("inf")})


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        previous = op.get_context().script.get_revision("0003")  # type: ignore[union-attr]
        bind.exec_driver_sql(f"DROP FUNCTION IF EXISTS {BEGIN_0004}")
        for ddl in (previous.module.BEGIN_PLANNED, previous.module.FINISH_PLANNED):
            bind.exec_driver_sql(ddl)
    bind.execute(sa.text(f"UPDATE aaa_calls SET lease_expires_at = NULL WHERE lease_expires_at = :never AND {_FINISHED}"),
                 {"never": float("inf")})
