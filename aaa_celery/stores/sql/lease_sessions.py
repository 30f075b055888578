"""The PostgreSQL store's lease sessions: where a lease is a session-level advisory lock.

A lease is ``pg_try_advisory_lock(key)``, ``key`` a stable 64-bit hash of the call id
(:func:`lock_key`), taken on one of the store's few lease sessions (:class:`LeaseSessions`
says which), where it stays; ``begin`` and ``finish`` run there too
(:meth:`LeaseSession.transaction`). Every statement on a session also returns
``pg_backend_pid()``: a session that changes under one connection is a transaction-pooling
proxy (:func:`check_session_pinned`), refused with :class:`~aaa_celery.errors.UnsafeDeployment`.
:mod:`.postgres` says what the store does with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...errors import UnsafeDeployment
from ...lifecycle import CallSpec
from .pg_driver import (
    CONNECTION_ERRORS,
    RELEASE_LEASE_LOCK,
    RENEW_OWN_LEASE,
    SESSION_PID,
    TRY_LEASE_LOCK,
    UNDEFINED_FUNCTION,
    Transaction,
    fetch_prepared,
)
from .statements import RENEW_LEASE

#: The server process behind this connection.
BACKEND_PID = sa.text("SELECT pg_backend_pid()")


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


#: How a transaction on the lease session plans: ``(tx, row, spec, got, lease_token, now)`` to
#: (the reply, whether the session keeps the lock); the writes are queued on ``tx``.
Decide = Callable[[Any, Any, CallSpec, bool, str, float], tuple[Any, bool]]

#: How an operation plans for the state it expects the call in: ``(lease_token, now)`` to (the
#: reply, and the server-side function's call that compares the row with that state and makes
#: the writes: its statement and its parameters after the lock key), or None if it has no such
#: plan.
Plan = Callable[[str, float], tuple[Any, tuple[str, tuple[Any, ...]]] | None]


class LeaseSession:
    """One lease session (of :class:`LeaseSessions`): an autocommit connection kept out of the pool.

    A claim costs one statement here (no connection opened per call; with
    :meth:`transaction`, none of its own: it rides in the claim's first query) and N running
    calls need a few server backends, not N. Threads take turns on it (:attr:`lock`); one
    that finds it busy tries another session. The keys it holds are kept in :attr:`keys`
    (key -> lease token): advisory locks are re-entrant within a session, so a second
    delivery of a running call in the same process must read as busy (:attr:`held`) before
    the server would grant the lock a second time. A session that fails is dropped with
    every lock it held; the next claim opens another.
    """

    def __init__(self, engine: sa.Engine, errors: tuple[type[BaseException], ...], held: Callable[[int], bool]) -> None:
        self.engine = engine
        #: Whether any lease session of the store holds a key (:meth:`LeaseSessions.held`).
        self.held = held
        #: What a failed statement on the session raises (SQLAlchemy's or the driver's errors).
        self.errors = errors
        self.lock = threading.Lock()
        self.conn: Connection | None = None
        self.pid: int | None = None
        self.keys: dict[int, str] = {}
        #: Whether :meth:`_fast` may call the server-side functions (False: this session found
        #: the database without them).
        self.planned = True

    def _open(self) -> Connection:
        if self.conn is None:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                self.pid = conn.execute(BACKEND_PID).scalar_one()
            except BaseException:
                conn.invalidate()
                conn.close()
                raise
            self.conn = conn
        return self.conn

    def _driver(self) -> Any:
        """The session's psycopg connection (opened if needed)."""
        return self._open().connection.driver_connection

    def _drop(self) -> None:
        """Forget the session (broken, or its server session ended): its locks are gone."""
        conn, self.conn, self.pid = self.conn, None, None
        self.keys.clear()
        self.planned = True
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self, statement: str, params: tuple[Any, ...]) -> Any:
        """Run one statement of :mod:`.pg_driver` that also returns the backend pid, on the
        driver (prepared); check the session did not move; return its answer."""
        row = fetch_prepared(self._driver(), statement, params)
        assert row is not None
        self._check(row[1])
        return row[0]

    def try_lock(self, key: int, token: str) -> tuple[bool, str]:
        """Take ``key`` if no session holds it: (got it, the lease token ``<pid>.<token>``,
        with this session's backend pid). A key this session holds already is busy."""
        with self.lock:
            if self.held(key):  # held by this process, if the session still lives
                try:
                    self._run(SESSION_PID, ())
                    return False, f"{self.pid}.{token}"
                except self.errors:
                    self._drop()
            for retry in (True, False):
                try:
                    got = self._run(TRY_LEASE_LOCK, (key,))
                    break
                except self.errors:
                    self._drop()  # a failed session held no lock of ours any more: retry once on a new one
                    if not retry:
                        raise
            lease_token = f"{self.pid}.{token}"
            if got:
                self.keys[key] = lease_token
            return bool(got), lease_token

    def transaction(self, key: int, token: str, call: CallSpec, clock: Callable[[], float], decide: Decide, *,
                    take: bool, fast: Plan | None = None) -> Any:
        """One operation's write transaction on this session: a begin's only if the session is
        free (else None: the caller tries another session or a pooled connection, so that
        threads do not queue here); a finish waits for it.

        ``take`` (``begin``): try the lock of ``key`` in the transaction's first query, as
        ``SELECT pg_try_advisory_lock(key), pg_backend_pid(); BEGIN; SELECT ... FOR UPDATE``;
        the writes ``decide`` queues go with the ``COMMIT``, and with them the unlock of a lock
        not kept. Else (``finish``): only if this session holds ``key`` for ``token``; the
        transaction's ``COMMIT`` query gives the lock back. Two round trips.

        A session that fails is dropped (its locks with it), retried once if it failed at
        the first query (which writes nothing). Any other failure rolls back and gives back
        the lock, except a finish's lock when the store is unreachable (``SQLStore.finish``'s
        rule: the lease lives on while the caller retries).

        ``fast`` first tries the operation in one round trip (:meth:`_fast`): only if that
        finds the call in another state than ``fast`` planned for does the transaction
        above run (the lock a begin took there kept)."""
        # A finish waits: on a pooled connection it would take two round trips more and then
        # wait for this session all the same, to give the lock back.
        if not self.lock.acquire(blocking=not take):
            return None
        try:
            if not take and self.keys.get(key) != token:
                return None
            now, got = clock(), None
            if fast is not None and not (take and self.held(key)):
                tried = self._fast(key, token, call.call_id, now, take, fast)
                if tried is not None:
                    ok, reply, got = tried
                    if ok:
                        return reply
            return self._transaction(key, token, call, now, decide, take, got if take else None)
        finally:
            self.lock.release()

    def _fast(self, key: int, token: str, call_id: str, now: float, take: bool,
              fast: Plan) -> tuple[bool, Any, bool] | None:
        """The operation as one statement, the function of :mod:`.pg_functions` given what ``fast``
        planned: (whether it matched, the plan's reply, whether a begin's lock was granted), or None if
        ``fast`` has no plan to send this way, the database lacks the functions (not migrated
        to ``0004``: remembered for this session), or the session failed (dropped, with its
        locks: the transaction runs on a new one; a claim that landed is claimed again by its
        token)."""
        if not self.planned:
            return None
        try:
            driver = self._driver()
        except BaseException:
            self._drop()
            return None
        lease_token = f"{self.pid}.{token}" if take else token
        planned = fast(lease_token, now)
        if planned is None:
            return None
        reply, (statement, params) = planned
        try:
            row = fetch_prepared(driver, statement, (key, *params))
            assert row is not None  # a function's call: one row
        except UNDEFINED_FUNCTION:
            self.planned = False  # autocommitted: the failed statement took no lock
            return None
        except BaseException as e:
            if self._broken(e):
                self._drop()
                return None
            self._failed(e, key, take, took=take)
            raise
        granted, ok, pid = row if take else (None, *row)
        self._check(pid)
        if ok and take:
            self.keys[key] = lease_token
        elif ok:
            self.keys.pop(key, None)
        return bool(ok), reply, bool(granted)

    def _transaction(self, key: int, token: str, call: CallSpec, now: float, decide: Decide, take: bool,
                     got: bool | None) -> Any:
        """:meth:`transaction`'s two round trips; ``got``: whether a begin holds the lock
        already (None: take it in the first query)."""
        for retry in (True, False):
            here = take and self.held(key)  # a begin of a call this process holds: busy, no lock taken
            first = None if not take or got is not None else (SESSION_PID, ()) if here else (TRY_LEASE_LOCK, (key,))
            try:
                tx = Transaction(self._driver(), first)
                row, spec = tx.lock_call(call, now)
                break
            except BaseException as e:
                if self._broken(e) and retry:
                    self._drop()  # a failed session held no lock of ours any more: once more on a new one
                    got = None
                    continue
                # the lock may have been granted (or was, before this transaction)
                self._failed(e, key, take, took=take and not here if got is None else got)
                raise
        if first is not None:
            answer, pid = tx.first
            self._check(pid)
        if got is None:
            got = take and not here and bool(answer)
        lease_token = f"{self.pid}.{token}" if take else token
        try:
            reply, keep = decide(tx, row, spec, got, lease_token, now)
            # a finish lets go of a lock still held (not if its session ended, and a new one took over)
            let_go = got and not keep or not take and key in self.keys
            unlocked = tx.commit((RELEASE_LEASE_LOCK, (key,)) if let_go else None)
        except BaseException as e:
            self._failed(e, key, take, took=got)
            raise
        if let_go:
            self._check(unlocked[1])
            if not take:
                self.keys.pop(key, None)
        elif got:
            self.keys[key] = lease_token
        return reply

    def _failed(self, error: BaseException, key: int, take: bool, took: bool) -> None:
        """After a failed transaction: roll back, and give the lock of ``key`` back if a begin
        ``took`` it, or if a finish failed otherwise than by the store being unreachable."""
        release = took if take else not isinstance(error, CONNECTION_ERRORS)
        self._abort(key if release else None)
        if release and not take:
            self.keys.pop(key, None)

    def _broken(self, error: BaseException | None = None) -> bool:
        """Whether the session's connection is gone: libpq says so, or ``error`` is psycopg's
        finding that the connection's socket was closed (before libpq has noticed)."""
        conn = self.conn
        driver = None if conn is None else conn.connection.driver_connection
        if isinstance(error, CONNECTION_ERRORS) and str(error) == "connection socket closed":
            return True
        return driver is None or bool(driver.broken or driver.closed)

    def _check(self, pid: int) -> None:
        """Refuse a session that moved (a transaction-pooling proxy)."""
        if pid != self.pid:
            pids = [self.pid or 0, pid]
            self._drop()
            raise _pooled(pids)

    def _abort(self, key: int | None) -> None:
        """Roll the session's transaction back and give ``key`` back (if not None and held);
        a session that cannot is dropped, with its locks."""
        if self._broken():
            self._drop()
            return
        try:
            self._driver().execute("ROLLBACK")
            if key is not None:
                self._run(RELEASE_LEASE_LOCK, (key,))
        except BaseException:
            self._drop()

    def unlock(self, key: int, token: str) -> None:
        """Give ``key`` back if this session holds it for ``token``."""
        with self.lock:
            if self.keys.get(key) != token:
                return  # not ours, or gone with a session that ended
            del self.keys[key]
            try:
                self._run(RELEASE_LEASE_LOCK, (key,))
            except self.errors:
                self._drop()  # its session is gone, and the lock with it

    def holds(self, key: int, call_id: str, token: str, hint: float) -> bool:
        """Whether this session still holds ``key`` for ``token``, and the call's row still
        names ``token``: the session answers (with its pid, :data:`.pg_driver.RENEW_OWN_LEASE`),
        and moves the row's sweep hint on to ``hint`` if it does."""
        with self.lock:
            if self.keys.get(key) != token:
                return False
            try:
                renew = RENEW_LEASE.args(hint=hint, call_id=call_id, token=token)
                return bool(self._run(RENEW_OWN_LEASE, (*renew, call_id, token, call_id, token)))
            except self.errors:
                self._drop()
                return False

    def close(self) -> None:
        """End the session, which frees every lock it holds."""
        with self.lock:
            self._drop()


