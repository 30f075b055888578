"""What the SQL stores share: the tables, every statement by name, and the logic.

:class:`SQLStore` reads a call's row under a row lock inside a write
transaction, asks :mod:`aaa_celery.lifecycle` for the writes of the operation,
and applies them (through :mod:`._writes`, the step it shares with the memory
store) before it commits. The two backends differ only in what makes a lease
live: a TTL column for SQLite (:mod:`.sqlite`), a session-level advisory lock
on a dedicated connection for PostgreSQL (:mod:`.postgres`).

Tables:

``aaa_calls``
    One row a call: its spec (how to republish it), the attempt counter (the
    fence), when it was registered, the current lease (token, worker, attempt,
    expiry) and until when its recovery is claimed.
``aaa_results``
    The one result of a call, ever: ``call_id`` is the primary key.
``aaa_events``
    The audit trail; ``id`` orders it and ``event_id`` makes each event unique.
``aaa_recoveries``
    How often recovery republished a call (``tries``) since its attempt count was
    ``attempts``: a claim counts an attempt, which restarts the count.
``aaa_checkpoints``
    The last checkpoint a tool saved for a call (``ctx.checkpoint``), for its next attempt.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from ..config import GuardConfig
from ..errors import StoreUnavailable
from ..lifecycle import (
    BeginResult,
    CallSpec,
    FENCED,
    CallState,
    Checkpoint,
    Draft,
    Event,
    FinishResult,
    Lease,
    Outcome,
    Writes,
    joined,
    event_id,
    merge_spec,
    plan_begin,
    plan_fenced,
    plan_finish,
    plan_hand_on,
    plan_release,
)
from ._writes import CallWriter, apply
from .base import Store, plan_abandon, recovery_hold
from .budgets import admits, check_spend, window_of
from .ops import RESOLVED, CallRecord, plan_resolve

metadata = sa.MetaData()

calls = sa.Table(
    "aaa_calls",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("registered_at", sa.Double, nullable=False),
    sa.Column("lease_token", sa.String),
    sa.Column("lease_worker", sa.String),
    sa.Column("lease_attempt", sa.Integer),
    sa.Column("lease_expires_at", sa.Double),
    sa.Column("recovery_until", sa.Double, nullable=False, default=0.0),
    sa.Column("handed_on", sa.Integer, nullable=False, default=0),
    sa.Column("handed", sa.Integer, nullable=False, default=0),
)

results = sa.Table(
    "aaa_results",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("outcome", sa.JSON, nullable=False),
    sa.Column("recorded_at", sa.Double, nullable=False),
)

events = sa.Table(
    "aaa_events",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.String, nullable=False, unique=True),
    sa.Column("call_id", sa.String, nullable=False, index=True),
    sa.Column("type", sa.String, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
)

budgets = sa.Table(
    "aaa_budgets",
    metadata,
    sa.Column("budget_key", sa.String, primary_key=True),
    sa.Column("window_no", sa.BigInteger, nullable=False),
    sa.Column("total", sa.Double, nullable=False),
)

budget_tokens = sa.Table(
    "aaa_budget_tokens",
    metadata,
    sa.Column("budget_key", sa.String, primary_key=True),
    sa.Column("token", sa.String, primary_key=True),
)

recoveries = sa.Table(
    "aaa_recoveries",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("tries", sa.Integer, nullable=False),
)

checkpoints = sa.Table(
    "aaa_checkpoints",
    metadata,
    sa.Column("call_id", sa.String, primary_key=True),
    sa.Column("checkpoint", sa.Text, nullable=False),
    sa.Column("saved_at", sa.Double, nullable=False),
)

#: ``insert`` of a dialect that has ``on_conflict_do_nothing`` (postgresql, sqlite).
Insert = Callable[[sa.Table], Any]

_NO_LEASE = {"lease_token": None, "lease_worker": None, "lease_attempt": None, "lease_expires_at": None}


# -- Statements: every one the SQL stores run, by name -------------------------------


def insert_call_if_absent(insert: Insert, spec: CallSpec, now: float) -> sa.Executable:
    """Register a call unless its row exists (the row is what the row lock locks)."""
    row = {"call_id": spec.call_id, "spec": asdict(spec), "attempts": 0, "registered_at": now}
    row["recovery_until"] = 0.0
    return insert(calls).values(**row).on_conflict_do_nothing(index_elements=["call_id"])


def select_call_for_update(call_id: str, *extra: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """Read a call's row and lock it until the transaction ends (SQLite: the
    ``BEGIN IMMEDIATE`` write lock already serializes, ``FOR UPDATE`` renders as nothing)."""
    return sa.select(calls, *extra).where(calls.c.call_id == call_id).with_for_update()


def update_call_spec(spec: CallSpec) -> sa.Update:
    """Store the request of a call first registered without one."""
    return calls.update().where(calls.c.call_id == spec.call_id).values(spec=asdict(spec))


def claim_attempt(call_id: str, lease: Lease) -> sa.Update:
    """Count a new attempt, give its lease to the claiming worker, and end any recovery
    hold: the republished call was claimed, so a later crash may be recovered at once."""
    return (
        calls.update()
        .where(calls.c.call_id == call_id)
        .values(
            attempts=lease.attempt,
            lease_token=lease.token,
            lease_worker=lease.worker,
            lease_attempt=lease.attempt,
            lease_expires_at=lease.expires_at,
            recovery_until=0.0,
        )
    )


def hand_on_attempt(call_id: str, lease: Lease, now: float) -> sa.Update:
    """Mark the lease's attempt as the one that handed the call on, free the lease, and let
    the call wait for its next delivery as if registered ``now``; matches no row unless
    that lease still holds the call."""
    return (
        calls.update()
        .where(calls.c.call_id == call_id, calls.c.lease_token == lease.token)
        .values(handed_on=lease.attempt, handed=calls.c.handed + 1, registered_at=now, **_NO_LEASE)
    )


def clear_lease(call_id: str, token: str | None = None) -> sa.Update:
    """Free a call's lease: any lease, or only the one with ``token``."""
    stmt = calls.update().where(calls.c.call_id == call_id)
    if token is not None:
        stmt = stmt.where(calls.c.lease_token == token)
    return stmt.values(**_NO_LEASE)


