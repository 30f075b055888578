"""The statements that read and write one locked call, each written once, and the one
applier of lifecycle's writes in SQL (:class:`SQLWriter`).

Each statement is SQLAlchemy Core with bind parameters, built once and compiled once per
dialect at import (:class:`Statement`):

- SQLite runs it through SQLAlchemy (:meth:`Statement.execute`);
- PostgreSQL runs its compiled text on the driver: psycopg sends it as it stands
  (:attr:`Statement.postgresql`, ``%s`` parameters), in the store's pipelined transactions
  (:class:`.pg_driver.Transaction`) and as a prepared statement (:func:`.pg_driver.autocommit`).

Parameters are positional, in the order :attr:`Statement.names` gives, and
:meth:`Statement.args` builds them by name. A JSON column's parameter is JSON text on
every path (``json.dumps``, what SQLAlchemy's JSON columns write), so rows written by this
release on either path, and by older releases through SQLAlchemy, read alike. The
PostgreSQL text carries no casts: the server types each parameter from its column.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.engine.interfaces import BindTyping

from ...lifecycle import FINISHED_HINT, CallSpec, Draft, Lease, Outcome, merge_spec, sweep_hint
from .._writes import CallWriter
from .schema import calls, checkpoints, events, results

dumps = json.dumps  # what SQLAlchemy's JSON columns write


def outcome_json(outcome: Outcome) -> str:
    """An outcome as its JSON column keeps it (``json.dumps`` of its fields): an outcome's
    fields hold JSON data only, so ``dataclasses.asdict``'s deep copy (~6 µs a ``finish``)
    buys nothing."""
    return dumps(outcome.__dict__)


def _postgresql(paramstyle: str = "format") -> sa.Dialect:
    dialect = postgresql.psycopg.dialect(paramstyle=paramstyle)  # type: ignore[no-untyped-call]
    dialect.bind_typing = BindTyping.NONE  # no casts: see the module's docstring
    return dialect


_DIALECTS: dict[str, sa.Dialect] = {"postgresql": _postgresql(), "sqlite": sqlite.dialect(paramstyle="qmark")}
#: PostgreSQL's text with named parameters (``%(b_<name>)s``), for :meth:`Statement.plpgsql`.
_NAMED = _postgresql("pyformat")
_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
_BOUND = "b_"


@dataclass(frozen=True)
class Statement:
    """One statement, built once per dialect: ``built`` maps a dialect's name to its Core
    form; ``postgresql`` is PostgreSQL's text, whose ``%s`` parameters are :attr:`names`."""

    built: dict[str, Any]  # Core statements (Executable and ClauseElement)
    postgresql: str
    names: tuple[str, ...]
    named: str  # PostgreSQL's text with named parameters

    def plpgsql(self, **exprs: str) -> str:
        """The statement as a PL/pgSQL function runs it (:mod:`.pg_functions`): each parameter
        replaced by the expression given for it by name (a variable, a literal)."""
        return self.named % {_BOUND + name: expr for name, expr in exprs.items()}

    def args(self, **values: Any) -> tuple[Any, ...]:
        """The positional parameters, from their values by name."""
        return tuple(values[name] for name in self.names)

    def execute(self, conn: Connection, args: tuple[Any, ...]) -> CursorResult[Any]:
        """Run on a SQLAlchemy connection: on PostgreSQL the text, on the driver; elsewhere
        the dialect's Core form (its rows' JSON columns come back decoded either way)."""
        name = conn.dialect.name
        if name == "postgresql":
            return conn.exec_driver_sql(self.postgresql, args)
        return conn.execute(self.built[name], {_BOUND + n: arg for n, arg in zip(self.names, args)})


def statement(build: Callable[[Any], Any]) -> Statement:
    """A :class:`Statement` from ``build(insert)``, which gets the dialect's ``insert`` (both
    have ``ON CONFLICT``); its parameters must come out in the same order on both."""
    built = {name: build(_INSERTS[name]) for name in _DIALECTS}
    orders = {tuple(built[name].compile(dialect=dialect).positiontup or ()) for name, dialect in _DIALECTS.items()}
    assert len(orders) == 1, orders
    text, named = (" ".join(str(built["postgresql"].compile(dialect=d)).split()) for d in (_DIALECTS["postgresql"], _NAMED))
    return Statement(built, text, tuple(name.removeprefix(_BOUND) for name in orders.pop()), named)


def _p(name: str) -> sa.BindParameter[Any]:
    """The parameter ``name`` (bound as ``b_<name>``: SQLAlchemy keeps a column's own name
    for the value of that column in a ``SET`` or ``VALUES``)."""
    return sa.bindparam(_BOUND + name)


def _json(name: str) -> sa.BindParameter[Any]:
    """A JSON column's parameter: JSON text, as it is stored (see the module's docstring)."""
    return sa.bindparam(_BOUND + name, type_=sa.Text)