class LeaseSessions:
    """The store's few lease sessions (:class:`LeaseSession`), over which its leases spread.

    PostgreSQL walks a backend's whole local lock table at the end of every transaction, so a
    statement on a session costs more the more advisory locks it holds (a prepared ``SELECT 1``:
    61 us with none, 378 us with 10,000), and threads that share one session queue on it. A new
    claim goes to the first session that is free now and holds fewer than :attr:`CAP` leases;
    when none is, another session is opened, up to ``most``; past that, the least loaded free
    one takes it. Only when all are busy and there are ``most`` does it take the pooled path
    (counted in :attr:`fallbacks`). A one-thread process (a prefork child) keeps using its
    first session until that holds :attr:`CAP`.

    A lease stays on the session that took it: ``finish``, ``renew`` and the unlock find that
    session by the key it holds for the lease's token (at most ``most`` dictionaries looked
    at; a dropped session forgot only its own keys). A key held by any session of the store
    reads as busy on every one (:meth:`held`): the server refuses a key another session holds.
    """

    #: How many leases a session takes before new claims go to another one.
    CAP = 1000

    def __init__(self, engine: sa.Engine, errors: tuple[type[BaseException], ...], most: int) -> None:
        self.engine, self.errors, self.most = engine, errors, most
        self.sessions: list[LeaseSession] = [self._new()]
        self._grow = threading.Lock()
        #: How many ``begin`` calls found no free session, and ``finish`` calls no session
        #: holding their lease, and took the pooled path.
        self.fallbacks = 0

    def _new(self) -> LeaseSession:
        return LeaseSession(self.engine, self.errors, self.held)

    def held(self, key: int) -> bool:
        """Whether any session of the store holds ``key``."""
        return any(key in s.keys for s in self.sessions)

    def holder(self, key: int, token: str) -> LeaseSession | None:
        """The session that holds ``key`` for ``token``, if any."""
        for s in self.sessions:
            if s.keys.get(key) == token:
                return s
        return None

    def _opened(self) -> LeaseSession | None:
        """A new session, if fewer than ``most`` are open."""
        with self._grow:
            if len(self.sessions) >= self.most:
                return None
            session = self._new()
            self.sessions = [*self.sessions, session]
            return session

    def transaction(self, key: int, token: str, call: CallSpec, clock: Callable[[], float], decide: Decide, *,
                    take: bool, fast: Plan | None = None) -> Any:
        """:meth:`LeaseSession.transaction` on the session that holds the lease (``finish``,
        waiting for it), or (``begin``) on a free one under :attr:`CAP`, else a new one, else
        the least loaded free one; None when there is none (the caller takes the pooled path)."""
        for session in self._claimable() if take else filter(None, [self.holder(key, token)]):
            done = session.transaction(key, token, call, clock, decide, take=take, fast=fast)
            if done is not None:
                return done
        self.fallbacks += 1
        return None

    def _claimable(self) -> Iterator[LeaseSession]:
        """The sessions a claim tries, in turn: those under :attr:`CAP`, a new one, then (over
        the cap with every session open) all, the least loaded first."""
        yield from (s for s in self.sessions if len(s.keys) < self.CAP)
        session = self._opened()
        if session is not None:
            yield session
        yield from sorted(self.sessions, key=lambda s: len(s.keys))

    def try_lock(self, key: int, token: str) -> tuple[bool, str]:
        """:meth:`LeaseSession.try_lock` on the session holding the fewest leases (waiting for it)."""
        return min(self.sessions, key=lambda s: len(s.keys)).try_lock(key, token)

    def unlock(self, key: int, token: str) -> None:
        session = self.holder(key, token)
        if session is not None:
            session.unlock(key, token)

    def holds(self, key: int, call_id: str, token: str, hint: float) -> bool | None:
        """:meth:`LeaseSession.holds` on the session holding ``key`` for ``token`` (None: none does)."""
        session = self.holder(key, token)
        return None if session is None else session.holds(key, call_id, token, hint)

    def close(self) -> None:
        """End every session, which frees every lock they hold."""
        for session in self.sessions:
            session.close()
