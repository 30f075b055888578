"""Run records in the SQL stores (see :mod:`..runs`): four tables beside the calls' tables
(:mod:`.schema`), and the statements on them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...lifecycle import lapsed
from ..runs import ACTIVE, FINISHED, RunJournal, RunRecord, RunRecords, tenant_key
from .queries import lapsed_at
from .schema import run_decisions, run_events, run_turns, runs

_RUN_TABLES = (run_events, run_turns, run_decisions, runs)
#: Finished runs deleted per transaction by ``purge_runs``.
_PURGE_PAGE = 500


class SQLRuns(RunRecords, RunJournal):
    """The run-record operations of the SQL stores."""

    insert: Callable[[sa.Table], Any]
    now: Callable[[], float]

    _write: Callable[[], AbstractContextManager[Connection]]
    _read: Callable[[], AbstractContextManager[Connection]]

    def _view(self, conn: Connection, row: Any, now: float) -> RunRecord:
        count = conn.execute(sa.select(sa.func.count()).where(run_events.c.run_key == row.run_key)).scalar_one()
        live = row.lease_holder if row.lease_holder is not None and not lapsed(row.lease_expires_at, now) else None
        return RunRecord.from_json(row.record, events=count, holder=live)

    def put_run(self, record: RunRecord) -> None:
        values = {"tenant_key": tenant_key(record.tenant), "started_at": record.started_at,
                  "updated_at": record.updated_at, "status": record.status, "record": json.loads(record.to_json())}
        with self._write() as conn:
            stmt = self.insert(runs).values(run_key=record.key, run_id=record.run_id, **values)
            conn.execute(stmt.on_conflict_do_update(index_elements=["run_key"], set_=values))

    def get_run(self, key: str) -> RunRecord | None:
        with self._read() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_key == key)).one_or_none()
            return self._view(conn, row, self.now()) if row is not None else None

    def list_runs(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False,
                  limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]:
        stmt = sa.select(runs)
        if not all_tenants:
            stmt = stmt.where(runs.c.tenant_key == tenant_key(tenant))
        if active:
            stmt = stmt.where(runs.c.status.in_(sorted(ACTIVE)))
        if before is not None:
            stmt = stmt.where(sa.tuple_(runs.c.started_at, runs.c.run_key) < sa.tuple_(*before))
        return self._views(stmt.order_by(runs.c.started_at.desc(), runs.c.run_key.desc()).limit(limit))

    def find_runs(self, run_id: str) -> list[RunRecord]:
        return self._views(sa.select(runs).where(runs.c.run_id == run_id))

    def _views(self, stmt: sa.Select[Any]) -> list[RunRecord]:
        with self._read() as conn:
            now = self.now()
            return [self._view(conn, row, now) for row in conn.execute(stmt).all()]

    def append_run_events(self, key: str, events: Sequence[dict[str, Any]]) -> None:
        if not events:
            return
        with self._write() as conn:
            if not _known(conn, key):
                return
            count = conn.execute(sa.select(sa.func.count()).where(run_events.c.run_key == key)).scalar_one()
            rows = []
            for event in events:
                if event["seq"] == count + 1:
                    rows.append({"run_key": key, "seq": event["seq"], "event": event})
                    count += 1
            if rows:
                conn.execute(run_events.insert(), rows)

    def run_events(self, key: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        stmt = (sa.select(run_events.c.event).where(run_events.c.run_key == key, run_events.c.seq > after)
                .order_by(run_events.c.seq))
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as conn:
            return list(conn.execute(stmt).scalars())

    def record_turn(self, key: str, turn: int, response: dict[str, Any]) -> dict[str, Any]:
        with self._write() as conn:
            if not _known(conn, key):
                return response
            conn.execute(self.insert(run_turns).values(run_key=key, turn=turn, response=response)
                         .on_conflict_do_nothing(index_elements=["run_key", "turn"]))
            kept: dict[str, Any] = conn.execute(sa.select(run_turns.c.response).where(
                run_turns.c.run_key == key, run_turns.c.turn == turn)).scalar_one()
            return kept

    def recorded_turn(self, key: str, turn: int) -> dict[str, Any] | None:
        with self._read() as conn:
            response: dict[str, Any] | None = conn.execute(sa.select(run_turns.c.response).where(
                run_turns.c.run_key == key, run_turns.c.turn == turn)).scalar_one_or_none()
            return response

    def decide_approval(self, key: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool:
        with self._write() as conn:
            if not _known(conn, key):
                return False
            done = conn.execute(self.insert(run_decisions)
                                .values(run_key=key, call_id=call_id, digest=digest, decision=decision)
                                .on_conflict_do_nothing(index_elements=["run_key", "call_id", "digest"])
                                .returning(run_decisions.c.digest))
            return done.first() is not None  # (rowcount is -1 on psycopg for ON CONFLICT)

    def approval_decision(self, key: str, call_id: str, digest: str) -> dict[str, Any] | None:
        with self._read() as conn:
            decision: dict[str, Any] | None = conn.execute(sa.select(run_decisions.c.decision).where(
                run_decisions.c.run_key == key, run_decisions.c.call_id == call_id,
                run_decisions.c.digest == digest)).scalar_one_or_none()
            return decision

    def lease_run(self, key: str, holder: str, ttl_s: float) -> bool:
        with self._write() as conn:
            now = self.now()
            taken = conn.execute(
                runs.update()
                .where(runs.c.run_key == key,
                       sa.or_(runs.c.lease_holder.is_(None), runs.c.lease_holder == holder,
                              lapsed_at(runs.c.lease_expires_at, now)))
                .values(lease_holder=holder, lease_expires_at=now + ttl_s))
            return taken.rowcount == 1

    def release_run(self, key: str, holder: str) -> None:
        with self._write() as conn:
            conn.execute(runs.update().where(runs.c.run_key == key, runs.c.lease_holder == holder)
                         .values(lease_holder=None, lease_expires_at=None))

    def forget_run(self, key: str) -> None:
        with self._write() as conn:
            for table in _RUN_TABLES:
                conn.execute(table.delete().where(table.c.run_key == key))

    def purge_runs(self, before: float) -> int:
        purged = 0
        while True:
            with self._write() as conn:
                ids = list(conn.execute(
                    sa.select(runs.c.run_key)
                    .where(runs.c.status.in_(sorted(FINISHED)), runs.c.updated_at < before)
                    .limit(_PURGE_PAGE)).scalars())
                for table in _RUN_TABLES:
                    conn.execute(table.delete().where(table.c.run_key.in_(ids)))
            purged += len(ids)
            if len(ids) < _PURGE_PAGE:
                return purged


def _known(conn: Connection, key: str) -> bool:
    """Whether the run has a record: its events, turns and decisions are kept only then."""
    return conn.execute(sa.select(runs.c.run_key).where(runs.c.run_key == key)).first() is not None
