"""The PostgreSQL store: the spec's semantics, a lease bound to a database session.

A lease is a session-level advisory lock on one of the store's lease sessions
(:mod:`.lease_sessions`); attempts, results and events are the rows of :mod:`.schema`,
written under ``SELECT ... FOR UPDATE``, so the attempt number is a real fence. ``begin``
and ``finish`` of a call in the state lifecycle planned for are one prepared call of a
server-side function (:mod:`.pg_functions`, through :mod:`.pg_driver`); any other call is
decided from its row in a transaction of two round trips, the lock kept. A frozen but
connected holder keeps its lease; a dead one's session, and every lease on it, ends at
once. The recovery sweep reads the rows whose sweep hint (``lifecycle.sweep_hint``, moved
on by each ``renew``) has lapsed, and asks their locks. ``docs/stores.md`` describes it
all for operators: lease sessions, keepalives, ``idle_session_timeout_s``, poolers, and
Celery's results in the same database.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Row

from ...config import GuardConfig
from ...errors import ConfigError, StoreUnavailable
from ...lifecycle import (Accepted, BeginResult, CallSpec, CallState, Claimed, FinishResult, Lease, Outcome, Writes,
                          plan_finish, plan_renew, spec_rank, sweep_hint)
from .._writes import apply
from ..base import ResultCopy, ResultRow, new_token, wrap_errors
from . import versions
from .lease_sessions import LeaseSessions, check_session_pinned, key_halves, lock_key
from .pg_driver import (
    BEGIN_PLANNED,
    CONNECTION_ERRORS,
    FINISH_PLANNED,
    Planned,
    autocommit,
    finish_planned_with_row,
    insert_result_row,
    quoted_name,
    transaction,
)
from .runs import SQLRuns
from .statements import INSERT_NEW_CALL, dumps
from .store import SQLStore, _outcome, call_state, lapsed_event

#: TCP keepalives on by default: a dead peer must not keep a lease for hours.
DEFAULT_CONNECT_ARGS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30000,
    "application_name": "aaa_celery",
}

# -- Statements -------------------------------------------------------------------------


#: Does backend ``pid`` hold the lease lock of the call, and does
#: the call's row still name ``token`` as its lease?
LEASE_STILL_HELD = sa.text(
    """
    SELECT EXISTS (
             SELECT 1 FROM pg_locks
              WHERE locktype = 'advisory' AND granted AND objsubid = 1
                AND classid::bigint = :hi AND objid::bigint = :lo
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND pid = CAST(:pid AS integer))
       AND EXISTS (SELECT 1 FROM aaa_calls WHERE call_id = :call_id AND lease_token = :token) AS held
    """
)

#: The keys among ``keys`` that a session holds: a shared lock on a key is granted only when
#: none does. It is held until the transaction ends, so no ``begin`` can claim the call before
#: it commits. Only these locks are looked at, where ``pg_locks`` copies the server's whole lock table.
LEASE_HELD_AMONG = sa.text(
    "SELECT k FROM unnest(CAST(:keys AS bigint[])) AS k WHERE NOT pg_try_advisory_xact_lock_shared(k)")

#: Every advisory lock held in this database, as the two halves of its key.
HELD_ADVISORY_LOCKS = sa.text(
    """
    SELECT classid::bigint AS hi, objid::bigint AS lo FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND objsubid = 1
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    """
)

#: Serialize schema creation between processes that open the store at once. A two-key
#: advisory lock: PostgreSQL keeps those apart from the one-bigint keys of call leases, so
#: no call id can ever share it.
SCHEMA_LOCK = sa.text("SELECT pg_advisory_xact_lock(:space, 0)")
#: The first key of :data:`SCHEMA_LOCK`: a 32-bit hash of the package's name.
SCHEMA_LOCK_SPACE = int.from_bytes(hashlib.blake2b(b"aaa_celery:schema", digest_size=4).digest(), "big", signed=True)

#: The database's clock, in seconds since the epoch (the store's default clock).
DB_CLOCK = sa.text("SELECT extract(epoch FROM clock_timestamp())")


def _decide_finish(tx: Any, row: Any, spec: CallSpec, lease: Lease, outcome: Outcome, config: GuardConfig,
                   now: float) -> tuple[Any, Writes]:
    """Plan the outcome of the locked call and queue the writes on ``tx`` (under the row lock,
    as ``SQLStore._finish``: the decision still holds when written): their reply, and them."""
    writes = plan_finish(call_state(row, _outcome(row.outcome), False, None), spec, lease, outcome, config)
    return apply(writes, tx.writer(lease.call_id, now)), writes


def ping_if_idle(engine: sa.Engine, idle_s: float) -> None:
    """Ping a pooled connection before handing it out only if it sat unused over ``idle_s``,
    and replace it if the ping fails (SQLAlchemy's ``pool_pre_ping`` pings every checkout:
    a round trip more on every operation). A connection in steady use is not pinged; one
    that died while in use, or within ``idle_s`` of its last use, fails its operation with
    :class:`~aaa_celery.errors.StoreUnavailable`, which the guard retries, and the pool
    then drops every connection opened before it."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is not None and time.monotonic() - since > idle_s:
            try:
                engine.dialect.do_ping(dbapi_connection)
            except Exception as e:  # any failure: the pool opens another connection
                raise exc.DisconnectionError(str(e)) from e


