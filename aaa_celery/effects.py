"""Effects applied once, with their result, in your own database's transaction.

Most tools of a web app write to the app's own database: create the order, mark the
refund, move the stock. For those the guard can do better than at-least-once:
:func:`once` runs ``fn`` and records its result under the call's tenant, its tool and its
idempotency key in the same transaction, so the effect and its record commit together or
not at all::

    from aaa_celery.effects import once

    @app.task(base=GuardedTask)
    def refund(order_id: str, ctx: ToolContext) -> dict:
        with engine.begin() as conn:
            return once(conn, ctx, lambda conn: mark_refunded(conn, order_id))

A later attempt of the same call (after a crash between the commit and the guard's
``finish``), or any call of the same tenant and tool with the same idempotency key, finds
the record and returns the recorded value without running ``fn`` again; another tenant's
record is never returned, and tools share records only through ``once(..., shared=name)``. An attempt the guard has superseded
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
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .context import ToolContext
from .errors import ConfigError
from .fencing import SQLFence, StaleFence
from .protocol import scope_prefix, tenant_of

__all__ = ["once", "EffectLog", "StaleFence"]

_T = TypeVar("_T")

#: The tables' default names (the Django migration creates the same ones).
EFFECTS_TABLE = "aaa_effects"
FENCES_TABLE = "aaa_effect_fences"


#: The ``tool`` of a record written before records had one (0.2.0): it answers any tool of
#: its tenant. Its key is ``<tenant>:*:<idempotency key>``, which no tool's key can be (a
#: tool's name is escaped in its key, ``*`` as ``~2A``).
ANY_TOOL = "*"


class EffectRecords(Protocol):
    """The I/O :func:`applied_once` needs, inside one open transaction of the app's database."""

    def advance(self, call_id: str, fence: int) -> None:
        """Record ``fence`` as the call's highest seen, or raise StaleFence if a higher one was."""

    def recorded(self, scope: Scope) -> str | None:
        """The JSON text recorded under ``scope.key``, else under ``scope.legacy`` (a record
        written before records had a tool), or None."""

    def apply(self, scope: Scope, ctx: ToolContext, produce: Callable[[], str]) -> str:
        """In a savepoint: run ``produce`` and record its text under ``scope.key``; return it.
        If another transaction recorded the key meanwhile, undo ``produce``'s writes and return
        that record instead."""


@dataclass(frozen=True)
class Scope:
    """Where a call's effect is recorded: its tenant, its tool (or the name tools share), the
    idempotency key, and the record's key made of all three."""

    tenant: str | None
    tool: str
    key: str
    legacy: str

    @classmethod
    def of(cls, tenant: str | None, tool: str, idempotency_key: str) -> Scope:
        return cls(tenant, tool, scope_prefix(tenant, tool) + idempotency_key,
                   scope_prefix(tenant, None) + idempotency_key)


def _scope(ctx: ToolContext, shared: str | None) -> Scope:
    """The scope of a call's effect: the call's tenant, its tool (``shared`` instead, if given)
    and its idempotency key."""
    if not ctx.idempotency_key:
        raise ConfigError(
            "once(): ctx.idempotency_key is empty (a direct call's ToolContext has none); run the tool "
            "under the guard, or give the context a key in a test: ToolContext(..., idempotency_key='k')")
    if shared is not None and (not isinstance(shared, str) or not shared):
        raise ConfigError(f"once(): shared must be a non-empty name that tools share records under, not {shared!r}")
    tool = shared or ctx.tool
    if not tool:
        raise ConfigError(
            "once(): ctx.tool is empty, and a record is kept per tenant and tool; run the tool under the guard, "
            "or name the tool in a test: ToolContext(..., tool='refund') (or pass shared='name')")
    return Scope.of(ctx.tenant, tool, ctx.idempotency_key)


def upgraded(key: str, call_id: str) -> Scope:
    """Where a record written by 0.2.0 (under the idempotency key ``key`` alone, by call
    ``call_id``) goes: its call's tenant, any tool (:data:`ANY_TOOL`). The one rule of the
    upgrade, for :meth:`EffectLog.upgrade` and the Django migration."""
    tenant = tenant_of(call_id)
    legacy = scope_prefix(tenant, None) + key
    return Scope(tenant, ANY_TOOL, legacy, legacy)


