"""The PostgreSQL store: the spec's semantics, a lease bound to a database session.

A lease is a session-level advisory lock, ``pg_try_advisory_lock(key)`` with
``key`` a stable 64-bit hash of the call id, taken on a connection dedicated
to that lease: it leaves the pool at ``begin`` and goes back only at
``finish``, ``release`` or ``fenced``. The lease therefore has no TTL:

* a worker that dies, or whose connection is cut or terminated, loses its
  session, so the lock frees at once and the next delivery claims attempt
  n+1 (or is refused, as the call's delivery policy says);
* a worker that is frozen but still connected keeps the lease: nobody takes
  over, so there is no duplicate, and no progress until it resumes or its
  connection dies.

To evict frozen or unreachable workers, bound how long a dead connection can
look alive:

* TCP keepalives are on by default (``keepalives=1``, ``keepalives_idle=10``,
  ``keepalives_interval=5``, ``keepalives_count=3``, ``tcp_user_timeout=30000``):
  a vanished peer is noticed in about 30 s by both sides. Override them with
  ``connect_args``.
* ``idle_session_timeout_s`` sets the server's ``idle_session_timeout`` for the
  store's sessions (PostgreSQL 14+): a holder that stops heartbeating (each
  ``renew`` runs a query on the lease's connection) is disconnected after that
  long, and its lease freed. Keep it well above the guard's ``heartbeat_s``.

Attempt numbers, results and events live in the tables of :mod:`.sql`, written
under ``SELECT ... FOR UPDATE``, so the attempt number is a real fence.

Session locks do not survive a transaction-pooling proxy (PgBouncer in
``transaction`` mode, Supavisor on 6543): the lock stays on a server connection
that other clients then borrow. The store refuses to run when it sees its
session change between transactions (:func:`check_session_pinned`, at open and
at every claim) and raises :class:`~aaa_celery.errors.UnsafeDeployment`.
Connect directly, or through a session-mode pool.

Open the store after forking (Celery's ``worker_process_init``): connections
cannot cross a fork. The advisory lock keys share the database's one key space
with any other advisory locks that an application takes.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Row

from ...config import GuardConfig
from ...errors import ConfigError, StoreUnavailable, UnsafeDeployment
from ...lifecycle import BeginResult, CallSpec, Claimed, Lease
from ..base import new_token, wrap_errors
from .runs import SQLRuns
from .schema import metadata
from .store import SQLStore

_DRIVER_ERRORS = (exc.OperationalError, exc.InterfaceError)

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

#: Try to take a call's lease on this session; also says which backend answered.
TRY_LEASE_LOCK = sa.text("SELECT pg_try_advisory_lock(:key) AS got, pg_backend_pid() AS pid")

#: Give a call's lease back (this session's lock on ``key``).
RELEASE_LEASE_LOCK = sa.text("SELECT pg_advisory_unlock(:key)")

#: The server process behind this connection.
BACKEND_PID = sa.text("SELECT pg_backend_pid()")

#: Does backend ``pid`` (this session's if NULL) hold the lease lock of the call, and does
#: the call's row still name ``token`` as its lease?
LEASE_STILL_HELD = sa.text(
    """
    SELECT EXISTS (
             SELECT 1 FROM pg_locks
              WHERE locktype = 'advisory' AND granted AND objsubid = 1
                AND classid::bigint = :hi AND objid::bigint = :lo
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND pid = COALESCE(CAST(:pid AS integer), pg_backend_pid()))
       AND EXISTS (SELECT 1 FROM aaa_calls WHERE call_id = :call_id AND lease_token = :token)
    """
)

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

_SELECT_BACKEND_PID = sa.func.pg_backend_pid().label("backend_pid")


def lock_key(call_id: str) -> int:
    """The advisory lock key of a call: a stable signed 64-bit hash of its id."""
    return int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=8).digest(), "big", signed=True)


def key_halves(key: int) -> tuple[int, int]:
    """How ``pg_locks`` shows a bigint advisory key: (``classid``, ``objid``)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def check_session_pinned(conn: Connection, probes: int = 3) -> None:
    """Raise UnsafeDeployment if ``conn``'s server session changes between transactions.

    A transaction-pooling proxy hands each transaction to any server connection,
    so the backend pid moves; session-level advisory locks cannot work there.
    The check is best effort: an idle proxy may hand back the same server
    connection, which is why :meth:`PostgresStore.begin` repeats it at each claim.
    """
    pids = []
    for _ in range(probes):
        pids.append(conn.execute(BACKEND_PID).scalar_one())
        conn.commit()
    if len(set(pids)) > 1:
        raise _pooled(pids)


def _pooled(pids: Sequence[int]) -> UnsafeDeployment:
    return UnsafeDeployment(
        "postgresql store: the database session changed between transactions on one connection "
        f"(backend pids {sorted(set(pids))}). This is a transaction-pooling proxy (e.g. PgBouncer "
        "pool_mode=transaction): the session-level advisory locks that hold leases break there. "
        "Connect to PostgreSQL directly or through a session-mode pool.",
        pids=list(pids),
    )