_NO_LEASE = {"lease_token": sa.null(), "lease_worker": sa.null(), "lease_attempt": sa.null()}
_ZERO: sa.ColumnClause[Any] = sa.literal_column("0")
_ONE: sa.ColumnClause[Any] = sa.literal_column("1")
_ZERO_S: sa.ColumnClause[Any] = sa.literal_column("0.0")

def _insert_call_if_absent(insert: Any) -> Any:
    return insert(calls).values(
        call_id=_p("call_id"), spec=_json("spec"), attempts=_ZERO, registered_at=_p("now"),
        recovery_until=_ZERO_S, handed_on=_ZERO, handed=_ZERO).on_conflict_do_nothing(index_elements=["call_id"])


#: Register a call unless its row exists (the row is what the row lock locks): (call_id,
#: spec JSON, now).
INSERT_CALL_IF_ABSENT = statement(_insert_call_if_absent)
#: :data:`INSERT_CALL_IF_ABSENT`, returning the call's id only if this inserted its row.
INSERT_NEW_CALL = statement(lambda insert: _insert_call_if_absent(insert).returning(calls.c.call_id))

#: Read a call's row with its recorded outcome (``outcome``, NULL if none) and lock the row
#: until the transaction ends; only the call's row is locked (SQLite: the ``BEGIN
#: IMMEDIATE`` write lock already serializes, ``FOR UPDATE`` renders as nothing): (call_id).
SELECT_CALL_AND_RESULT_FOR_UPDATE = statement(lambda insert: sa.select(calls, results.c.outcome)
    .outerjoin(results, results.c.call_id == calls.c.call_id)
    .where(calls.c.call_id == _p("call_id"))
    .with_for_update(of=calls))

#: Keep the spec in force (``lifecycle.merge_spec``): (spec JSON, call_id).
UPDATE_CALL_SPEC = statement(lambda insert: calls.update().where(calls.c.call_id == _p("call_id"))
                             .values(spec=_json("spec")))

#: Count a new attempt, give its lease to the claiming worker (its expiry, or a session
#: lease's ``lifecycle.sweep_hint``), and end any recovery hold: the republished call was
#: claimed, so a later crash may be recovered at once: (attempt, token, worker, attempt,
#: hint, call_id).
CLAIM_ATTEMPT = statement(lambda insert: calls.update().where(calls.c.call_id == _p("call_id")).values(
    attempts=_p("attempt"), lease_token=_p("token"), lease_worker=_p("worker"), lease_attempt=_p("attempt"),
    lease_expires_at=_p("hint"), recovery_until=_ZERO_S))

#: Record the call's one result. Only a write under the call's row lock that found no result
#: inserts one; a second insert would break the primary key: (call_id, outcome JSON, now).
INSERT_RESULT = statement(lambda insert: results.insert().values(
    call_id=_p("call_id"), outcome=_json("outcome"), recorded_at=_p("now")))

#: Free the lease of a call whose result was just recorded, and mark its row as one the
#: recovery sweep never reads (``lifecycle.FINISHED_HINT``): (hint, call_id).
CLEAR_FINISHED_LEASE = statement(lambda insert: calls.update().where(calls.c.call_id == _p("call_id"))
                                 .values(**_NO_LEASE, lease_expires_at=_p("hint")))

#: Free a call's lease if the lease with ``token`` holds it: (call_id, token).
CLEAR_LEASE_OF = statement(lambda insert: calls.update()
                           .where(calls.c.call_id == _p("call_id"), calls.c.lease_token == _p("token"))
                           .values(**_NO_LEASE, lease_expires_at=sa.null()))

#: Mark the lease's attempt as the one that handed the call on, free the lease, and let the
#: call wait for its next delivery as if registered ``now``; matches no row unless that lease
#: still holds the call: (attempt, now, call_id, token).
HAND_ON_ATTEMPT = statement(lambda insert: calls.update()
                            .where(calls.c.call_id == _p("call_id"), calls.c.lease_token == _p("token"))
                            .values(handed_on=_p("attempt"), handed=calls.c.handed + _ONE, registered_at=_p("now"),
                                    **_NO_LEASE, lease_expires_at=sa.null()))

#: Move a lease's expiry (a session lease's sweep hint) on, if the lease with ``token`` holds
#: the call: (hint, call_id, token).
RENEW_LEASE = statement(lambda insert: calls.update()
                        .where(calls.c.call_id == _p("call_id"), calls.c.lease_token == _p("token"))
                        .values(lease_expires_at=_p("hint")))

#: Append an audit event unless one with its id exists (no ``RETURNING`` of the new row's
#: id, which nobody reads): (event_id, call_id, type, attempt, data JSON, at).
INSERT_EVENT_IF_ABSENT = statement(lambda insert: insert(events).inline().values(
    event_id=_p("event_id"), call_id=_p("call_id"), type=_p("type"), attempt=_p("attempt"), data=_json("data"),
    at=_p("at")).on_conflict_do_nothing(index_elements=["event_id"]))

