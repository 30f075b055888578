"""The PostgreSQL store's hot path on the driver: ``register``, ``begin``, ``finish`` and the
lease session's statements, sent by psycopg directly.

SQLAlchemy would build each statement anew per call, derive its cache key and set up an
execution context around it: most of a guarded call's worker CPU on this store
(``benchmarks/RESULTS.md``, 2026-12-01). So the hot path sends the compiled text of
:mod:`.statements` (each written once, in SQLAlchemy Core) by psycopg; the lease session's
statements, and :func:`autocommit`'s, run as server-side prepared statements. The rest of
the store (operators' verbs, recovery, runs, budgets) keeps SQLAlchemy.

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
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import generators, pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.rows import namedtuple_row
from sqlalchemy.pool import Pool, PoolProxiedConnection

from ...lifecycle import CallSpec, Draft, Lease, Outcome, Writes, sweep_hint
from .._writes import CallWriter
from ..base import ResultRow
from .statements import RENEW_LEASE, SELECT_EVENT_DATA, SQLWriter, Statement, dumps, lock_call, outcome_json

#: psycopg's errors that mean the server or the connection failed (the store is unavailable).
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

#: The lease session's statements (:class:`~.lease_sessions.LeaseSession`); each also returns the
#: backend pid. Take a lease: (key).
TRY_LEASE_LOCK = "SELECT pg_try_advisory_lock(%s::bigint), pg_backend_pid()"
#: Give a lease back: (key).
RELEASE_LEASE_LOCK = "SELECT pg_advisory_unlock(%s::bigint), pg_backend_pid()"
#: A renewal by the holder: lifecycle's renew write (:data:`.statements.RENEW_LEASE`: the
#: sweep hint moved on while the row names the token; its parameters), and whether the row
#: still names the token (call_id, token), in one statement. It never waits: a row another
#: transaction has locked keeps its hint this time (``SKIP LOCKED``: call_id, token), as the
#: lease session must not stall behind a row lock (every lease of the process is on it).
#: Committed without waiting for the WAL flush (``synchronous_commit`` off for this statement's
#: transaction alone): the hint only says when the sweep should ask the lock, and a hint a
#: crash loses is an older one, which makes the sweep ask sooner, never decide otherwise (the
#: crash ended every session's locks too).
RENEW_OWN_LEASE = (
    "WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),"
    f" renewed AS ({RENEW_LEASE.postgresql} AND EXISTS (SELECT 1 FROM async) AND aaa_calls.call_id IN"
    " (SELECT call_id FROM aaa_calls WHERE call_id = %s AND lease_token = %s FOR UPDATE SKIP LOCKED) RETURNING 1)"
    " SELECT EXISTS (SELECT 1 FROM aaa_calls WHERE call_id = %s AND lease_token = %s), pg_backend_pid()")
#: This session's backend pid: ().
SESSION_PID = "SELECT true, pg_backend_pid()"

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

    def run(self, statement: Statement, args: tuple[Any, ...]) -> None:
        """Queue one of :mod:`.statements`' statements."""
        self.queue(statement.postgresql, *args)

    def fetch(self, statement: Statement, args: tuple[Any, ...]) -> Any:
        """Run one of :mod:`.statements`' statements and return its first row (or None)."""
        return self.read(statement.postgresql, *args)

    def lock_call(self, spec: CallSpec, now: float) -> tuple[Any, CallSpec]:
        """:meth:`.store.SQLStore._lock_call` on the driver (:func:`.statements.lock_call`)."""
        return lock_call(self.fetch, self.run, spec, now)

    def event_data(self, event_id: str) -> dict[str, Any] | None:
        row = self.fetch(SELECT_EVENT_DATA, (event_id,))
        return None if row is None else row.data

    def writer(self, call_id: str, now: float) -> CallWriter:
        return SQLWriter(self.run, call_id, now)


@contextmanager
def _autocommitted(pool: Pool, proxy: PoolProxiedConnection) -> Iterator[psycopg.Connection[Any]]:
    """The driver's connection of ``proxy`` (a pooled connection), in autocommit while it is
    used, then handed back to the pool. A connection whose use failed is never handed out
    again: it is dropped, and when the failure was the connection's (the server went away),
    so is every pooled connection opened before it (SQLAlchemy's own rule for a disconnect)."""
    conn: psycopg.Connection[Any] = proxy.driver_connection  # type: ignore[assignment]
    try:
        conn.autocommit = True
        yield conn
        conn.autocommit = False
    except BaseException as e:
        if isinstance(e, CONNECTION_ERRORS) or conn.broken:
            pool._invalidate(proxy, e)  # noqa: SLF001 - what SQLAlchemy does on a disconnect
        else:
            proxy.invalidate(e)
        proxy.close()
        raise
    proxy.close()


@contextmanager
def transaction(pool: Pool, proxy: PoolProxiedConnection) -> Iterator[Transaction]:
    """A :class:`Transaction` on ``proxy``, committed at the end (``BEGIN`` and ``COMMIT`` go with its statements)."""
    with _autocommitted(pool, proxy) as conn:
        tx = Transaction(conn)
        yield tx
        tx.commit()


def autocommit(pool: Pool, proxy: PoolProxiedConnection, statement: str, params: tuple[Any, ...]) -> Any:
    """Run one statement alone on a pooled connection (autocommitted: one round trip) and
    return its first row."""
    with _autocommitted(pool, proxy) as conn:
        return fetch_prepared(conn, statement, params)


# -- One round trip: the plan for the state a call is expected in, applied only in it by a
# function of :mod:`.pg_functions` (called as one prepared, autocommitted statement) --------

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
                  writes.settle, writes.renew)
        return made is not None and unmade == (None,) * 6

    def claim(self, lease: Lease) -> None:
        self.claimed = (lease.attempt, lease.token, lease.worker, sweep_hint(lease, self.now))

    def record(self, outcome: Outcome) -> None:
        self.recorded = (outcome_json(outcome), self.now)

    def append(self, event: Draft) -> None:
        e = event.stamp(self.now)
        self.event = (e.id, e.type, e.attempt, dumps(e.data), e.at)

    def _unplanned(self, *_: Any, **__: Any) -> None:
        raise AssertionError("not a planned write")

    let_go = settle = hand_on = checkpoint = renew = _unplanned
