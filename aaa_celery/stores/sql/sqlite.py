"""The SQLite store: a durable default for the processes of one machine.

Leases are TTL leases, like Redis: a lease is live while its ``lease_expires_at``
is ahead of the store's clock (:func:`machine_clock`, or an injected ``clock``).
Every process of the machine reads the same clock: the kernel's, not the process's
own wall clock, which libfaketime or a container's time namespace may shift.

Several processes may share one database file. Each connection runs in WAL
mode (readers never block the writer) with a ``busy_timeout``, and every write
transaction starts with ``BEGIN IMMEDIATE``: it takes the database's write lock
before it reads, so a read-decide-write cannot interleave with another. This is
SQLAlchemy's documented pysqlite recipe: turn off the driver's own transaction
handling on connect, and emit ``BEGIN`` ourselves on begin.

``sqlite://`` (in memory) lives in one process; its one connection is shared
under a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Row
from sqlalchemy.pool import StaticPool

from ...config import GuardConfig
from ...lifecycle import BeginResult, CallSpec, lapsed
from ..base import new_token, wrap_errors
from .runs import SQLRuns
from . import versions
from .store import SQLStore

#: The execution option that marks a read-only transaction (a plain, deferred ``BEGIN``).
_READ = "aaa_read_only"


def _configure(engine: sa.Engine, busy_timeout_s: float) -> None:
    """WAL, busy_timeout and ``BEGIN IMMEDIATE`` for writes, on every connection."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ) else "BEGIN IMMEDIATE")


#: How far (seconds) a process's wall clock may be from the kernel's boot time plus its
#: uptime before :func:`machine_clock` judges time on the latter (whose resolution is 1 s).
MACHINE_CLOCK_TOLERANCE_S = 1.0


def _boot_time() -> float | None:
    """The machine's boot time (Linux ``/proc/stat`` ``btime``, whole seconds), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


_BOOT = _boot_time()


def machine_clock() -> float:
    """The one clock of the machine's processes (seconds since the epoch): ``time.time()``
    while it is within :data:`MACHINE_CLOCK_TOLERANCE_S` of the kernel's boot time plus
    ``CLOCK_BOOTTIME``, else that sum, which no process's own wall clock shifts. So two
    processes of one machine judge a lease within a second of each other whatever their
    own clocks say. Elsewhere than Linux: ``time.time()``."""
    wall = time.time()
    if _BOOT is None:
        return wall
    kernel = _BOOT + time.clock_gettime(time.CLOCK_BOOTTIME)
    return wall if abs(wall - kernel) <= MACHINE_CLOCK_TOLERANCE_S else kernel


class SQLiteStore(SQLRuns, SQLStore):
    """A store in an SQLite file (``sqlite:///path``), with TTL leases.

    Args:
        url: ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite://`` (memory).
        clock: the store's clock in seconds (default :func:`machine_clock`); inject one in tests.
        busy_timeout_s: seconds a writer waits for another process's write lock
            before the store reports :class:`~aaa_celery.errors.StoreUnavailable`.
        create_schema: create the tables of an empty database at open (the default);
            ``False`` opens it as it is (``celery aaa migrate --check`` only reads).
    """

    kind = "sqlite"
    ttl_leases = True
    insert = staticmethod(sqlite.insert)

    def __init__(
        self,
        url: str = "sqlite://",
        *,
        clock: Callable[[], float] = machine_clock,
        busy_timeout_s: float = 30.0,
        create_schema: bool = True,
    ) -> None:
        self.url = url
        in_memory = sa.make_url(url).database in (None, "", ":memory:")
        options: dict[str, Any] = {}
        if in_memory:
            options = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        engine = sa.create_engine(url, **options)
        _configure(engine, busy_timeout_s)
        super().__init__(engine, clock)
        self._reader = engine.execution_options(**{_READ: True})
        self._guard: Any = threading.RLock() if in_memory else nullcontext()
        if create_schema:
            with self._write() as conn:
                versions.prepare(conn)

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._guard, wrap_errors(self.kind, exc.OperationalError), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._guard, wrap_errors(self.kind, exc.OperationalError), self._reader.begin() as conn:
            yield conn

    def _live(self, rows: Sequence[Row[Any]], now: float, conn: Connection) -> set[str]:
        return {r.call_id for r in rows if r.lease_token is not None and not lapsed(r.lease_expires_at, now)}

    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        with self._write() as conn:
            now = self.now()
            row, spec = self._lock_call(conn, call, now)
            state = self._state(conn, row, bool(self._live([row], now, conn)))
            writes = self._begin_writes(state, spec, worker, config, now, token or new_token())
            begun: BeginResult = self._apply(conn, writes, row.call_id, now)
            return begun

    def close(self) -> None:
        self.engine.dispose()