def renew_ttl_lease(call_id: str, token: str, now: float, ttl_s: float) -> sa.Update:
    """Push back a live TTL lease's expiry; matches no row if the lease lapsed or moved."""
    return (
        calls.update()
        .where(calls.c.call_id == call_id, calls.c.lease_token == token, calls.c.lease_expires_at > now)
        .values(lease_expires_at=now + ttl_s)
    )


def select_result(call_id: str) -> sa.Select[Any]:
    """The call's recorded outcome."""
    return sa.select(results.c.outcome).where(results.c.call_id == call_id)


def insert_result(call_id: str, outcome: Outcome, now: float) -> sa.Insert:
    """Record the call's one result. Only a write under the call's row lock, that found no
    result, inserts one; a second insert would break the primary key."""
    return results.insert().values(call_id=call_id, outcome=asdict(outcome), recorded_at=now)


def insert_event_if_absent(insert: Insert, event: Event) -> sa.Executable:
    """Append an audit event unless one with its id exists."""
    row = {
        "event_id": event.id,
        "call_id": event.call_id,
        "type": event.type,
        "attempt": event.attempt,
        "data": event.data,
        "at": event.at,
    }
    return insert(events).values(**row).on_conflict_do_nothing(index_elements=["event_id"])


def select_event_data(event_id: str) -> sa.Select[Any]:
    """The data of one audit event, by its id."""
    return sa.select(events.c.data).where(events.c.event_id == event_id)


def select_events(call_id: str) -> sa.Select[Any]:
    """A call's audit trail, oldest first."""
    return sa.select(events).where(events.c.call_id == call_id).order_by(events.c.id)


def select_unfinished(now: float, unclaimed_grace_s: float) -> sa.Select[Any]:
    """Calls without a result that were claimed (and not handed on by their last attempt),
    or registered (or handed on) longer than the grace ago; the store then drops those
    whose lease is still live."""
    return (
        sa.select(calls)
        .outerjoin(results, results.c.call_id == calls.c.call_id)
        .where(
            results.c.call_id.is_(None),
            sa.or_(
                sa.and_(calls.c.attempts > 0, calls.c.handed_on != calls.c.attempts),
                calls.c.registered_at + unclaimed_grace_s <= now,
            ),
        )
        .order_by(calls.c.registered_at, calls.c.call_id)
    )


