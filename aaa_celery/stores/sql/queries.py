"""Every statement the SQL stores run on calls, budgets and operators' verbs, by name.

Each takes plain values and returns a SQLAlchemy statement; :mod:`.store` runs them
inside its transactions. The run records' statements sit with them in :mod:`.runs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ...lifecycle import RESOLVED
from .schema import UNCLAIMED, budget_tokens, budgets, calls, checkpoints, events, recoveries, results, slots

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
    from sqlalchemy.dialects.sqlite import Insert as SQLiteInsert

#: The dialect's ``insert`` (PostgreSQL's or SQLite's: both have ON CONFLICT).
Insert = Callable[[sa.Table], "PostgresInsert | SQLiteInsert"]


def live_at(expires_at: sa.ColumnElement[Any], now: float) -> sa.ColumnElement[bool]:
    """``not lifecycle.lapsed(expires_at, now)`` in SQL: a TTL lease is live strictly before
    its expiry (NULL, no expiry, is no lease: ``NULL > now`` holds for no row)."""
    return expires_at > now


def lapsed_at(expires_at: sa.ColumnElement[Any], now: float) -> sa.ColumnElement[bool]:
    """``lifecycle.lapsed(expires_at, now)`` in SQL: the negation of :func:`live_at`."""
    return sa.or_(expires_at.is_(None), expires_at <= now)


def select_call_for_update(call_id: str) -> sa.Select[Any]:
    """Read a call's row and lock it until the transaction ends (SQLite: the
    ``BEGIN IMMEDIATE`` write lock already serializes, ``FOR UPDATE`` renders as nothing)."""
    return sa.select(calls).where(calls.c.call_id == call_id).with_for_update()


def select_result(call_id: str) -> sa.Select[Any]:
    return sa.select(results.c.outcome).where(results.c.call_id == call_id)


def select_events(call_id: str) -> sa.Select[Any]:
    return sa.select(events).where(events.c.call_id == call_id).order_by(events.c.id)


def select_unfinished(now: float, unclaimed_grace_s: float) -> sa.Select[Any]:
    """Calls without a result that ``lifecycle.awaits_recovery`` names and whose lease may
    have lapsed: claimed (and not handed on by their last attempt) with an expiry that
    :func:`lapsed_at` (a TTL lease's, or a session lease's hint: the store then asks the
    lock), or not claimed since they were registered (or handed on) longer than the grace
    ago. Both halves are ranges of an index (:data:`.schema.calls_by_expiry`,
    :data:`.schema.unclaimed_by_time`), so the rows read grow with the calls listed, not
    with every live lease or every call ever registered (beside the rows without an
    expiry: see ``docs/stores.md``)."""
    claimed = sa.and_(calls.c.attempts > 0, calls.c.handed_on != calls.c.attempts)
    return (
        sa.select(calls)
        .outerjoin(results, results.c.call_id == calls.c.call_id)
        .where(
            results.c.call_id.is_(None),
            sa.or_(
                sa.and_(claimed, lapsed_at(calls.c.lease_expires_at, now)),
                sa.and_(UNCLAIMED, calls.c.registered_at <= now - unclaimed_grace_s),
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


def select_checkpoint(call_id: str) -> sa.Select[Any]:
    return sa.select(checkpoints.c.checkpoint).where(checkpoints.c.call_id == call_id)


def insert_budget_if_absent(insert: Insert, key: str, window: int) -> sa.Executable:
    """Create a budget's row, empty in ``window``, unless it exists (the row lock's row)."""
    return insert(budgets).values(budget_key=key, window_no=window, total=0.0).on_conflict_do_nothing(
        index_elements=["budget_key"])


def insert_slots_if_absent(insert: Insert, key: str) -> sa.Executable:
    """Create a concurrency key's row, with no holder, unless it exists (the row lock's row)."""
    return insert(slots).values(slot_key=key, holders={}).on_conflict_do_nothing(index_elements=["slot_key"])


def select_slots_for_update(key: str) -> sa.Select[Any]:
    return sa.select(slots.c.holders).where(slots.c.slot_key == key).with_for_update()


def select_slots(key: str) -> sa.Select[Any]:
    return sa.select(slots.c.holders).where(slots.c.slot_key == key)


def update_slots(key: str, holders: dict[str, float]) -> sa.Update:
    """Write a concurrency key's holders (call id -> slot expiry)."""
    return slots.update().where(slots.c.slot_key == key).values(holders=holders)


def select_budget_for_update(key: str) -> sa.Select[Any]:
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

# -- Operators' statements (stores/ops.py) ---------------------------------------------------


#: Rows per page of ``calls()`` and per transaction of ``purge()``.
PAGE = 500


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


def select_finished_before(before: float, limit: int) -> sa.Select[Any]:
    """Up to ``limit`` calls a purge with cutoff ``before`` deletes (``lifecycle.purgeable``:
    a result, and seen before the cutoff: ``registered_at``, which a hand-on moves)."""
    return (
        sa.select(calls.c.call_id)
        .join(results, results.c.call_id == calls.c.call_id)
        .where(calls.c.registered_at < before)
        .limit(limit)
    )
