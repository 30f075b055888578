"""Effects applied once, with their result, in your own database's transaction.

Most tools of a web app write to the app's own database: create the order, mark the
refund, move the stock. For those the guard can do better than at-least-once:
:func:`once` runs ``fn`` and records its result under the call's idempotency key in the
same transaction, so the effect and its record commit together or not at all::

    from aaa_celery.effects import once

    @app.task(base=GuardedTask)
    def refund(order_id: str, ctx: ToolContext) -> dict:
        with engine.begin() as conn:
            return once(conn, ctx, lambda conn: mark_refunded(conn, order_id))

A later attempt of the same call (after a crash between the commit and the guard's
``finish``), or any call with the same idempotency key, finds the record and returns
the recorded value without running ``fn`` again. An attempt the guard has superseded
(its fence is lower than the call's highest attempt this database has seen) raises
:class:`~aaa_celery.fencing.StaleFence` before ``fn`` runs: its transaction must roll back.

Only what ``fn`` writes through that transaction is covered; an HTTP call made inside
``fn`` is not (see ``docs/effects.md``). Two tables hold the records, ``aaa_effects``
and ``aaa_effect_fences``: define them on your metadata with :class:`EffectLog` (or
create them with :meth:`EffectLog.create`). Django projects use
:func:`aaa_celery.contrib.django.effects.once` and the app's migration instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from .context import ToolContext
from .errors import ConfigError
from .fencing import SQLFence, StaleFence

__all__ = ["once", "EffectLog", "StaleFence"]

_T = TypeVar("_T")

#: The tables' default names (the Django migration creates the same ones).
EFFECTS_TABLE = "aaa_effects"
FENCES_TABLE = "aaa_effect_fences"


class EffectRecords(Protocol):
    """The I/O :func:`applied_once` needs, inside one open transaction of the app's database."""

    def advance(self, call_id: str, fence: int) -> None:
        """Record ``fence`` as the call's highest seen, or raise StaleFence if a higher one was."""

    def recorded(self, key: str) -> str | None:
        """The JSON text recorded under ``key``, or None."""

    def apply(self, key: str, ctx: ToolContext, produce: Callable[[], str]) -> str:
        """In a savepoint: run ``produce`` and record its text under ``key``; return it. If
        another transaction recorded ``key`` meanwhile, undo ``produce``'s writes and return
        that record instead."""


def _effect_key(ctx: ToolContext) -> str:
    """The key an effect is recorded under: the call's idempotency key."""
    if not ctx.idempotency_key:
        raise ConfigError(
            "once(): ctx.idempotency_key is empty (a direct call's ToolContext has none); run the tool "
            "under the guard, or give the context a key in a test: ToolContext(..., idempotency_key='k')")
    return ctx.idempotency_key


def _encode(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(f"once(): fn must return a JSON value (it is recorded as JSON): {e}") from e


def applied_once(records: EffectRecords, ctx: ToolContext, fn: Callable[[], _T]) -> _T:
    """The one rule, for every database: refuse a stale attempt, then return the recorded
    value if there is one, else apply ``fn`` and record its value. The value is returned as
    JSON decodes it, the same on every attempt."""
    key = _effect_key(ctx)
    records.advance(ctx.call_id, ctx.fence)
    found = records.recorded(key)
    if found is None:
        found = records.apply(key, ctx, lambda: _encode(fn()))
    value: _T = json.loads(found)
    return value


class EffectLog:
    """The effect records' tables, for SQLAlchemy.

    Args:
        metadata: a ``sqlalchemy.MetaData`` to define the tables on: your app's, so that
            ``create_all`` or Alembic's autogenerate make them with your own tables; a new
            one by default.
        table: the effects table's name (one row per idempotency key: its recorded result).
        fences_table: the fences table's name (an :class:`~aaa_celery.fencing.SQLFence`
            keyed by call id: the highest attempt of each call this database has seen).
    """

    def __init__(self, metadata: Any = None, table: str = EFFECTS_TABLE, fences_table: str = FENCES_TABLE) -> None:
        import sqlalchemy as sa

        self.fences = SQLFence(fences_table, metadata)
        self.metadata = self.fences.metadata
        self.table = sa.Table(
            table,
            self.metadata,
            sa.Column("key", sa.String, primary_key=True),
            sa.Column("call_id", sa.String, nullable=False),
            sa.Column("attempt", sa.Integer, nullable=False),
            sa.Column("result", sa.Text, nullable=False),
        )

    def create(self, bind: Any) -> None:
        """Create both tables if they do not exist (an Engine or a Connection)."""
        self.fences.create(bind)
        self.table.create(bind, checkfirst=True)

    def once(self, db: Any, ctx: ToolContext, fn: Callable[[Any], _T]) -> _T:
        """:func:`once` on these tables."""
        return applied_once(_SQLAlchemyRecords(self, db), ctx, lambda: fn(db))


class _SQLAlchemyRecords:
    """:class:`EffectRecords` over a SQLAlchemy Connection or Session."""

    def __init__(self, log: EffectLog, db: Any) -> None:
        from sqlalchemy.orm import Session

        self.log, self.db = log, db
        self.conn = db.connection() if isinstance(db, Session) else db

    def advance(self, call_id: str, fence: int) -> None:
        self.log.fences.check(self.conn, call_id, fence)

    def recorded(self, key: str) -> str | None:
        import sqlalchemy as sa

        t = self.log.table
        found: str | None = self.db.execute(sa.select(t.c.result).where(t.c.key == key)).scalar_one_or_none()
        return found

    def apply(self, key: str, ctx: ToolContext, produce: Callable[[], str]) -> str:
        import sqlalchemy as sa

        try:
            with self.db.begin_nested():
                text = produce()
                self.db.execute(self.log.table.insert().values(key=key, call_id=ctx.call_id, attempt=ctx.attempt,
                                                               result=text))
            return text
        except sa.exc.IntegrityError:
            found = self.recorded(key)
            if found is None:  # not our record's conflict: fn's own
                raise
            return found


_default: EffectLog | None = None


def once(db: Any, ctx: ToolContext, fn: Callable[[Any], _T]) -> _T:
    """Apply ``fn(db)`` at most once per ``ctx.idempotency_key``, in ``db``'s transaction.

    Args:
        db: a SQLAlchemy ``Connection`` or ``Session`` inside your transaction
            (``with engine.begin() as conn``); it commits or rolls back the effect and its
            record together.
        ctx: the running attempt's :class:`~aaa_celery.context.ToolContext`.
        fn: the effect: it writes through ``db`` and returns a JSON value.

    Returns:
        ``fn``'s value as JSON decodes it: from this run, or the one recorded by an earlier
        attempt or call with the same idempotency key (``fn`` does not run then).

    Raises:
        StaleFence: a newer attempt of this call has reached this database; nothing ran,
            and the caller's transaction must roll back (leaving the ``with`` block does it).
        ConfigError: ``ctx`` has no idempotency key (a direct call's context).

    The tables are ``aaa_effects`` and ``aaa_effect_fences`` (:class:`EffectLog` defines them).
    """
    global _default
    if _default is None:
        _default = EffectLog()
    return _default.once(db, ctx, fn)