#: Replace a call's result (a settlement: ``lifecycle.plan_settle``): (outcome JSON, call_id).
UPDATE_RESULT = statement(lambda insert: results.update().where(results.c.call_id == _p("call_id"))
                          .values(outcome=_json("outcome")))


def _upsert_checkpoint(insert: Any) -> Any:
    stmt: Any = insert(checkpoints).values(call_id=_p("call_id"), checkpoint=_p("checkpoint"), saved_at=_p("now"))
    return stmt.on_conflict_do_update(index_elements=["call_id"], set_={
        "checkpoint": stmt.excluded.checkpoint, "saved_at": stmt.excluded.saved_at})


#: Keep ``checkpoint`` as the call's last one: (call_id, checkpoint, now).
UPSERT_CHECKPOINT = statement(_upsert_checkpoint)

#: The data of one audit event, by its id: (event_id).
SELECT_EVENT_DATA = statement(lambda insert: sa.select(events.c.data).where(events.c.event_id == _p("event_id")))


class SQLWriter(CallWriter):
    """The writes of one locked call on a SQL store, as :data:`statements <CLAIM_ATTEMPT>`
    that ``run`` sends in the call's transaction at ``now``: the one applier of
    :class:`~aaa_celery.lifecycle.Writes` on SQLite and PostgreSQL."""

    __slots__ = ("run", "call_id", "now")

    def __init__(self, run: Callable[[Statement, tuple[Any, ...]], object], call_id: str, now: float) -> None:
        self.run, self.call_id, self.now = run, call_id, now

    def claim(self, lease: Lease) -> None:
        self.run(CLAIM_ATTEMPT, CLAIM_ATTEMPT.args(attempt=lease.attempt, token=lease.token, worker=lease.worker,
                                                   hint=sweep_hint(lease, self.now), call_id=self.call_id))

    def record(self, outcome: Outcome) -> None:
        self.run(INSERT_RESULT, INSERT_RESULT.args(call_id=self.call_id, outcome=outcome_json(outcome), now=self.now))
        self.run(CLEAR_FINISHED_LEASE, CLEAR_FINISHED_LEASE.args(hint=FINISHED_HINT, call_id=self.call_id))

    def append(self, event: Draft) -> None:
        e = event.stamp(self.now)
        self.run(INSERT_EVENT_IF_ABSENT, INSERT_EVENT_IF_ABSENT.args(
            event_id=e.id, call_id=e.call_id, type=e.type, attempt=e.attempt, data=dumps(e.data), at=e.at))

    def let_go(self, token: str) -> None:
        self.run(CLEAR_LEASE_OF, CLEAR_LEASE_OF.args(call_id=self.call_id, token=token))

    def settle(self, outcome: Outcome) -> None:
        self.run(UPDATE_RESULT, UPDATE_RESULT.args(outcome=outcome_json(outcome), call_id=self.call_id))

    def checkpoint(self, checkpoint: str) -> None:
        self.run(UPSERT_CHECKPOINT, UPSERT_CHECKPOINT.args(call_id=self.call_id, checkpoint=checkpoint, now=self.now))

    def renew(self, lease: Lease) -> None:
        self.run(RENEW_LEASE, RENEW_LEASE.args(hint=self.now + lease.ttl_s, call_id=self.call_id, token=lease.token))

    def hand_on(self, lease: Lease) -> None:
        self.run(HAND_ON_ATTEMPT, HAND_ON_ATTEMPT.args(attempt=lease.attempt, now=self.now, call_id=self.call_id,
                                                       token=lease.token))


def lock_call(read: Callable[[Statement, tuple[Any, ...]], Any], write: Callable[[Statement, tuple[Any, ...]], object],
              spec: CallSpec, now: float) -> tuple[Any, CallSpec]:
    """Lock the call's row, creating it, and return the row with its recorded outcome
    (``row.outcome``), and the call's spec in force (``lifecycle.merge_spec``, written back if
    it changed). ``read`` runs a statement and returns its first row (None if none); ``write``
    runs one. A registered call (the usual case at ``begin`` and ``finish``) takes one read."""
    row = read(SELECT_CALL_AND_RESULT_FOR_UPDATE, (spec.call_id,))
    if row is None:
        write(INSERT_CALL_IF_ABSENT, INSERT_CALL_IF_ABSENT.args(call_id=spec.call_id, spec=dumps(spec.__dict__),
                                                                now=now))
        row = read(SELECT_CALL_AND_RESULT_FOR_UPDATE, (spec.call_id,))
        assert row is not None
    stored = CallSpec(**row.spec)
    kept = merge_spec(stored, spec)
    if kept is not stored:
        write(UPDATE_CALL_SPEC, UPDATE_CALL_SPEC.args(spec=dumps(kept.__dict__), call_id=kept.call_id))
    return row, kept
