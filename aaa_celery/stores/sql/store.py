"""The logic both SQL stores share.

:class:`SQLStore` reads a call's row under a row lock inside a write
transaction, asks :mod:`aaa_celery.lifecycle` for the writes of the operation,
and applies them (through :mod:`.._writes`, the step it shares with the memory
store) before it commits. The two backends differ only in what makes a lease
live: a TTL column for SQLite (:mod:`.sqlite`), a session-level advisory lock
on a dedicated connection for PostgreSQL (:mod:`.postgres`). The tables are in
:mod:`.schema`, the statements in :mod:`.queries`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from ...config import GuardConfig
from ...errors import StoreUnavailable
from ...lifecycle import (CallSpec, CallState, Checkpoint, Draft, Event, FinishResult, Lease, Outcome,
                          RecordKind, Writes, joined, held_by, lost_cause_event, plan_begin,
                          plan_checkpoint, plan_fenced, plan_finish, plan_hand_on, plan_record, plan_resolve,
                          plan_recovery_claim, plan_release, plan_renew, plan_settle, lapsed, plan_slot, plan_spend,
                          window_of, SlotPlan, PURGED)
from .._writes import apply
from ..base import ResultCopy, Store, StoreVersion
from ..budgets import check_spend
from ..ops import CallRecord
from .queries import (Insert, PAGE, count_budget_spend, delete_budget_tokens, hold_recovery, insert_budget_if_absent,
                      insert_slots_if_absent, lease_holds, select_budget_for_update, select_budget_token,
                      select_call_for_update, select_calls_page, select_checkpoint, select_events,
                      select_finished_before, select_recovery, select_resolved, select_result, select_slots,
                      select_slots_for_update, select_unfinished, start_budget_window, update_slots, upsert_recovery)
from . import versions
from .statements import INSERT_NEW_CALL, SQLWriter, SELECT_EVENT_DATA, Statement, dumps, lock_call
from .schema import calls, checkpoints, events, recoveries, results

#: The table of each kind of record lifecycle.PURGED names, in the order a purge deletes them.
_TABLES = {"call": calls, "result": results, "events": events, "checkpoint": checkpoints, "recovery": recoveries}


def _outcome(raw: dict[str, Any] | None) -> Outcome | None:
    return None if raw is None else Outcome(**raw)


def lapsed_event(row: Any, result: Outcome | None, holder_live: bool) -> str | None:
    """:func:`~aaa_celery.lifecycle.lost_cause_event` of a call's row."""
    return lost_cause_event(row.call_id, row.attempts, result, holder_live)


def call_state(row: Any, result: Outcome | None, holder_live: bool, lapsed_data: dict[str, Any] | None) -> CallState:
    """The state of a call from its row (``aaa_calls``' columns), its result, whether its
    lease is live, and the data of its :func:`lapsed_event` (or None)."""
    token = row.lease_token or ""
    if not holder_live:
        lost_cause = str((lapsed_data or {}).get("cause") or "")
        return CallState(row.attempts, result, handed_on=row.handed_on, handed=row.handed, token=token,
                         lost_cause=lost_cause)
    return CallState(row.attempts, result, True, row.lease_worker or "", row.lease_expires_at,
                     row.handed_on, row.handed, token)


def run_on(conn: Connection) -> Callable[[Statement, tuple[Any, ...]], Any]:
    """Run a :class:`.statements.Statement` on ``conn``, a SQLAlchemy connection."""
    return lambda statement, args: statement.execute(conn, args)


