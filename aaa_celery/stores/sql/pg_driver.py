"""The PostgreSQL store's hot path on the driver: ``register``, ``begin``, ``finish`` and the
lease session's statements, sent by psycopg directly.

SQLAlchemy builds each statement of :mod:`.queries` anew per call, derives its cache key
and sets up an execution context around it: most of a guarded call's worker CPU on this
store (``benchmarks/RESULTS.md``, 2026-12-01). The statements here are those of
:mod:`.queries` with the same names, written once for PostgreSQL; the lease session's run
as server-side prepared statements. Values are written as SQLAlchemy writes them (its
``JSON`` columns hold ``json.dumps`` text), so rows written here and through :mod:`.queries`
read alike, by this release and by 0.1.0 workers. The rest of the store (operators' verbs,
recovery, runs, budgets) keeps SQLAlchemy.

A write transaction (:class:`Transaction`) sends its ``BEGIN`` with the row's ``SELECT ...
FOR UPDATE``, and its writes with the ``COMMIT``, so an operation on a registered call is
two round trips. On the lease session (:meth:`.lease_sessions.LeaseSession.transaction`) the
lease's lock rides before the ``BEGIN`` (``first``) and its unlock after the ``COMMIT``
(:meth:`Transaction.commit`'s ``then``): still two. Before it, ``begin`` and ``finish``
try one: a server-side function (:mod:`.pg_functions`) given the writes of a plan made for
the state the call is expected in (:class:`Planned`), made only if the row is in it.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import generators, pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.rows import namedtuple_row
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import Pool, PoolProxiedConnection

from ...lifecycle import FINISHED_HINT, CallSpec, Draft, Lease, Outcome, Writes, merge_spec, sweep_hint
from .._writes import CallWriter
from ..base import ResultRow

#: psycopg's errors that mean the server or the connection failed (the store is unavailable).
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

_CALL_COLUMNS = ("call_id, spec, attempts, registered_at, lease_token, lease_worker, lease_attempt,"
                 " lease_expires_at, recovery_until, handed_on, handed")

# -- Statements (positional parameters, in the order each docstring names) ------------------

#: :func:`.queries.insert_new_call`: (call_id, spec JSON, registered_at); returns the id only
#: if this inserted the row.
INSERT_NEW_CALL = ("INSERT INTO aaa_calls (call_id, spec, attempts, registered_at, recovery_until, handed_on, handed)"
                   " VALUES (%s, %s::json, 0, %s, 0.0, 0, 0) ON CONFLICT (call_id) DO NOTHING RETURNING call_id")

#: :func:`.queries.select_call_and_result_for_update`: (call_id).
SELECT_CALL_AND_RESULT_FOR_UPDATE = (
    f"SELECT {', '.join('c.' + c.strip() for c in _CALL_COLUMNS.split(','))}, r.outcome"
    " FROM aaa_calls c LEFT OUTER JOIN aaa_results r ON r.call_id = c.call_id"
    " WHERE c.call_id = %s FOR UPDATE OF c")

#: :func:`.queries.update_call_spec`: (spec JSON, call_id).
UPDATE_CALL_SPEC = "UPDATE aaa_calls SET spec = %s::json WHERE call_id = %s"

#: :func:`.queries.claim_attempt`: (attempt, token, worker, attempt, expiry or sweep hint, call_id).
CLAIM_ATTEMPT = ("UPDATE aaa_calls SET attempts = %s, lease_token = %s, lease_worker = %s, lease_attempt = %s,"
                 " lease_expires_at = %s, recovery_until = 0.0 WHERE call_id = %s")

#: :func:`.queries.insert_result`: (call_id, outcome JSON, recorded_at).
INSERT_RESULT = "INSERT INTO aaa_results (call_id, outcome, recorded_at) VALUES (%s, %s::json, %s)"

#: :func:`.queries.clear_lease` without a token: (call_id).
CLEAR_LEASE = ("UPDATE aaa_calls SET lease_token = NULL, lease_worker = NULL, lease_attempt = NULL,"
               " lease_expires_at = NULL WHERE call_id = %s")

#: :func:`.queries.clear_lease` with a token: (call_id, token).
CLEAR_LEASE_OF = CLEAR_LEASE + " AND lease_token = %s"

#: :func:`.queries.clear_finished_lease`: (``lifecycle.FINISHED_HINT``, call_id).
CLEAR_FINISHED_LEASE = ("UPDATE aaa_calls SET lease_token = NULL, lease_worker = NULL, lease_attempt = NULL,"
                        " lease_expires_at = %s WHERE call_id = %s")

#: :func:`.queries.hand_on_attempt`: (attempt, now, call_id, token).
HAND_ON_ATTEMPT = ("UPDATE aaa_calls SET handed_on = %s, handed = handed + 1, registered_at = %s,"
                   " lease_token = NULL, lease_worker = NULL, lease_attempt = NULL, lease_expires_at = NULL"
                   " WHERE call_id = %s AND lease_token = %s")

#: :func:`.queries.insert_event_if_absent`: (event_id, call_id, type, attempt, data JSON, at).
INSERT_EVENT_IF_ABSENT = ("INSERT INTO aaa_events (event_id, call_id, type, attempt, data, at)"
                          " VALUES (%s, %s, %s, %s, %s::json, %s) ON CONFLICT (event_id) DO NOTHING")

#: :func:`.queries.update_result`: (outcome JSON, call_id).
UPDATE_RESULT = "UPDATE aaa_results SET outcome = %s::json WHERE call_id = %s"

#: :func:`.queries.upsert_checkpoint`: (call_id, checkpoint, saved_at).
UPSERT_CHECKPOINT = ("INSERT INTO aaa_checkpoints (call_id, checkpoint, saved_at) VALUES (%s, %s, %s)"
                     " ON CONFLICT (call_id) DO UPDATE SET checkpoint = excluded.checkpoint,"
                     " saved_at = excluded.saved_at")

#: :func:`.queries.select_event_data`: (event_id).
SELECT_EVENT_DATA = "SELECT data FROM aaa_events WHERE event_id = %s"

#: The lease session's statements (:class:`~.lease_sessions.LeaseSession`); each also returns the
#: backend pid. Take a lease: (key).
TRY_LEASE_LOCK = "SELECT pg_try_advisory_lock(%s::bigint), pg_backend_pid()"
#: Give a lease back: (key).
RELEASE_LEASE_LOCK = "SELECT pg_advisory_unlock(%s::bigint), pg_backend_pid()"
#: A renewal by the holder: does the call's row still name the token as its lease (call_id,
#: token), and move its sweep hint on to (hint, call_id, token) in the same statement. It never
#: waits: a row another transaction has locked keeps its hint this time (``SKIP LOCKED``), as
#: the lease session must not stall behind a row lock (every lease of the process is on it).
#: Committed without waiting for the WAL flush (``synchronous_commit`` off for this statement's
#: transaction alone): the hint only says when the sweep should ask the lock, and a hint a
#: crash loses is an older one, which makes the sweep ask sooner, never decide otherwise (the
#: crash ended every session's locks too).
RENEW_OWN_LEASE = (
    "WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),"
    " renewed AS (UPDATE aaa_calls SET lease_expires_at = %s WHERE EXISTS (SELECT 1 FROM async) AND call_id IN"
    " (SELECT call_id FROM aaa_calls WHERE call_id = %s AND lease_token = %s FOR UPDATE SKIP LOCKED)"
    " RETURNING 1)"
    " SELECT EXISTS (SELECT 1 FROM aaa_calls WHERE call_id = %s AND lease_token = %s), pg_backend_pid()")
#: This session's backend pid: ().
SESSION_PID = "SELECT true, pg_backend_pid()"

dumps = json.dumps  # what SQLAlchemy's JSON columns write


def outcome_json(outcome: Outcome) -> str:
    """An outcome as :func:`.queries.insert_result` writes it (``json.dumps`` of its fields), the
    same text: an outcome's fields hold JSON data only (the Redis store writes them as they
    are), so ``dataclasses.asdict``'s deep copy (~6 µs a ``finish``) buys nothing."""
    return dumps(outcome.__dict__)


