"""The PostgreSQL store's server-side functions: ``begin`` and ``finish`` as one prepared
statement each (:mod:`.pg_driver`'s ``BEGIN_PLANNED`` and ``FINISH_PLANNED``).

Each runs as its own autocommitted statement, so a call is one round trip, one transaction
and one commit, and PL/pgSQL keeps its statements' plans for the session. They decide
nothing: :mod:`~aaa_celery.lifecycle` plans the writes in Python for the state the call is
expected in; the function takes the call's row lock, compares the row with that state, and
makes the writes only if it matches (else it writes nothing, and the store plans again from
the row). Each comparison is a statement after the row lock's, so it reads the row as the
last writer committed it (READ COMMITTED: a fresh snapshot per statement of a volatile
function).

``aaa_finish_planned`` gives the lease's session lock back inside its transaction, but takes
the same key's transaction lock first: the key stays held until the result commits, so a
``begin`` elsewhere finds the call busy until then, never free with the result unseen (its
row read, ``SELECT ... FOR UPDATE`` with the result joined, would otherwise see the row's
new version beside the result as of its older snapshot).

``aaa_begin_planned`` registers a call it finds no row of (a message sent by name) and then
locks the row, so that call's first ``begin`` is one round trip too; ``aaa_finish_planned``
writes the finished row's sweep hint as ``'Infinity'`` (``lifecycle.FINISHED_HINT``), as
:class:`.statements.SQLWriter` does on the other path.

Their writes are :mod:`.statements`' own (:meth:`.statements.Statement.plpgsql`), so a write
is written once for every path; what is written here is only the comparison with the
expected state, and the locks.

Created by schema revision ``0003`` (and with the tables of a new database), replaced by
``0004`` and again by ``0006`` (the same functions, their writes assembled from
:mod:`.statements`); a database not migrated yet lacks them, and the store then runs
``begin`` and ``finish`` in two round trips. Each revision keeps its own copy: a change here,
or to one of the statements it takes, needs a revision that replaces the functions, or a
migrated database would run the old ones (``tests/stores/test_schema_version.py``).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from .statements import CLAIM_ATTEMPT, CLEAR_FINISHED_LEASE, INSERT_CALL_IF_ABSENT, INSERT_EVENT_IF_ABSENT, INSERT_RESULT

_NO_RESULT = "NOT EXISTS (SELECT 1 FROM aaa_results r WHERE r.call_id = c.call_id)"

_EVENT = f"""
  IF e_id IS NOT NULL THEN
    {INSERT_EVENT_IF_ABSENT.plpgsql(event_id="e_id", call_id="p_call_id", type="e_type", attempt="e_attempt",
                                    data="e_data", at="e_at")};
  END IF;"""

#: ``begin`` for a call's first delivery: (lock key, call id, the spec as JSON text for a
#: message as sent, else NULL and its name, key and whether it has no request; the spec as
#: JSON text to register the call with if nobody did (NULL: the first), and when; the claim's
#: attempt, token, worker and sweep hint; the event's id, type, attempt, data, time, or NULLs)
#: to (the lock was granted, the row matched and was written, the backend pid). A call with no
#: row is registered first, as ``register`` does (``pg_driver.INSERT_NEW_CALL``).
BEGIN_PLANNED = f"""
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
    {INSERT_CALL_IF_ABSENT.plpgsql(call_id="p_call_id", spec="coalesce(p_spec, p_new)::json", now="p_now")};
    PERFORM 1 FROM aaa_calls WHERE call_id = p_call_id FOR UPDATE;
  END IF;
  SELECT EXISTS (
    SELECT 1 FROM aaa_calls c
     WHERE c.call_id = p_call_id AND c.attempts = 0 AND c.lease_token IS NULL AND c.handed_on = 0
       AND c.handed = 0 AND {_NO_RESULT}
       AND CASE WHEN p_spec IS NOT NULL THEN c.spec::text = p_spec
           ELSE c.spec->>'name' = p_name AND c.spec->>'idempotency_key' = p_idem AND (p_no_request OR CASE
             WHEN json_typeof(c.spec->'request') = 'object'
             THEN EXISTS (SELECT 1 FROM json_object_keys(c.spec->'request')) ELSE false END) END)
    INTO ok;
  IF NOT ok THEN
    RETURN;
  END IF;
  {CLAIM_ATTEMPT.plpgsql(attempt="p_attempt", token="p_token", worker="p_worker", hint="p_hint",
                         call_id="p_call_id")};{_EVENT}
END
$fn$"""

#: ``finish`` for this attempt being the call's last, without a result: (lock key, call id,
#: attempt, name; the result as JSON and when; the event as ``aaa_begin_planned``'s) to (the
#: row matched and was written, the backend pid). The lease is given back if it matched.
FINISH_PLANNED = f"""
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
     WHERE c.call_id = p_call_id AND c.attempts = p_attempt AND c.spec->>'name' = p_name AND {_NO_RESULT})
    INTO ok;
  IF NOT ok THEN
    RETURN;
  END IF;
  {INSERT_RESULT.plpgsql(call_id="p_call_id", outcome="p_outcome", now="p_now")};
  {CLEAR_FINISHED_LEASE.plpgsql(hint="'Infinity'", call_id="p_call_id")};{_EVENT}
  -- the key stays held until this commits (see the module's docstring)
  PERFORM pg_advisory_xact_lock(p_key);
  PERFORM pg_advisory_unlock(p_key);
END
$fn$"""

FUNCTIONS = (BEGIN_PLANNED, FINISH_PLANNED)
NAMES = ("aaa_begin_planned", "aaa_finish_planned")


def create(conn: Connection) -> None:
    """Create (or replace) the functions, on PostgreSQL only (SQLite has none)."""
    if conn.dialect.name != "postgresql":
        return
    for ddl in FUNCTIONS:
        conn.exec_driver_sql(ddl)