class SQLStore(Store):
    """The logic both SQL stores share; a backend says what makes a lease live.

    Subclasses set :attr:`insert`, and implement :meth:`_write` and
    :meth:`_read` (transactions, with driver errors wrapped), :meth:`_live`,
    :meth:`begin` and :meth:`_let_go`, and :meth:`renew` unless their leases have a TTL.
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

    def _live_swept(self, rows: Sequence[Row[Any]], now: float, conn: Connection) -> set[str]:
        """:meth:`_live` of the rows a recovery sweep read, or of the one a recovery claim
        locked (a backend may ask their leases alone, instead of :meth:`_live`'s view of every lease)."""
        return self._live(rows, now, conn)

    def _lock_schema(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Keep other processes from creating or upgrading the schema until ``conn``'s
        transaction ends (SQLite: the write transaction's lock already does)."""

    def _let_go(self, lease: Lease) -> None:  # noqa: B027 - optional hook
        """Free what the backend holds for ``lease`` outside the tables (after commit)."""

    # Schema versions (versions.py).

    def schema_version(self) -> StoreVersion:
        with self._read() as conn:
            return versions.version(conn)

    def migrate(self) -> StoreVersion:
        with self._write() as conn:
            self._lock_schema(conn)
            return versions.upgrade(conn)

    # Steps run inside a write transaction.

    def _apply(self, conn: Connection, writes: Writes, call_id: str, now: float) -> Any:
        """Make ``writes`` on the locked call and return their reply; the last step of an
        operation's transaction (a backend may commit it here, with the writes)."""
        return apply(writes, SQLWriter(run_on(conn), call_id, now))

    def _lock_call(self, conn: Connection, spec: CallSpec, now: float) -> tuple[Row[Any], CallSpec]:
        """Lock the call's row (creating it) and return it, with its recorded outcome
        (``row.outcome``), and the call's spec in force (:func:`.statements.lock_call`)."""
        run = run_on(conn)
        return lock_call(lambda statement, args: run(statement, args).first(), run, spec, now)

    def _result(self, conn: Connection, call_id: str) -> Outcome | None:
        return _outcome(conn.execute(select_result(call_id)).scalar_one_or_none())

    def _state(self, conn: Connection, row: Row[Any], holder_live: bool, *, cause: bool = True) -> CallState:
        """The locked call's state; ``holder_live`` says whether its lease is live. The result
        is read with the row if the row has it (``outcome``); ``cause``: look up why a lapsed
        call's last attempt was lost (only a delivery's decision needs it)."""
        result = _outcome(row.outcome) if "outcome" in row._fields else self._result(conn, row.call_id)
        lapsed = lapsed_event(row, result, holder_live) if cause else None
        data = SELECT_EVENT_DATA.execute(conn, (lapsed,)).scalar_one_or_none() if lapsed else None
        return call_state(row, result, holder_live, data)

    def _begin_writes(self, state: CallState, spec: CallSpec, worker: str, config: GuardConfig, now: float,
                      token: str) -> Writes:
        """What a delivery of the call in ``state`` writes (:func:`~aaa_celery.lifecycle.plan_begin`)."""
        if state.holder_live and not self.ttl_leases:
            # A session-bound lease held by another session is that session's, even if it is
            # this claim's own (a lost reply whose session lives on): wait for it to end. Its
            # row's expiry is only the sweep's hint (lifecycle.sweep_hint): no expiry to wait for.
            state = replace(state, token="", expires_at=None)
        return plan_begin(state, spec, worker, config, token, now if self.ttl_leases else None)

    # The Store interface.

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig,
               copy: ResultCopy | None = None) -> FinishResult:
        """Record the outcome (see :meth:`Store.finish`). What the backend holds for the
        lease (PostgreSQL: the lock) is kept when the store cannot be reached, so that the
        lease lives on while the caller retries; it is freed once the result is written
        (or refused), and by :meth:`release` when the caller gives up."""
        try:
            result = self._finish(lease, outcome, config)
        except StoreUnavailable:
            raise
        except BaseException:
            self._let_go(lease)
            raise
        self._let_go(lease)
        return result

    def _finish(self, lease: Lease, outcome: Outcome, config: GuardConfig) -> FinishResult:
        """Decide and write the outcome in one transaction under the call's row lock."""
        with self._write() as conn:
            now = self.now()
            row, spec = self._lock_call(conn, CallSpec(lease.call_id), now)
            # The row lock serializes every write of the call, so the result read under
            # it is current and the decision still holds when written: the insert of an
            # accepted result cannot meet another result.
            writes = plan_finish(self._state(conn, row, False, cause=False), spec, lease, outcome, config)
            result: FinishResult = self._apply(conn, writes, lease.call_id, now)
        return result

    def release(self, lease: Lease) -> None:
        try:
            with self._write() as conn:
                self._apply(conn, plan_release(lease), lease.call_id, self.now())
        finally:
            self._let_go(lease)

    def fenced(self, lease: Lease, cause: str | None = None) -> None:
        self._audit_and_let_go(lease, lambda row, live: plan_fenced(lease, cause))

    def hand_on(self, lease: Lease) -> None:
        self._audit_and_let_go(lease, lambda row, live: plan_hand_on(lease, held_by(row.lease_token, lease.token, live())))

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
                self._apply(conn, writes, lease.call_id, now)
        finally:
            self._let_go(lease)

    def save_checkpoint(self, lease: Lease, checkpoint: str) -> bool:
        return self._as_holder(lease, lambda holds: plan_checkpoint(lease, holds, checkpoint))

    def renew(self, lease: Lease) -> bool:
        """Renew a TTL lease (:func:`~aaa_celery.lifecycle.plan_renew`); a backend whose
        leases have no TTL renews otherwise."""
        return self._as_holder(lease, lambda holds: plan_renew(lease, holds))

    def _as_holder(self, lease: Lease, plan: Callable[[bool], Writes]) -> bool:
        """Apply ``plan(holds)``, ``holds``: whether ``lease`` is live and holds the call; its reply."""
        with self._write() as conn:
            row = conn.execute(lease_holds(lease.call_id, lease.token)).one_or_none()
            now = self.now()
            holds = row is not None and row.call_id in self._live([row], now, conn)
            done: bool = self._apply(conn, plan(holds), lease.call_id, now)
            return done

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
        now = self.now()
        with self._write() as conn:  # a new call: one statement
            args = INSERT_NEW_CALL.args(call_id=call.call_id, spec=dumps(call.__dict__), now=now)
            if INSERT_NEW_CALL.execute(conn, args).first() is not None:
                return
        with self._write() as conn:  # a known call: keep what it stores, add what it lacks
            self._lock_call(conn, call, now)

    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        now = self.now() if now is None else now
        with self._read() as conn:
            rows = conn.execute(select_unfinished(now, unclaimed_grace_s)).all()
            live = self._live_swept(rows, now, conn) if rows else set()
        return [CallSpec(**r.spec) for r in rows if r.call_id not in live]

    def claim_recovery(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int:
        with self._write() as conn:
            now = self.now()
            row = conn.execute(select_call_for_update(call_id)).one_or_none()
            state, count, held_until = None, None, 0.0
            if row is not None:
                counted = conn.execute(select_recovery(call_id)).one_or_none()
                count = None if counted is None else (counted.attempts, counted.tries)
                state, held_until = CallState(row.attempts, self._result(conn, call_id)), row.recovery_until
            claim = plan_recovery_claim(state, count, held_until, now, hold_s, max_hold_s)
            # planned for a lease not live; the lease is looked at last, and only for a claim the
            # plan would make (most sweeps find the call held by an earlier republish)
            if claim is not None and row is not None and row.call_id in self._live_swept([row], now, conn):
                assert state is not None
                claim = plan_recovery_claim(replace(state, holder_live=True), count, held_until, now, hold_s,
                                            max_hold_s)
            if row is None or claim is None:
                return 0
            tries, until = claim
            conn.execute(upsert_recovery(self.insert, call_id, row.attempts, tries))
            conn.execute(hold_recovery(call_id, until))
            return tries

    def record(self, call: CallSpec, outcome: Outcome, kind: RecordKind = "first") -> bool:
        with self._write() as conn:
            now = self.now()
            if kind == "abandon":  # a call recovery knows: never created here
                row = conn.execute(select_call_for_update(call.call_id)).one_or_none()
                if row is None:
                    return False
                spec = CallSpec(**row.spec)
            else:
                row, spec = self._lock_call(conn, call, now)
            live = kind == "abandon" and row.call_id in self._live([row], now, conn)
            writes = plan_record(kind, self._state(conn, row, live), spec, outcome)
            recorded: bool = self._apply(conn, writes, call.call_id, now)
            return recorded

    # -- Budgets (stores/budgets.py) ----------------------------------------------------

    def spend(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool:
        check_spend(key, token, amount, limit, window_s)
        with self._write() as conn:
            now = self.now()
            # a new budget's row: empty in the current window (the row lock's row)
            conn.execute(insert_budget_if_absent(self.insert, key, window_of(now, window_s)))
            found, total = conn.execute(select_budget_for_update(key)).one()
            counted = conn.execute(select_budget_token(key, token)).first() is not None
            plan = plan_spend(found, total, counted, amount, limit, window_s, now)
            if plan.restart:
                conn.execute(start_budget_window(key, plan.window))
                conn.execute(delete_budget_tokens(key))
            if plan.count is not None:
                for statement in count_budget_spend(key, token, plan.count):
                    conn.execute(statement)
            return plan.reply

    # -- Concurrency slots (base.Slots) ---------------------------------------------------

    def take_slot(self, key: str, call_id: str, limit: int, ttl_s: float) -> SlotPlan:
        with self._write() as conn:
            conn.execute(insert_slots_if_absent(self.insert, key))
            holders = dict(conn.execute(select_slots_for_update(key)).scalar_one())
            plan = plan_slot(holders, call_id, limit, ttl_s, self.now())
            if plan.drop or plan.put is not None:
                for gone in plan.drop:
                    del holders[gone]
                if plan.put is not None:
                    holders[call_id] = plan.put
                conn.execute(update_slots(key, holders))
            return plan

    def free_slot(self, key: str, call_id: str) -> None:
        with self._write() as conn:
            found = conn.execute(select_slots_for_update(key)).scalar_one_or_none()
            if found is not None and call_id in found:
                conn.execute(update_slots(key, {c: e for c, e in found.items() if c != call_id}))

    def slot_holders(self, key: str) -> list[str]:
        with self._read() as conn:
            found = conn.execute(select_slots(key)).scalar_one_or_none() or {}
            now = self.now()
        return sorted(c for c, expires in found.items() if not lapsed(expires, now))

    # -- Operators' verbs (stores/ops.py) ----------------------------------------------

    def calls(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]:
        after: tuple[float, str] | None = None
        while True:
            with self._read() as conn:
                rows = conn.execute(select_calls_page(since, until, after, PAGE)).all()
                if not rows:
                    return
                now = self.now()
                live = self._live(rows, now, conn)
                ids = [r.call_id for r in rows]
                resolved = set(conn.execute(select_resolved(ids)).scalars())
            for r in rows:
                # A result frees the call's lease, whoever holds it (Writes.record); a
                # PostgreSQL holder's lock lingers until that holder lets it go.
                holder = (r.lease_worker or "") if r.call_id in live and r.outcome is None else None
                yield CallRecord(r.call_id, CallSpec(**r.spec), r.registered_at, r.attempts,
                                 _outcome(r.outcome), holder, r.call_id in resolved)
            if len(rows) < PAGE:
                return
            after = (rows[-1].registered_at, rows[-1].call_id)

    def resolve(self, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                value: Any = None) -> Outcome:
        with self._write() as conn:
            row = conn.execute(select_call_for_update(call_id)).one_or_none()
            spec = CallSpec(**row.spec) if row is not None else CallSpec(call_id)
            writes = plan_resolve(spec, self._result(conn, call_id), verdict, note, by, value)
            outcome: Outcome = self._apply(conn, writes, call_id, self.now())
            return outcome

    def settle(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool:
        with self._write() as conn:
            if conn.execute(select_call_for_update(call_id)).one_or_none() is None:
                return False
            writes = plan_settle(self._result(conn, call_id), expected, outcome, event)
            settled: bool = self._apply(conn, writes, call_id, self.now())
            return settled

    def purge(self, before: float) -> int:
        purged = 0
        while True:
            with self._write() as conn:
                ids = list(conn.execute(select_finished_before(before, PAGE)).scalars())
                for kind in PURGED:
                    table = _TABLES[kind]
                    conn.execute(table.delete().where(table.c.call_id.in_(ids)))
            purged += len(ids)
            if len(ids) < PAGE:
                return purged