@dataclass
class _Held:
    """The dedicated connection holding one lease, and a lock for its users
    (the heartbeat thread renews while the task thread finishes)."""

    conn: Connection
    key: int
    lock: threading.Lock = field(default_factory=threading.Lock)


def _engine_url(url: str) -> sa.URL:
    return sa.make_url(url).set(drivername="postgresql+psycopg")


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
    ) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError as e:
            raise ConfigError(
                "the postgresql store needs the psycopg 3 driver: pip install aaa_celery[postgres]"
            ) from e
        self.url = url
        args = {**DEFAULT_CONNECT_ARGS, **(connect_args or {})}
        if idle_session_timeout_s is not None:
            timeout_ms = int(idle_session_timeout_s * 1000)
            args["options"] = f"{args.get('options', '')} -c idle_session_timeout={timeout_ms}".strip()
        options = {"pool_pre_ping": True, "pool_size": 5, "max_overflow": -1, **(engine_options or {})}
        self._clock_base: tuple[float, float] | None = None
        super().__init__(sa.create_engine(_engine_url(url), connect_args=args, **options), clock or self._db_clock)
        self._held: dict[str, _Held] = {}
        self._held_lock = threading.Lock()
        with wrap_errors(self.kind, *_DRIVER_ERRORS):
            with self.engine.connect() as conn:
                check_session_pinned(conn)
            with self.engine.begin() as conn:
                conn.execute(SCHEMA_LOCK, {"space": SCHEMA_LOCK_SPACE})
                metadata.create_all(conn)

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
        with wrap_errors(self.kind, *_DRIVER_ERRORS), self.engine.connect() as conn:
            sent = time.monotonic()
            db_now = float(conn.execute(DB_CLOCK).scalar_one())
            back = time.monotonic()
        self._clock_base = (db_now, (sent + back) / 2)
        return self._clock_base

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with wrap_errors(self.kind, *_DRIVER_ERRORS), self.engine.begin() as conn:
            yield conn

    _read = _write

    def _live(self, rows: Sequence[Row[Any]], now: float, conn: Connection) -> set[str]:
        held = {(r.hi, r.lo) for r in conn.execute(HELD_ADVISORY_LOCKS)}
        return {r.call_id for r in rows if key_halves(lock_key(r.call_id)) in held}

    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        key = lock_key(call.call_id)
        got = claimed = False
        with wrap_errors(self.kind, *_DRIVER_ERRORS):
            conn = self.engine.connect()
            try:
                got, pid = conn.execute(TRY_LEASE_LOCK, {"key": key}).one()
                conn.commit()
                with conn.begin():
                    now = self.now()
                    row, spec = self._lock_call(conn, call, now, _SELECT_BACKEND_PID)
                    if got and row.backend_pid != pid:
                        raise _pooled([pid, row.backend_pid])
                    lease_token = f"{pid}.{token or new_token()}"
                    result = self._begin(conn, row, spec, worker, config, now, not got, lease_token)
                claimed = got and isinstance(result, Claimed)
                if claimed:
                    with self._held_lock:
                        self._held[lease_token] = _Held(conn, key)
                return result
            finally:
                if not claimed:
                    self._close(conn, key if got else None)

    def _close(self, conn: Connection, key: int | None) -> None:
        """Unlock ``key`` (if given) and return the connection; a broken one is dropped."""
        try:
            if key is not None:
                conn.execute(RELEASE_LEASE_LOCK, {"key": key})
                conn.commit()
        except exc.DBAPIError:
            conn.invalidate()  # its session is gone, and the lock with it
        finally:
            conn.close()

    def _let_go(self, lease: Lease) -> None:
        with self._held_lock:
            held = self._held.pop(lease.token, None)
        if held is not None:
            with held.lock:
                self._close(held.conn, held.key)

    def lease_backend_pid(self, lease: Lease) -> int | None:
        """The server process whose session holds ``lease`` (for operators and fault tests)."""
        pid = lease.token.partition(".")[0]
        return int(pid) if pid.isdigit() else None

    def renew(self, lease: Lease) -> bool:
        """Check that the lease's session is alive and still holds the lock (no TTL to extend)."""
        hi, lo = key_halves(lock_key(lease.call_id))
        params = {"hi": hi, "lo": lo, "pid": None, "call_id": lease.call_id, "token": lease.token}
        with self._held_lock:
            held = self._held.get(lease.token)
        if held is None:  # held by another instance: look its session up by the pid in the token
            params["pid"] = self.lease_backend_pid(lease)
            if params["pid"] is None:
                return False
            with self._read() as conn:
                return bool(conn.execute(LEASE_STILL_HELD, params).scalar_one())
        with held.lock:
            try:
                alive = bool(held.conn.execute(LEASE_STILL_HELD, params).scalar_one())
                held.conn.commit()
                return alive
            except exc.DBAPIError:
                pass
        with self._held_lock:  # the session died, and its lock with it
            self._held.pop(lease.token, None)
        with held.lock:
            held.conn.invalidate()
            held.conn.close()
        return False

    def close(self) -> None:
        with self._held_lock:
            tokens = list(self._held)
        for token in tokens:
            held = self._held.pop(token)
            with held.lock:
                self._close(held.conn, held.key)
        self.engine.dispose()