def _encode(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(f"once(): fn must return a JSON value (it is recorded as JSON): {e}") from e


def applied_once(records: EffectRecords, ctx: ToolContext, fn: Callable[[], _T], shared: str | None = None) -> _T:
    """The one rule, for every database: refuse a stale attempt, then return the value recorded
    for the call's tenant, tool (or ``shared`` name) and key if there is one, else apply ``fn``
    and record its value. The value is returned as JSON decodes it, the same on every attempt."""
    scope = _scope(ctx, shared)
    records.advance(ctx.call_id, ctx.fence)
    found = records.recorded(scope)
    if found is None:
        found = records.apply(scope, ctx, lambda: _encode(fn()))
    value: _T = json.loads(found)
    return value


class EffectLog:
    """The effect records' tables, for SQLAlchemy.

    Args:
        metadata: a ``sqlalchemy.MetaData`` to define the tables on: your app's, so that
            ``create_all`` or Alembic's autogenerate make them with your own tables; a new
            one by default.
        table: the effects table's name (one row per tenant, tool and idempotency key: its
            recorded result).
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
            sa.Column("key", sa.String, primary_key=True),  # <tenant>:<tool>:<idempotency key>, see Scope
            sa.Column("call_id", sa.String, nullable=False),
            sa.Column("attempt", sa.Integer, nullable=False),
            sa.Column("result", sa.Text, nullable=False),
            sa.Column("tenant", sa.String, nullable=True),  # None: no tenant
            sa.Column("tool", sa.String, nullable=True),  # None: a 0.2.0 row not yet upgraded
        )

    def create(self, bind: Any) -> None:
        """Create both tables if they do not exist (an Engine or a Connection)."""
        self.fences.create(bind)
        self.table.create(bind, checkfirst=True)

    def upgrade(self, bind: Any) -> int:
        """Bring tables made by 0.2.0 to this release's: add the ``tenant`` and ``tool``
        columns, and move each row recorded before to its call's tenant, for any tool
        (:func:`upgraded`). Rows already moved are left alone, so it can run again (after the
        last 0.2.0 worker stopped); a 0.2.0 row whose moved key exists already (the key recorded
        again by a 0.2.0 worker after an upgrade) stays as it is. Returns how many rows it moved.

        ``bind``: an Engine (one transaction) or a Connection (in yours); in an Alembic
        revision, ``EffectLog().upgrade(op.get_bind())``.
        """
        import sqlalchemy as sa

        if isinstance(bind, sa.Engine):
            with bind.begin() as conn:
                return self.upgrade(conn)
        t = self.table
        have = {c["name"] for c in sa.inspect(bind).get_columns(t.name, schema=t.schema)}
        for column in ("tenant", "tool"):
            if column not in have:  # a plain ADD COLUMN, the same on SQLite and PostgreSQL
                name = bind.dialect.identifier_preparer.quote(column)
                bind.execute(sa.text(f"ALTER TABLE {bind.dialect.identifier_preparer.format_table(t)} "
                                     f"ADD COLUMN {name} VARCHAR"))
        moved = 0
        for key, call in bind.execute(sa.select(t.c.key, t.c.call_id).where(t.c.tool.is_(None))).all():
            scope = upgraded(key, call)
            if bind.execute(sa.select(t.c.key).where(t.c.key == scope.key)).first() is not None:
                continue  # a 0.2.0 worker recorded the key again after an upgrade: the moved record answers
            bind.execute(t.update().where(t.c.key == key, t.c.tool.is_(None))
                         .values(key=scope.key, tenant=scope.tenant, tool=scope.tool))
            moved += 1
        return moved

    def once(self, db: Any, ctx: ToolContext, fn: Callable[[Any], _T], *, shared: str | None = None) -> _T:
        """:func:`once` on these tables."""
        return applied_once(_SQLAlchemyRecords(self, db), ctx, lambda: fn(db), shared)


class _SQLAlchemyRecords:
    """:class:`EffectRecords` over a SQLAlchemy Connection or Session."""

    def __init__(self, log: EffectLog, db: Any) -> None:
        from sqlalchemy.orm import Session

        self.log, self.db = log, db
        self.conn = db.connection() if isinstance(db, Session) else db

    def advance(self, call_id: str, fence: int) -> None:
        self.log.fences.check(self.conn, call_id, fence)

    def recorded(self, scope: Scope) -> str | None:
        import sqlalchemy as sa

        t = self.log.table
        query = sa.select(t.c.key, t.c.result, t.c.tool).where(t.c.key.in_([scope.key, scope.legacy]))
        try:
            found = {key: result for key, result, _ in self.db.execute(query)}
        except (sa.exc.OperationalError, sa.exc.ProgrammingError) as e:
            if "tool" not in str(e.orig):
                raise
            raise ConfigError(
                f"once(): the table {t.name} has no tool column, so it was made by aaa_celery 0.2.0; upgrade it "
                "with EffectLog().upgrade(engine) (or from an Alembic revision; docs/effects.md)") from e
        text: str | None = found.get(scope.key, found.get(scope.legacy))
        return text

    def apply(self, scope: Scope, ctx: ToolContext, produce: Callable[[], str]) -> str:
        import sqlalchemy as sa

        try:
            with self.db.begin_nested():
                text = produce()
                self.db.execute(self.log.table.insert().values(
                    key=scope.key, call_id=ctx.call_id, attempt=ctx.attempt, result=text, tenant=scope.tenant,
                    tool=scope.tool))
            return text
        except sa.exc.IntegrityError:
            found = self.recorded(scope)
            if found is None:  # not our record's conflict: fn's own
                raise
            return found


_default: EffectLog | None = None


def once(db: Any, ctx: ToolContext, fn: Callable[[Any], _T], *, shared: str | None = None) -> _T:
    """Apply ``fn(db)`` at most once per tenant, tool and idempotency key, in ``db``'s transaction.

    Args:
        db: a SQLAlchemy ``Connection`` or ``Session`` inside your transaction
            (``with engine.begin() as conn``); it commits or rolls back the effect and its
            record together.
        ctx: the running attempt's :class:`~aaa_celery.context.ToolContext`: its tenant, tool
            and idempotency key say where the record is kept.
        fn: the effect: it writes through ``db`` and returns a JSON value.
        shared: keep the record under this name instead of the tool's: tools that pass the
            same name share their records (within the tenant; a tool named so shares them too).
            By default a record is the tool's own.

    Returns:
        ``fn``'s value as JSON decodes it: from this run, or the one recorded by an earlier
        attempt or call of the same tenant and tool with the same idempotency key (``fn``
        does not run then). Another tenant's record is never returned.

    Raises:
        StaleFence: a newer attempt of this call has reached this database; nothing ran,
            and the caller's transaction must roll back (leaving the ``with`` block does it).
        ConfigError: ``ctx`` has no idempotency key (a direct call's context) or no tool.

    The tables are ``aaa_effects`` and ``aaa_effect_fences`` (:class:`EffectLog` defines them).
    """
    global _default
    if _default is None:
        _default = EffectLog()
    return _default.once(db, ctx, fn, shared=shared)
