"""The PostgreSQL store's functions, their writes assembled from the store's statements (0.3.0).

``aaa_begin_planned`` and ``aaa_finish_planned`` (:mod:`...pg_functions`) make the same
writes as ``0004``'s, with the same arguments and replies; their ``INSERT`` and ``UPDATE``
statements are now the text of :mod:`...statements`, the ones every other path of the SQL
stores runs, so a write is written once. No table, column, index or row changes: a worker of
0.2.0 beside this release calls the functions with the same arguments and gets the same
replies. SQLite has no functions: nothing to do there.

The functions are written out here as this revision made them, not read from
:mod:`...pg_functions`, which moves on; the downgrade puts ``0004``'s back (read from that
revision).
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
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
    INSERT INTO aaa_calls (call_id, spec, attempts, registered_at, recovery_until, handed_on, handed) VALUES (p_call_id, coalesce(p_spec, p_new)::json, 0, p_now, 0.0, 0, 0) ON CONFLICT (call_id) DO NOTHING;
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
  UPDATE aaa_calls SET attempts=p_attempt, lease_token=p_token, lease_worker=p_worker, lease_attempt=p_attempt, lease_expires_at=p_hint, recovery_until=0.0 WHERE aaa_calls.call_id = p_call_id;
  IF e_id IS NOT NULL THEN
    INSERT INTO aaa_events (event_id, call_id, type, attempt, data, at) VALUES (e_id, p_call_id, e_type, e_attempt, e_data, e_at) ON CONFLICT (event_id) DO NOTHING;
  END IF;
END
$fn$"""

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
  UPDATE aaa_calls SET lease_token=NULL, lease_worker=NULL, lease_attempt=NULL, lease_expires_at='Infinity' WHERE aaa_calls.call_id = p_call_id;
  IF e_id IS NOT NULL THEN
    INSERT INTO aaa_events (event_id, call_id, type, attempt, data, at) VALUES (e_id, p_call_id, e_type, e_attempt, e_data, e_at) ON CONFLICT (event_id) DO NOTHING;
  END IF;
  -- the key stays held until this commits (see the module's docstring)
  PERFORM pg_advisory_xact_lock(p_key);
  PERFORM pg_advisory_unlock(p_key);
END
$fn$"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for ddl in (BEGIN_PLANNED, FINISH_PLANNED):
            bind.exec_driver_sql(ddl)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        previous = op.get_context().script.get_revision("0004")  # type: ignore[union-attr]
        for ddl in (previous.module.BEGIN_PLANNED, previous.module.FINISH_PLANNED):
            bind.exec_driver_sql(ddl)