class _Prepared:
    """What :func:`fetch_prepared` keeps per connection: psycopg's adapter of its values, and
    the statements prepared on it."""

    __slots__ = ("names", "transformer")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.transformer = Transformer.from_context(conn)
        self.names: set[bytes] = set()


_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Prepared] = weakref.WeakKeyDictionary()
_FORMS: dict[str, tuple[bytes, bytes]] = {}


def _form(statement: str) -> tuple[bytes, bytes]:
    """The name ``statement`` is prepared under, and its text with ``$n`` parameters."""
    form = _FORMS.get(statement)
    if form is None:
        assert "%%" not in statement and "%(" not in statement, statement
        parts = statement.split("%s")
        text = parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], 1))
        name = "aaa_" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]
        form = _FORMS[statement] = (name.encode(), text.encode())
    return form


def fetch_prepared(conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Run ``statement`` (``%s`` parameters) on ``conn`` as a prepared statement and return its
    first row (None if it has none), as ``conn.execute(statement, params, prepare=True)
    .fetchone()`` would, in one round trip once prepared.

    It takes psycopg's parts below its cursor (the adapters, libpq's extended protocol and
    psycopg's own wait): about half the client CPU of ``execute`` per statement, which is
    most of what a call's ``begin`` and ``finish`` cost the worker on this store
    (``benchmarks/RESULTS.md``, session 11). Errors are psycopg's, as ``execute`` raises them.
    Only on an autocommit connection: on another, psycopg's ``execute`` opens the transaction."""
    if not conn.autocommit:
        row: tuple[Any, ...] | None = conn.execute(statement, params, prepare=True).fetchone()
        return row
    state = _PREPARED.get(conn)
    if state is None:
        state = _PREPARED[conn] = _Prepared(conn)
    pgconn, tx = conn.pgconn, state.transformer
    name, text = _form(statement)
    values = tx.dump_sequence(params, [PyFormat.TEXT] * len(params))
    for last in (False, True):
        if name not in state.names:
            pgconn.send_prepare(name, text)
            _result(conn, conn.wait(generators.execute(pgconn)), pq.ExecStatus.COMMAND_OK)
            state.names.add(name)
        pgconn.send_query_prepared(name, values)
        try:
            result = _result(conn, conn.wait(generators.execute(pgconn)), pq.ExecStatus.TUPLES_OK)
            break
        except psycopg.errors.InvalidSqlStatementName:
            # Gone with a DEALLOCATE ALL (psycopg sends one after a rollback, for its own
            # prepared statements) or a pooler's reset; refused before it ran: prepare again.
            state.names.clear()
            if last:
                raise
    if not result.ntuples:
        return None
    tx.set_pgresult(result)
    return tx.load_row(0, tuple)


def _result(conn: psycopg.Connection[Any], results: list[pq.abc.PGresult], expected: pq.ExecStatus) -> pq.abc.PGresult:
    result = results[-1]
    if result.status != expected:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
        raise psycopg.InterfaceError(f"unexpected result status {pq.ExecStatus(result.status).name}")
    return result


def session_run(conn: Any, statement: str, params: tuple[Any, ...]) -> tuple[Any, int]:
    """Run one lease-session statement on ``conn`` (a psycopg connection) as a prepared
    statement: (its answer, the backend pid)."""
    row = fetch_prepared(conn, statement, params)
    assert row is not None
    return row[0], row[1]


def claim_params(lease: Lease, now: float, call_id: str) -> tuple[Any, ...]:
    """:data:`CLAIM_ATTEMPT`'s parameters (the lease's sweep hint as its expiry)."""
    return lease.attempt, lease.token, lease.worker, lease.attempt, sweep_hint(lease, now), call_id


class _Writer(CallWriter):
    """The writes of one locked call, queued in its transaction (sent with the ``COMMIT``)."""

    def __init__(self, tx: Transaction, call_id: str, now: float) -> None:
        self.tx, self.call_id, self.now = tx, call_id, now

    def claim(self, lease: Lease) -> None:
        self.tx.queue(CLAIM_ATTEMPT, *claim_params(lease, self.now, self.call_id))

    def record(self, outcome: Outcome) -> None:
        self.tx.queue(INSERT_RESULT, self.call_id, outcome_json(outcome), self.now)
        self.tx.queue(CLEAR_FINISHED_LEASE, FINISHED_HINT, self.call_id)

    def append(self, event: Draft) -> None:
        e = event.stamp(self.now)
        self.tx.queue(INSERT_EVENT_IF_ABSENT, e.id, e.call_id, e.type, e.attempt, dumps(e.data), e.at)

    def let_go(self, token: str) -> None:
        self.tx.queue(CLEAR_LEASE_OF, self.call_id, token)

    def settle(self, outcome: Outcome) -> None:
        self.tx.queue(UPDATE_RESULT, outcome_json(outcome), self.call_id)

    def checkpoint(self, checkpoint: str) -> None:
        self.tx.queue(UPSERT_CHECKPOINT, self.call_id, checkpoint, self.now)

    def hand_on(self, lease: Lease) -> None:
        self.tx.queue(HAND_ON_ATTEMPT, lease.attempt, self.now, self.call_id, lease.token)


class Transaction:
    """One write transaction on a pooled connection, in as few round trips as it can: the
    statements are queued, and a read (:meth:`lock_call`, :meth:`event_data`) or the
    ``COMMIT`` sends all that is queued as one multi-statement query. The values are bound
    by the driver on the client (psycopg's ``ClientCursor``, which quotes each value), so
    one query carries several statements: psycopg's pipeline mode, the alternative, polls
    the socket once per statement, which cost more CPU than the round trips it saves."""

    def __init__(self, conn: psycopg.Connection[Any], first: tuple[str, tuple[Any, ...]] | None = None) -> None:
        self.cur: psycopg.ClientCursor[Any] = psycopg.ClientCursor(conn, row_factory=namedtuple_row)
        self._sql: list[str] = ["BEGIN"]
        self._params: list[Any] = []
        #: The row of ``first``, a statement sent before the ``BEGIN`` (with the first read).
        self.first: Any = None
        self._first = first is not None
        if first is not None:
            self._sql.insert(0, first[0])
            self._params.extend(first[1])

    def queue(self, statement: str, *params: Any) -> None:
        """Send ``statement`` with the next query."""
        self._sql.append(statement)
        self._params.extend(params)

    def read(self, statement: str, *params: Any) -> Any:
        """Send what is queued and ``statement``; return ``statement``'s first row (or None)."""
        self.queue(statement, *params)
        self._send()
        return self.cur.fetchone()

    def commit(self, then: tuple[str, tuple[Any, ...]] | None = None) -> Any:
        """Send what is queued and the ``COMMIT``, and ``then``, a statement run after it (out
        of the transaction); return ``then``'s first row (or None)."""
        self.queue("COMMIT")
        if then is None:
            self._send()
            return None
        return self.read(then[0], *then[1])

    def _send(self) -> None:
        sql, params, self._sql, self._params = self._sql, self._params, [], []
        self.cur.execute("; ".join(sql), params)
        if self._first:
            self.first, self._first = self.cur.fetchone(), False
        while self.cur.nextset():  # to the last statement's result
            pass

    def lock_call(self, spec: CallSpec, now: float) -> tuple[Any, CallSpec]:
        """:meth:`.store.SQLStore._lock_call` on the driver: lock the call's row (creating it),
        with its outcome (``row.outcome``), and return it with the call's spec in force."""
        row = self.read(SELECT_CALL_AND_RESULT_FOR_UPDATE, spec.call_id)
        if row is None:
            self.queue(INSERT_NEW_CALL, spec.call_id, dumps(spec.__dict__), now)
            row = self.read(SELECT_CALL_AND_RESULT_FOR_UPDATE, spec.call_id)
            assert row is not None
        stored = CallSpec(**row.spec)
        kept = merge_spec(stored, spec)
        if kept is not stored:
            self.queue(UPDATE_CALL_SPEC, dumps(kept.__dict__), kept.call_id)
        return row, kept

    def event_data(self, event_id: str) -> dict[str, Any] | None:
        row = self.read(SELECT_EVENT_DATA, event_id)
        return None if row is None else row.data

    def writer(self, call_id: str, now: float) -> CallWriter:
        return _Writer(self, call_id, now)


@contextmanager
def transaction(pool: Pool, proxy: PoolProxiedConnection) -> Iterator[Transaction]:
    """A :class:`Transaction` on ``proxy`` (a pooled connection), committed at the end. A
    connection whose transaction failed is never handed out again: it is dropped, and when
    the failure was the connection's (the server went away), so is every pooled connection
    opened before it (SQLAlchemy's own rule for a disconnect)."""
    conn: psycopg.Connection[Any] = proxy.driver_connection  # type: ignore[assignment]
    try:
        conn.autocommit = True  # the transaction's BEGIN and COMMIT travel with its statements
        tx = Transaction(conn)
        yield tx
        tx.commit()
        conn.autocommit = False
    except BaseException as e:
        drop(pool, proxy, e)
        raise
    proxy.close()


def autocommit(pool: Pool, proxy: PoolProxiedConnection, statement: str, params: tuple[Any, ...]) -> Any:
    """Run one statement alone on a pooled connection (autocommitted: one round trip) and
    return its first row."""
    conn: psycopg.Connection[Any] = proxy.driver_connection  # type: ignore[assignment]
    try:
        conn.autocommit = True
        row = fetch_prepared(conn, statement, params)
        conn.autocommit = False
    except BaseException as e:
        drop(pool, proxy, e)
        raise
    proxy.close()
    return row


def drop(pool: Pool, proxy: PoolProxiedConnection, error: BaseException) -> None:
    """Throw away a pooled connection after ``error`` (all older ones too if it broke)."""
    conn: DBAPIConnection = proxy.driver_connection  # type: ignore[assignment]
    if isinstance(error, CONNECTION_ERRORS) or getattr(conn, "broken", False):
        pool._invalidate(proxy, error)  # noqa: SLF001 - what SQLAlchemy does on a disconnect
    else:
        proxy.invalidate(error)
    proxy.close()


# -- One round trip: the plan for the state a call is expected in, applied only in it ------
#
# A server-side function of :mod:`.pg_functions` per operation, called as one prepared,
# autocommitted statement: it locks the call's row, compares it with the state the plan was
# made for, and makes the plan's writes only if it matches. The reply says which; a call in
# another state wrote nothing, and is planned again from its row, in a transaction of its own
# (:meth:`.lease_sessions.LeaseSession.transaction`).

#: :func:`.pg_functions.BEGIN_PLANNED`'s call: (key, call_id, spec JSON or None, name, key,
#: no request, spec JSON to register with or None, now; attempt, token, worker, hint; the
#: event's five values or None): (got, ok, pid).
BEGIN_PLANNED = ("SELECT got, ok, pid FROM aaa_begin_planned(%s::bigint, %s::varchar, %s::text, %s::text,"
                 " %s::text, %s::boolean, %s::text, %s::double precision, %s::integer, %s::varchar,"
                 " %s::varchar, %s::double precision, %s::varchar, %s::varchar, %s::integer, %s::json,"
                 " %s::double precision)")

#: :func:`.pg_functions.FINISH_PLANNED`'s call: (key, call_id, attempt, name; outcome JSON,
#: now; the event's five values or None): (ok, pid).
FINISH_PLANNED = ("SELECT ok, pid FROM aaa_finish_planned(%s::bigint, %s::varchar, %s::integer, %s::text,"
                  " %s::json, %s::double precision, %s::varchar, %s::varchar, %s::integer, %s::json,"
                  " %s::double precision)")



def quoted_name(*parts: str | None) -> str:
    """An identifier, schema-qualified if a schema is given, quoted as PostgreSQL quotes one."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts if part is not None)


def insert_result_row(row: ResultRow, source: str = "") -> tuple[str, tuple[Any, ...]]:
    """The statement that writes Celery's result ``row`` as Celery's database backend writes a
    result: inserted, or updated unless the row holds a SUCCESS already; ``source`` a ``FROM``
    clause the values are selected from (by default none). The statement and its parameters."""
    names, values, params = [], [], []
    if row.id is not None:
        names.append(quoted_name(row.id[0]))
        values.append("nextval(%s::regclass)")
        params.append(row.id[1])
    for name, kind, value in row.columns:
        names.append(quoted_name(name))
        values.append(f"%s::{kind}")
        params.append(value)
    kept = {'"task_id"', *(quoted_name(name) for name in row.keep)}
    updates = ", ".join(f"{n} = EXCLUDED.{n}" for n in names[1 if row.id is not None else 0:] if n not in kept)
    statement = (f"INSERT INTO {quoted_name(*row.table)} AS t ({', '.join(names)}) SELECT {', '.join(values)}"
                 f"{source} ON CONFLICT (task_id) DO UPDATE SET {updates} WHERE t.status IS DISTINCT FROM 'SUCCESS'")
    return statement, tuple(params)


def finish_planned_with_row(row: ResultRow) -> tuple[str, tuple[Any, ...]]:
    """:data:`FINISH_PLANNED` with Celery's result ``row`` written in the same statement, so in
    the same transaction, only if the function made the planned writes
    (:func:`insert_result_row`). The statement, and ``row``'s parameters (after FINISH_PLANNED's)."""
    insert, params = insert_result_row(row, " FROM f WHERE f.ok")
    return f"WITH f AS MATERIALIZED ({FINISH_PLANNED}), c AS ({insert}) SELECT ok, pid FROM f", params


#: The error of a database whose schema predates the functions (not migrated to ``0004``,
#: whose ``aaa_begin_planned`` takes two more arguments than ``0003``'s).
UNDEFINED_FUNCTION = psycopg.errors.UndefinedFunction


class Planned(CallWriter):
    """The writes of a plan made for an expected state, as the functions' parameters: a
    ``begin``'s claim, a ``finish``'s result, and the event of either (a plan with other
    writes is not sent this way: :meth:`takes`)."""

    def __init__(self, call_id: str, now: float) -> None:
        self.call_id, self.now = call_id, now
        self.claimed: tuple[Any, ...] = ()
        self.recorded: tuple[Any, ...] = ()
        self.event: tuple[Any, ...] = (None,) * 5
        #: The plan's reply (set by whoever applies the writes here).
        self.reply: Any = None

    @staticmethod
    def takes(writes: Writes, begin: bool) -> bool:
        """Whether ``writes`` are all writes the function of ``begin`` (else ``finish``) makes."""
        made = writes.claim if begin else writes.record
        unmade = (writes.record if begin else writes.claim, writes.let_go, writes.hand_on, writes.checkpoint,
                  writes.settle)
        return made is not None and unmade == (None,) * 5

    def claim(self, lease: Lease) -> None:
        self.claimed = (lease.attempt, lease.token, lease.worker, sweep_hint(lease, self.now))

    def record(self, outcome: Outcome) -> None:
        self.recorded = (outcome_json(outcome), self.now)

    def append(self, event: Draft) -> None:
        e = event.stamp(self.now)
        self.event = (e.id, e.type, e.attempt, dumps(e.data), e.at)

    def let_go(self, token: str) -> None:
        raise AssertionError("not a planned write")

    def settle(self, outcome: Outcome) -> None:
        raise AssertionError("not a planned write")

    def hand_on(self, lease: Lease) -> None:
        raise AssertionError("not a planned write")

    def checkpoint(self, checkpoint: str) -> None:
        raise AssertionError("not a planned write")