def select_recovery(call_id: str) -> sa.Select[Any]:
    """The call's republish count, with the attempt count it was counted at."""
    return sa.select(recoveries.c.attempts, recoveries.c.tries).where(recoveries.c.call_id == call_id)


def upsert_recovery(insert: Insert, call_id: str, attempts: int, tries: int) -> sa.Executable:
    """Set the call's republish count (the caller holds the call's row lock)."""
    stmt = insert(recoveries).values(call_id=call_id, attempts=attempts, tries=tries)
    return stmt.on_conflict_do_update(index_elements=["call_id"], set_={"attempts": attempts, "tries": tries})


def hold_recovery(call_id: str, until: float) -> sa.Update:
    """Keep other workers from republishing the call until ``until``."""
    return calls.update().where(calls.c.call_id == call_id).values(recovery_until=until)


def lease_holds(call_id: str, token: str) -> sa.Select[Any]:
    """The call's row, locked, if the lease with ``token`` is its lease (live or not: the
    backend checks that)."""
    return select_call_for_update(call_id).where(calls.c.lease_token == token)


def upsert_checkpoint(insert: Insert, call_id: str, checkpoint: str, now: float) -> sa.Executable:
    """Keep ``checkpoint`` as the call's last one."""
    stmt = insert(checkpoints).values(call_id=call_id, checkpoint=checkpoint, saved_at=now)
    return stmt.on_conflict_do_update(index_elements=["call_id"],
                                      set_={"checkpoint": checkpoint, "saved_at": now})


def select_checkpoint(call_id: str) -> sa.Select[Any]:
    """The call's last checkpoint."""
    return sa.select(checkpoints.c.checkpoint).where(checkpoints.c.call_id == call_id)


def insert_budget_if_absent(insert: Insert, key: str, window: int) -> sa.Executable:
    """Create a budget's row, empty in ``window``, unless it exists (the row lock's row)."""
    return insert(budgets).values(budget_key=key, window_no=window, total=0.0).on_conflict_do_nothing(
        index_elements=["budget_key"])


def select_budget_for_update(key: str) -> sa.Select[Any]:
    """Read a budget's window and total, and lock its row until the transaction ends."""
    return sa.select(budgets.c.window_no, budgets.c.total).where(budgets.c.budget_key == key).with_for_update()


def start_budget_window(key: str, window: int) -> sa.Update:
    """Empty a budget for a new window."""
    return budgets.update().where(budgets.c.budget_key == key).values(window_no=window, total=0.0)


def delete_budget_tokens(key: str) -> sa.Delete:
    """Forget the tokens counted in a budget's past window."""
    return budget_tokens.delete().where(budget_tokens.c.budget_key == key)


def select_budget_token(key: str, token: str) -> sa.Select[Any]:
    """Whether ``token`` was counted in the budget's current window."""
    return sa.select(budget_tokens.c.token).where(budget_tokens.c.budget_key == key, budget_tokens.c.token == token)


def count_budget_spend(key: str, token: str, amount: float) -> tuple[sa.Insert, sa.Update]:
    """Count ``amount`` for ``token`` in the budget's current window."""
    return (budget_tokens.insert().values(budget_key=key, token=token),
            budgets.update().where(budgets.c.budget_key == key).values(total=budgets.c.total + amount))


# -- The store -------------------------------------------------------------------------


def _outcome(raw: dict[str, Any] | None) -> Outcome | None:
    return None if raw is None else Outcome(**raw)


@dataclass
class _Writer(CallWriter):
    """A call's rows, locked in the transaction ``conn``, written at ``now``."""

    insert: Insert
    conn: Connection
    call_id: str
    now: float

    def claim(self, lease: Lease) -> None:
        self.conn.execute(claim_attempt(self.call_id, lease))

    def record(self, outcome: Outcome) -> None:
        self.conn.execute(insert_result(self.call_id, outcome, self.now))
        self.conn.execute(clear_lease(self.call_id))

    def append(self, event: Draft) -> None:
        self.conn.execute(insert_event_if_absent(self.insert, event.stamp(self.now)))

    def let_go(self, token: str) -> None:
        self.conn.execute(clear_lease(self.call_id, token))

    def hand_on(self, lease: Lease) -> None:
        self.conn.execute(hand_on_attempt(self.call_id, lease, self.now))


