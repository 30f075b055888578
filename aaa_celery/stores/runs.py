"""Run records: an agent run's state, kept in the same store as its tool calls.

The engine (``aaa_celery.runtime``) writes a run's record as the run goes, so any
process that opens the store (another web process, a worker, a fresh process
after a deploy) can list runs, read a run's events, decide its approvals and
resume it. These operations are a part of the store interface of their own,
apart from the call lifecycle (``begin`` ... ``finish``); every backend has them,
under one conformance suite (``tests/stores/test_run_records.py``).

One process drives a run at a time: the holder of the run's lease
(:meth:`RunRecords.lease_run`, a TTL lease renewed by a heartbeat, as a tool
call's). Only the holder writes the record, the events and the model turns, so
those writes need no compare-and-set. What other processes write is first-writer-
wins: an approval decision (:meth:`~RunRecords.decide_approval`, once per request
digest) and a model turn (:meth:`~RunRecords.record_turn`).

Keys and layout per backend:

- memory: dicts under the store's lock; at most ``run_retention`` finished runs kept.
- SQL: the tables ``aaa_runs`` (one row a run: the record as JSON, its tenant,
  times, status and lease), ``aaa_run_events`` (run id, seq), ``aaa_run_turns``
  (run id, turn) and ``aaa_run_decisions`` (run id, call id, digest).
- Redis: every key of a run, and its shard's indexes, under one hash tag
  ``{<prefix>:r<shard>}`` (Redis Cluster safe); a finished run's keys expire after
  the store's ``retention_s``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..protocol import call_id

#: Statuses of a run that is still going (someone must drive it).
ACTIVE = frozenset({"running", "waiting"})
#: Statuses of a run that ended.
FINISHED = frozenset({"completed", "failed", "cancelled"})


@dataclass
class RunRecord:
    """A run as the store keeps it.

    Attributes:
        run_id: the run's id (two tenants' runs of one id are two runs: see :attr:`key`).
        tenant: the run's tenant (None: no tenant).
        algo: the name of the algorithm that drives it (to resume it).
        input: the run's input (JSON).
        status: ``running``, ``waiting`` (for a person), ``completed``, ``failed``, ``cancelled``.
        started_at: when the run started (``time.time()``).
        updated_at: when its record was last written.
        outcome: ``{"status", "value", "error"}`` once it ended.
        approvals: every request for approval of the run, by call id: the request as
            shown (``PendingApproval.to_dict()`` plus ``args_hash``) and its ``state``
            (``open``, ``granted``, ``denied``, ``expired``).
        resumed: how many times the run was resumed.
        events: how many events the run has (set by reads: the event cursor's end).
        holder: who holds the run's lease (set by reads; None when nobody does).
    """

    run_id: str
    tenant: str | None = None
    algo: str = ""
    input: Any = None
    status: str = "running"
    started_at: float = 0.0
    updated_at: float = 0.0
    outcome: dict[str, Any] | None = None
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    resumed: int = 0
    events: int = 0
    holder: str | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def orphaned(self) -> bool:
        """Still going, but nobody drives it (its driver died or stopped)."""
        return self.active and self.holder is None

    def to_json(self) -> str:
        """The stored part (without ``events`` and ``holder``, which reads fill in)."""
        data = asdict(self)
        data.pop("events"), data.pop("holder")
        return dumps(data)

    @classmethod
    def from_json(cls, raw: str | bytes | dict[str, Any], *, events: int = 0, holder: str | None = None) -> RunRecord:
        data = json.loads(raw) if isinstance(raw, str | bytes) else dict(raw)
        return cls(**data, events=events, holder=holder)

    @property
    def key(self) -> str:
        """The run's key in the store: ``<tenant>:<run id>`` (escaped as a call id's first two
        parts), so two tenants' runs with one run id are two runs."""
        return run_key(self.tenant, self.run_id)

    @property
    def cursor(self) -> tuple[float, str]:
        """Where a page of ``list_runs`` that ends with this run ends (its ``before`` for the next)."""
        return (self.started_at, self.key)


def run_key(tenant: str | None, run_id: str) -> str:
    """The store key of run ``run_id`` of ``tenant``: the prefix of each of its calls' ids."""
    return call_id(tenant, run_id, "r")[:-2]


def tenant_key(tenant: str | None) -> str:
    """A tenant as an index key: JSON, so None and every string stay distinct."""
    return json.dumps(tenant)


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


class RunRecords:
    """A store's run records: each run's record, its indexes (tenant, time, active) and
    its lease (see the module's docstring). Its trail is :class:`RunJournal`'s."""

    def put_run(self, record: RunRecord) -> None:
        """Write a run's record (create or replace), and keep its indexes (tenant, time,
        active) in step. Only the run's lease holder writes it."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def get_run(self, key: str) -> RunRecord | None:
        """The record of the run with this :attr:`~RunRecord.key`, with its event count and live
        lease holder; None if unknown. (Every operation on one run takes its key.)"""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def list_runs(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False,
                  limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]:
        """Up to ``limit`` runs of ``tenant`` (every tenant's with ``all_tenants``), newest
        first by ``(started_at, key)``, those older than the cursor ``before`` (the
        :attr:`~RunRecord.cursor` of the last run of the page before); only runs still going
        with ``active``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def find_runs(self, run_id: str) -> list[RunRecord]:
        """Every tenant's run with this run id (an operator's lookup by id alone)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def lease_run(self, key: str, holder: str, ttl_s: float) -> bool:
        """Take the run's lease for ``ttl_s`` seconds, or renew it: True if ``holder`` holds
        it now (it was free, it lapsed, or ``holder`` held it); False if another holds it."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def release_run(self, key: str, holder: str) -> None:
        """Give the run's lease back, if ``holder`` holds it."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def forget_run(self, key: str) -> None:
        """Delete a run's record, events, turns and decisions (its calls stay)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def purge_runs(self, before: float) -> int:
        """Delete the finished runs last written before ``before`` (``time.time()``);
        returns how many."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")


class RunJournal:
    """What a run keeps as it goes, by its key: its events, the model's answers turn by turn,
    and the decisions on its requests for approval (each written once)."""

    def append_run_events(self, key: str, events: Sequence[dict[str, Any]]) -> None:
        """Append events (each with its ``seq``, 1, 2, ...): an event is kept only if its
        ``seq`` is the next one, so a retried append writes nothing twice."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def run_events(self, key: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The run's events with ``seq > after``, in order (at most ``limit``)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def record_turn(self, key: str, turn: int, response: dict[str, Any]) -> dict[str, Any]:
        """Record the model's answer of a turn, first writer wins; returns the recorded one."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def recorded_turn(self, key: str, turn: int) -> dict[str, Any] | None:
        """The model's recorded answer of a turn, if any."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def decide_approval(self, key: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool:
        """Record a person's decision on the request ``digest``: True for the first decision
        only (a request is decided once, by whichever process gets there first)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")

    def approval_decision(self, key: str, call_id: str, digest: str) -> dict[str, Any] | None:
        """The decision recorded on the request ``digest``, if any."""
        raise NotImplementedError(f"{type(self).__name__} keeps no run records")


__all__ = ["ACTIVE", "FINISHED", "RunJournal", "RunRecord", "RunRecords", "run_key", "tenant_key"]