class PostgresStore(SQLRuns, SQLStore):
    """A store in PostgreSQL whose leases are session-level advisory locks.

    Args:
        url: ``postgresql+psycopg://user@host:port/db`` (``postgresql://`` is read the same).
        clock: the store's clock in seconds for registrations, recovery and events
            (leases have no TTL). By default the database's clock: read from the server
            every :attr:`CLOCK_SYNC_S` seconds and carried forward in between on this
            process's monotonic clock, so workers whose wall clocks differ agree on
            when a call was registered and until when its recovery is held.
        connect_args: psycopg connection parameters, over :data:`DEFAULT_CONNECT_ARGS`.
        idle_session_timeout_s: if set, the server disconnects a session idle that
            long, which frees a frozen holder's lease (PostgreSQL 14+).
        engine_options: more :func:`sqlalchemy.create_engine` options (``pool_size`` ...).
        lease_sessions: the most lease sessions (server backends, kept out of the pool) the
            process spreads its leases over (:class:`LeaseSessions`); default 8, one per
            thread of an 8-thread pool. ``1`` keeps every lease on one session.
        create_schema: create the tables and functions of an empty database at open (the
            default); ``False`` opens it as it is (``celery aaa migrate --check`` only reads).
    """

    kind = "postgresql"
    ttl_leases = False
    insert = staticmethod(postgresql.insert)

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] | None = None,
        connect_args: dict[str, Any] | None = None,
        idle_session_timeout_s: float | None = None,
        engine_options: dict[str, Any] | None = None,
        lease_sessions: int = 8,
        create_schema: bool = True,
    ) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise ConfigError(
                "the postgresql store needs the psycopg 3 driver: pip install aaa_celery[postgres]"
            ) from e
        self.url = url
        args = {**DEFAULT_CONNECT_ARGS, **(connect_args or {})}
        if idle_session_timeout_s is not None:
            timeout_ms = int(idle_session_timeout_s * 1000)
            args["options"] = f"{args.get('options', '')} -c idle_session_timeout={timeout_ms}".strip()
        options = {"pool_size": 5, "max_overflow": -1, **(engine_options or {})}
        self._clock_base: tuple[float, float] | None = None
        #: The names of the calls this process claimed (:meth:`_remember`).
        self._names: OrderedDict[str, str] = OrderedDict()
        self._names_lock = threading.Lock()
        #: The columns of each of Celery's result tables named by a copy (none: no such table),
        #: and when they were looked up (:meth:`_result_row`).
        self._result_tables: dict[tuple[str | None, str], tuple[frozenset[str], float]] = {}
        engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"), connect_args=args, **options)
        super().__init__(engine, clock or self._db_clock)
        ping_if_idle(self.engine, self.PING_IDLE_S)

        #: What wrap_errors turns into StoreUnavailable: SQLAlchemy's and the driver's errors.
        self._errors = (exc.OperationalError, exc.InterfaceError, *CONNECTION_ERRORS)
        if not isinstance(lease_sessions, int) or isinstance(lease_sessions, bool) or lease_sessions < 1:
            raise ConfigError(f"postgresql store: lease_sessions must be an int of at least 1, not {lease_sessions!r}: "
                              "the most lease sessions a process opens (default 8; 1 keeps every lease on one)")
        self._sessions = LeaseSessions(self.engine, (exc.DBAPIError, psycopg.Error), lease_sessions)
        with wrap_errors(self.kind, *self._errors):
            with self.engine.connect() as conn:
                check_session_pinned(conn)
            if create_schema:
                with self.engine.begin() as conn:
                    self._lock_schema(conn)
                    versions.prepare(conn)

    #: A pooled connection unused for this many seconds is pinged before it is handed out.
    PING_IDLE_S = 1.0

    #: Seconds between two reads of the database's clock by :meth:`now` (the default clock).
    CLOCK_SYNC_S = 30.0

    def _db_clock(self) -> float:
        """The database's clock (``clock_timestamp()``), as of its last read, carried forward
        on the monotonic clock; read again every :attr:`CLOCK_SYNC_S` seconds."""
        base = self._clock_base
        if base is None or time.monotonic() - base[1] > self.CLOCK_SYNC_S:
            try:
                base = self._read_db_clock()
            except StoreUnavailable:
                if base is None:
                    raise
        return base[0] + (time.monotonic() - base[1])

    def _read_db_clock(self) -> tuple[float, float]:
        """Read the database's clock. A pooled connection that turns out dead (its session ended:
        a restart, a failover) is retried once on a new one: SQLAlchemy has then dropped the
        pool's older connections, and a store that has no clock yet could do nothing else."""
        for retry in (True, False):
            try:
                with wrap_errors(self.kind, *self._errors), self.engine.connect() as conn:
                    sent = time.monotonic()
                    db_now = float(conn.execute(DB_CLOCK).scalar_one())
                    back = time.monotonic()
                break
            except StoreUnavailable as e:
                if not retry or not getattr(e.__cause__, "connection_invalidated", False):
                    raise
        self._clock_base = (db_now, (sent + back) / 2)
        return self._clock_base

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with wrap_errors(self.kind, *self._errors), self.engine.begin() as conn:
            yield conn

    _read = _write

    def _lock_schema(self, conn: Connection) -> None:
        conn.execute(SCHEMA_LOCK, {"space": SCHEMA_LOCK_SPACE})

    def _live(self, rows: Sequence[Row[Any]], now: float, conn: Connection) -> set[str]:
        held = {(r.hi, r.lo) for r in conn.execute(HELD_ADVISORY_LOCKS)}
        return {r.call_id for r in rows if key_halves(lock_key(r.call_id)) in held}

    def _live_swept(self, rows: Sequence[Row[Any]], now: float, conn: Connection) -> set[str]:
        """The rows whose lock a session holds, each lock asked by its key (:data:`LEASE_HELD_AMONG`),
        never ``pg_locks``' copy of every lock: the sweep read only the rows whose sweep hint
        lapsed, and a recovery claim asks one, so this costs as many probes as those rows however
        many leases the server holds. Each probe's shared lock lasts until the read (or the
        claim's transaction) ends: a ``begin`` of the call meanwhile finds it busy, and the call
        is republished."""
        keys = {lock_key(r.call_id): r.call_id for r in rows}
        held = conn.execute(LEASE_HELD_AMONG, {"keys": list(keys)}).scalars()
        return {keys[k] for k in held}

    def _apply(self, conn: Connection, writes: Writes, call_id: str, now: float) -> Any:
        """Send the writes and the ``COMMIT`` in one round trip (a psycopg pipeline): none of
        them returns anything the store reads. A connection whose pipeline failed is dropped,
        never handed out again in an aborted state."""
        try:
            with conn.connection.driver_connection.pipeline():  # type: ignore[union-attr]
                reply = super()._apply(conn, writes, call_id, now)
                conn.commit()
        except BaseException:
            conn.invalidate()
            raise
        return reply

    def register(self, call: CallSpec) -> None:
        """Register the call (see :meth:`SQLStore.register`): one autocommitted insert on the
        driver for a new call. A pooled connection that turns out dead (pinged only after
        :attr:`PING_IDLE_S` unused) is retried once on a new one: the insert is idempotent,
        and a call sent unregistered could not be recovered if its message were lost."""
        now = self.now()
        for retry in (True, False):
            try:
                with wrap_errors(self.kind, *self._errors):
                    if autocommit(self.engine.pool, self.engine.raw_connection(), INSERT_NEW_CALL.postgresql,
                                  INSERT_NEW_CALL.args(call_id=call.call_id, spec=dumps(call.__dict__),
                                                       now=now)) is not None:
                        return
                break
            except StoreUnavailable as e:
                if not retry or not isinstance(e.__cause__, CONNECTION_ERRORS):
                    raise
                # the pool dropped the connections opened before the failure: once more
        with self._write() as conn:  # a known call: keep what it stores, add what it lacks
            self._lock_call(conn, call, now)

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A write transaction on the driver (:class:`.pg_driver.Transaction`), one pipeline."""
        with wrap_errors(self.kind, *self._errors), transaction(self.engine.pool, self.engine.raw_connection()) as tx:
            yield tx

    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        """Decide a delivery on a free lease session (:meth:`LeaseSessions.transaction`: one
        statement if the call is as planned, else two round trips); when none is free, the lock
        is taken on a session and the row written on a pooled connection."""
        key, token = lock_key(call.call_id), token or new_token()

        def decide(tx: Any, row: Any, spec: CallSpec, got: bool, lease_token: str, now: float) -> tuple[Any, bool]:
            begun = self._decide_begin(tx, row, spec, got, worker, config, now, lease_token)
            return begun, isinstance(begun, Claimed)

        def fast(lease_token: str, now: float) -> tuple[Any, tuple[str, tuple[Any, ...]]] | None:
            # planned for a call's first delivery: never claimed, no result, this spec (for a
            # message as sent, ``lifecycle.spec_rank`` 2, which ``merge_spec`` always keeps, as
            # JSON text; else one with this name and key that it keeps); a call nobody
            # registered is registered with this spec first, as ``register`` would
            writes = self._begin_writes(CallState(), call, worker, config, now, lease_token)
            planned = self._planned(writes, call.call_id, now, True)
            if planned is None:
                return None
            self._remember(call)
            rank = spec_rank(call)
            spec = dumps(call.__dict__)
            expected = (spec if rank == 2 else None, call.name, call.idempotency_key, rank == 0,
                        None if rank == 2 else spec, now)
            return planned.reply, (BEGIN_PLANNED, (call.call_id, *expected, *planned.claimed, *planned.event))

        with wrap_errors(self.kind, *self._errors):
            on_session: BeginResult | None = self._sessions.transaction(key, token, call, self.now, decide, take=True,
                                                                       fast=fast)
            if on_session is not None:
                return on_session
            got, lease_token = self._sessions.try_lock(key, token)
        claimed = False
        try:
            with self._transaction() as tx:
                now = self.now()
                row, spec = tx.lock_call(call, now)
                begun = self._decide_begin(tx, row, spec, got, worker, config, now, lease_token)
            claimed = got and isinstance(begun, Claimed)
            return begun
        finally:
            if got and not claimed:
                self._sessions.unlock(key, lease_token)

    def _decide_begin(self, tx: Any, row: Any, spec: CallSpec, got: bool, worker: str, config: GuardConfig,
                      now: float, lease_token: str) -> BeginResult:
        """Plan a delivery of the locked call (``got``: whether this claim took its lock) and
        queue the writes on ``tx``."""
        result = _outcome(row.outcome)
        lapsed = lapsed_event(row, result, not got)
        state = call_state(row, result, not got, tx.event_data(lapsed) if lapsed else None)
        begun: BeginResult = apply(self._begin_writes(state, spec, worker, config, now, lease_token),
                                   tx.writer(row.call_id, now))
        if isinstance(begun, Claimed):
            self._remember(spec)
        return begun

    @staticmethod
    def _planned(writes: Writes, call_id: str, now: float, begin: bool) -> Planned | None:
        """``writes`` as the server-side function of ``begin`` (else ``finish``) takes them
        (:class:`.pg_driver.Planned`, with the plan's ``reply``), or None for writes it does
        not make."""
        if not Planned.takes(writes, begin):
            return None
        planned = Planned(call_id, now)
        planned.reply = apply(writes, planned)
        return planned

    #: How many calls' names :meth:`_remember` keeps (one per running call, in a worker).
    KNOWN_NAMES = 4096

    def _remember(self, spec: CallSpec) -> None:
        """Keep the name of a call this process claimed: its ``finish`` plans with it."""
        with self._names_lock:
            self._names[spec.call_id] = spec.name
            self._names.move_to_end(spec.call_id)
            while len(self._names) > self.KNOWN_NAMES:
                self._names.popitem(last=False)

    def _recall(self, call_id: str) -> str | None:
        with self._names_lock:
            return self._names.pop(call_id, None)

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig,
               copy: ResultCopy | None = None) -> FinishResult:
        """Record the outcome (:meth:`SQLStore.finish`). When a lease session of this process holds
        the lease, the transaction runs there (after any other thread's statement on it) and
        gives the lock back in the same step; else on a pooled connection."""
        name = self._recall(lease.call_id)
        result_row = self._result_row(copy) if outcome.ok else None
        sent: list[bool] = []  # the row went with the function's call, and nothing decided after it

        def decide(tx: Any, row: Any, spec: CallSpec, got: bool, lease_token: str, now: float) -> tuple[Any, bool]:
            sent.clear()  # the function wrote nothing
            finished, writes = _decide_finish(tx, row, spec, lease, outcome, config, now)
            if result_row is not None and isinstance(finished, Accepted) and writes.record is not None:
                statement, params = insert_result_row(result_row)
                tx.queue(statement, *params)
                sent.append(True)  # with the record's writes, before the COMMIT
            return finished, False

        def fast(lease_token: str, now: float) -> tuple[Any, tuple[str, tuple[Any, ...]]] | None:
            # planned for this attempt being the call's last, without a result
            if name is None:
                return None
            writes = plan_finish(CallState(lease.attempt), CallSpec(lease.call_id, name), lease, outcome, config)
            if not isinstance(writes.reply, Accepted):
                return None
            planned = self._planned(writes, lease.call_id, now, False)
            if planned is None:
                return None
            params = (lease.call_id, lease.attempt, name, *planned.recorded, *planned.event)
            if result_row is None:
                return planned.reply, (FINISH_PLANNED, params)
            statement, more = finish_planned_with_row(result_row)
            sent.append(True)
            return planned.reply, (statement, (*params, *more))

        with wrap_errors(self.kind, *self._errors):
            finished: FinishResult | None = self._sessions.transaction(
                lock_key(lease.call_id), lease.token, CallSpec(lease.call_id), self.now, decide, take=False,
                fast=fast)
        if finished is not None:
            if sent and copy is not None:
                copy.written = True
            return finished
        return super().finish(lease, outcome, config)

    def _result_row(self, copy: ResultCopy | None) -> ResultRow | None:
        """Celery's result row of ``copy``, if it goes to this store's database (the same host,
        port, database and user) and its table there has each of the row's columns (a table
        another Celery version created may lack some: Celery then writes, and fails, alone).
        A table's columns are looked up once; a missing table again after
        :attr:`RESULT_TABLE_RECHECK_S` (Celery creates its tables at its first write)."""
        row = copy.row if copy is not None else None
        if row is None or row.database != ResultRow.database_of(self.engine.url):
            return None
        known = self._result_tables.get(row.table)
        if known is None or (not known[0] and time.monotonic() - known[1] > self.RESULT_TABLE_RECHECK_S):
            with self._read() as conn:
                names = conn.execute(sa.text(
                    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:name) AND attnum > 0"
                    " AND NOT attisdropped"), {"name": quoted_name(*row.table)}).scalars()
                known = self._result_tables[row.table] = (frozenset(names), time.monotonic())
        columns = known[0]
        wanted = [name for name, _, _ in row.columns] + ([row.id[0]] if row.id is not None else [])
        return row if columns and columns.issuperset(wanted) else None

    #: How long a result table found missing is taken as missing before it is looked up again.
    RESULT_TABLE_RECHECK_S = 30.0

    def _finish(self, lease: Lease, outcome: Outcome, config: GuardConfig) -> FinishResult:
        with self._transaction() as tx:
            now = self.now()
            row, spec = tx.lock_call(CallSpec(lease.call_id), now)
            finished: FinishResult = _decide_finish(tx, row, spec, lease, outcome, config, now)[0]
            return finished

    def _let_go(self, lease: Lease) -> None:
        self._sessions.unlock(lock_key(lease.call_id), lease.token)

    def lease_backend_pid(self, lease: Lease) -> int | None:
        """The server process whose session holds ``lease`` (for operators and fault tests)."""
        pid = lease.token.partition(".")[0]
        return int(pid) if pid.isdigit() else None

    def renew(self, lease: Lease) -> bool:
        """Check that the lease's session is alive and still holds the lock (no TTL to extend),
        and move the row's sweep hint on (``lifecycle.sweep_hint``) in the same statement."""
        key = lock_key(lease.call_id)
        if self._sessions.holder(key, lease.token) is not None:
            # planned for the lease holding the call: the statement writes it only while it does
            renewal = plan_renew(lease, True).renew
            assert renewal is not None
            with wrap_errors(self.kind, *self._errors):
                held = self._sessions.holds(key, lease.call_id, lease.token, sweep_hint(renewal, self.now()))
            if held is not None:
                return held
        pid = self.lease_backend_pid(lease)
        if pid is None:
            return False
        # held by another instance (or by a session of ours that ended): look its session up
        # in pg_locks by the pid in the token
        hi, lo = key_halves(key)
        params = {"hi": hi, "lo": lo, "pid": pid, "call_id": lease.call_id, "token": lease.token}
        with self._read() as conn:
            return bool(conn.execute(LEASE_STILL_HELD, params).one().held)

    def close(self) -> None:
        self._sessions.close()
        self.engine.dispose()