class SQLStore(Store):
    """The logic both SQL stores share; a backend says what makes a lease live.

    Subclasses set :attr:`insert`, and implement :meth:`_write` and
    :meth:`_read` (transactions, with driver errors wrapped), :meth:`_live`,
    :meth:`begin`, :meth:`renew` and :meth:`_let_go`.
    """

    #: The dialect's ``insert`` (it must have ``on_conflict_do_nothing``).
    insert: Insert

    def __init__(self, engine: sa.Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    # Backend hooks.

    @abc.abstractmethod
    def _write(self) -> AbstractContextManager[Connection]:
        """A write transaction whose row reads lock the row until commit."""

    @abc.abstractmethod
    def _read(self) -> AbstractContextManager[Connection]:
        """A read-only transaction."""

    @abc.abstractmethod
    def _live(self, rows: Sequence[Row[Any]], now: float, conn: Connection) -> set[str]:
        """The call ids among ``rows`` whose lease is live."""

    def _let_go(self, lease: Lease) -> None:  # noqa: B027 - optional hook
        """Free what the backend holds for ``lease`` outside the tables (after commit)."""

    # Steps run inside a write transaction.

    def _lock_call(
        self, conn: Connection, spec: CallSpec, now: float, *extra: sa.ColumnElement[Any]
    ) -> tuple[Row[Any], CallSpec]:
        """Lock the call's row (creating it) and return it with the call's spec in force."""
        conn.execute(insert_call_if_absent(self.insert, spec, now))
        row = conn.execute(select_call_for_update(spec.call_id, *extra)).one()
        stored = CallSpec(**row.spec)
        kept = merge_spec(stored, spec)
        if kept is not stored:
            conn.execute(update_call_spec(kept))
        return row, kept

    def _result(self, conn: Connection, call_id: str) -> Outcome | None:
        return _outcome(conn.execute(select_result(call_id)).scalar_one_or_none())

    def _state(self, conn: Connection, row: Row[Any], holder_live: bool) -> CallState:
        """The locked call's state; ``holder_live`` says whether its lease is live."""
        result = self._result(conn, row.call_id)
        token = row.lease_token or ""
        if not holder_live:
            cause = ""
            if row.attempts > 0 and result is None:  # a lapsed call: did its holder say why?
                data = conn.execute(select_event_data(event_id(row.call_id, FENCED, row.attempts))).scalar_one_or_none()
                cause = str((data or {}).get("cause") or "")
            return CallState(row.attempts, result, handed_on=row.handed_on, handed=row.handed, token=token,
                             lost_cause=cause)
        return CallState(row.attempts, result, True, row.lease_worker or "", row.lease_expires_at,
                         row.handed_on, row.handed, token)

    def _begin(
        self,
        conn: Connection,
        row: Row[Any],
        spec: CallSpec,
        worker: str,
        config: GuardConfig,
        now: float,
        holder_live: bool,
        token: str,
    ) -> BeginResult:
        """Decide a delivery of the locked call and write the decision; a claim's
        lease gets ``token`` (and an expiry if the backend's leases have a TTL)."""
        state = self._state(conn, row, holder_live)
        if holder_live and not self.ttl_leases:
            # A session-bound lease held by another session is that session's, even if it is
            # this claim's own (a lost reply whose session lives on): wait for it to end.
            state = replace(state, token="")
        writes = plan_begin(state, spec, worker, config, token, now if self.ttl_leases else None)
        return apply(writes, _Writer(self.insert, conn, row.call_id, now))

    # The Store interface.

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig) -> FinishResult:
        """Record the outcome (see :meth:`Store.finish`). What the backend holds for the
        lease (PostgreSQL: the lock) is kept when the store cannot be reached, so that the
        lease lives on while the caller retries; it is freed once the result is written
        (or refused), and by :meth:`release` when the caller gives up."""
        try:
            with self._write() as conn:
                now = self.now()
                row, spec = self._lock_call(conn, CallSpec(lease.call_id), now)
                # The row lock serializes every write of the call, so the result read under
                # it is current and the decision still holds when written: the insert of an
                # accepted result cannot meet another result.
                writes = plan_finish(self._state(conn, row, False), spec, lease, outcome, config)
                result = apply(writes, _Writer(self.insert, conn, lease.call_id, now))
        except StoreUnavailable:
            raise
        except BaseException:
            self._let_go(lease)
            raise
        self._let_go(lease)
        return result

    def release(self, lease: Lease) -> None:
        try:
            with self._write() as conn:
                apply(plan_release(lease), _Writer(self.insert, conn, lease.call_id, self.now()))
        finally:
            self._let_go(lease)

    def fenced(self, lease: Lease, cause: str | None = None) -> None:
        self._audit_and_let_go(lease, lambda row, live: plan_fenced(lease, cause))

    def hand_on(self, lease: Lease) -> None:
        self._audit_and_let_go(lease, lambda row, live: plan_hand_on(lease, row.lease_token == lease.token and live()))

    def _audit_and_let_go(self, lease: Lease, plan: Callable[[Row[Any], Callable[[], bool]], Writes]) -> None:
        """Lock a known call's row, apply ``plan(row, live)`` (``live()``: whether its lease is
        live, read only if the plan asks), and free what the backend holds for ``lease``."""
        try:
            with self._write() as conn:
                row = conn.execute(select_call_for_update(lease.call_id)).one_or_none()
                if row is None:
                    return
                now = self.now()
                writes = plan(row, lambda: row.call_id in self._live([row], now, conn))
                apply(writes, _Writer(self.insert, conn, lease.call_id, now))
        finally:
            self._let_go(lease)

    def save_checkpoint(self, lease: Lease, checkpoint: str) -> bool:
        with self._write() as conn:
            row = conn.execute(lease_holds(lease.call_id, lease.token)).one_or_none()
            now = self.now()
            if row is None or row.call_id not in self._live([row], now, conn):
                return False
            conn.execute(upsert_checkpoint(self.insert, lease.call_id, checkpoint, now))
            return True

    def last_checkpoint(self, call_id: str) -> Checkpoint | None:
        with self._read() as conn:
            raw = conn.execute(select_checkpoint(call_id)).scalar_one_or_none()
        return Checkpoint.from_json(raw) if raw else None

    def events(self, call_id: str) -> list[Event]:
        with self._read() as conn:
            rows = conn.execute(select_events(call_id)).all()
            result = self._result(conn, call_id) if rows else None
        return joined([Event(r.event_id, r.type, r.call_id, r.attempt, r.data, r.at) for r in rows], result)

    def result(self, call_id: str) -> Outcome | None:
        with self._read() as conn:
            return self._result(conn, call_id)

    def register(self, call: CallSpec) -> None:
        with self._write() as conn:
            self._lock_call(conn, call, self.now())

    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        now = self.now() if now is None else now
        with self._read() as conn:
            rows = conn.execute(select_unfinished(now, unclaimed_grace_s)).all()
            live = self._live(rows, now, conn) if rows else set()
        return [CallSpec(**r.spec) for r in rows if r.call_id not in live]

    def claim_recovery(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int:
        with self._write() as conn:
            now = self.now()
            row = self._unheld(conn, call_id, now)
            if row is None or row.recovery_until > now:
                return 0
            counted = conn.execute(select_recovery(call_id)).one_or_none()
            tries = counted.tries + 1 if counted is not None and counted.attempts == row.attempts else 1
            conn.execute(upsert_recovery(self.insert, call_id, row.attempts, tries))
            conn.execute(hold_recovery(call_id, now + recovery_hold(tries, hold_s, max_hold_s)))
            return tries

    def abandon(self, call: CallSpec, outcome: Outcome) -> bool:
        with self._write() as conn:
            now = self.now()
            row = self._unheld(conn, call.call_id, now)
            if row is None or row.attempts != outcome.attempt:
                return False
            apply(plan_abandon(call, outcome), _Writer(self.insert, conn, call.call_id, now))
            return True

    def _unheld(self, conn: Connection, call_id: str, now: float) -> Row[Any] | None:
        """Lock a known call's row and return it if it has no result and no live lease."""
        row = conn.execute(select_call_for_update(call_id)).one_or_none()
        if row is None or self._result(conn, call_id) is not None or self._live([row], now, conn):
            return None
        return row

    # -- Budgets (stores/budgets.py) ----------------------------------------------------

    def spend(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool:
        check_spend(key, token, amount, limit, window_s)
        with self._write() as conn:
            window = window_of(self.now(), window_s)
            conn.execute(insert_budget_if_absent(self.insert, key, window))
            found, total = conn.execute(select_budget_for_update(key)).one()
            if found != window:
                conn.execute(start_budget_window(key, window))
                conn.execute(delete_budget_tokens(key))
                total = 0.0
            elif conn.execute(select_budget_token(key, token)).first() is not None:
                return True
            if not admits(total, amount, limit):
                return False
            for statement in count_budget_spend(key, token, amount):
                conn.execute(statement)
            return True

    # -- Operators' verbs (stores/ops.py) ----------------------------------------------

    def calls(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]:
        after: tuple[float, str] | None = None
        while True:
            with self._read() as conn:
                rows = conn.execute(select_calls_page(since, until, after, _PAGE)).all()
                if not rows:
                    return
                now = self.now()
                live = self._live(rows, now, conn)
                ids = [r.call_id for r in rows]
                resolved = set(conn.execute(select_resolved(ids)).scalars())
            for r in rows:
                holder = (r.lease_worker or "") if r.call_id in live else None
                yield CallRecord(r.call_id, CallSpec(**r.spec), r.registered_at, r.attempts,
                                 _outcome(r.outcome), holder, r.call_id in resolved)
            if len(rows) < _PAGE:
                return
            after = (rows[-1].registered_at, rows[-1].call_id)

    def resolve(self, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                value: Any = None) -> Outcome:
        with self._write() as conn:
            row = conn.execute(select_call_for_update(call_id)).one_or_none()
            spec = CallSpec(**row.spec) if row is not None else CallSpec(call_id)
            outcome, event = plan_resolve(spec, self._result(conn, call_id), verdict, note, by, value)
            conn.execute(update_result(call_id, outcome))
            conn.execute(insert_event_if_absent(self.insert, event.stamp(self.now())))
            return outcome

    def settle(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool:
        with self._write() as conn:
            if conn.execute(select_call_for_update(call_id)).one_or_none() is None:
                return False
            if self._result(conn, call_id) != expected:
                return False
            conn.execute(update_result(call_id, outcome))
            conn.execute(insert_event_if_absent(self.insert, event.stamp(self.now())))
            return True

    def purge(self, before: float) -> int:
        purged = 0
        while True:
            with self._write() as conn:
                ids = list(conn.execute(select_finished_before(before, _PAGE)).scalars())
                for table in (events, results, recoveries, checkpoints, calls):
                    conn.execute(table.delete().where(table.c.call_id.in_(ids)))
            purged += len(ids)
            if len(ids) < _PAGE:
                return purged


# -- Operators' statements (stores/ops.py) ---------------------------------------------------

#: The time index of calls (``aaa calls``, ``aaa purge``); created with the tables.
calls_by_time = sa.Index("ix_aaa_calls_registered_at", calls.c.registered_at)

#: Rows per page of ``calls()`` and per transaction of ``purge()``.
_PAGE = 500


def select_calls_page(since: float | None, until: float | None, after: tuple[float, str] | None,
                      limit: int) -> sa.Select[Any]:
    """A page of the calls registered between ``since`` and ``until``, newest first (those
    older than ``after``, the last row of the page before), each with its result (NULL if none)."""
    stmt = sa.select(calls, results.c.outcome).outerjoin(results, results.c.call_id == calls.c.call_id)
    if since is not None:
        stmt = stmt.where(calls.c.registered_at >= since)
    if until is not None:
        stmt = stmt.where(calls.c.registered_at <= until)
    if after is not None:
        stmt = stmt.where(sa.tuple_(calls.c.registered_at, calls.c.call_id) < sa.tuple_(*after))
    return stmt.order_by(calls.c.registered_at.desc(), calls.c.call_id.desc()).limit(limit)


def select_resolved(call_ids: Sequence[str]) -> sa.Select[Any]:
    """Which of these calls an operator resolved."""
    return sa.select(events.c.call_id).where(events.c.type == RESOLVED, events.c.call_id.in_(call_ids))


def update_result(call_id: str, outcome: Outcome) -> sa.Update:
    """Replace a call's result (an operator's resolution of a call in doubt, only)."""
    return results.update().where(results.c.call_id == call_id).values(outcome=asdict(outcome))


def select_finished_before(before: float, limit: int) -> sa.Select[Any]:
    """Up to ``limit`` calls with a result, registered before ``before``."""
    return (
        sa.select(calls.c.call_id)
        .join(results, results.c.call_id == calls.c.call_id)
        .where(calls.c.registered_at < before)
        .limit(limit)
    )
