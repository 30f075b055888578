"""The store interfaces by job (stores/base.py): each small, each with its own conformance
suite that exercises every one of its verbs on every backend."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from aaa_celery.stores.base import Budgets, CallStore, Checkpoints, Operations, RecoveryIndex, SchemaVersions, Store
from aaa_celery.stores.runs import RunJournal, RunRecords

HERE = Path(__file__).parent
#: Each interface -> the conformance suite (in tests/stores) that covers it.
SUITES = {
    CallStore: "test_conformance.py",
    Checkpoints: "test_checkpoints.py",
    RecoveryIndex: "test_recovery_index.py",
    Operations: "test_store_ops.py",
    Budgets: "test_conformance_budgets.py",
    RunRecords: "test_run_records.py",
    RunJournal: "test_run_records.py",
    SchemaVersions: "test_schema_version.py",
}
MAX_VERBS = 12


def verbs(interface: type) -> list[str]:
    return [name for name, member in vars(interface).items() if inspect.isfunction(member) and not name.startswith("_")]


def test_a_store_is_every_interface_and_nothing_else():
    assert set(SUITES) <= set(Store.__mro__)
    own = set(verbs(Store)) - {"now", "close", "abandon"}  # its clock and connections; abandon is record's
    assert not own, f"Store verbs outside every interface: {sorted(own)}"


@pytest.mark.parametrize("interface", list(SUITES), ids=lambda i: i.__name__)
def test_each_interface_is_small_and_its_suite_calls_every_verb(interface: type):
    names = verbs(interface)
    assert 0 < len(names) <= MAX_VERBS, f"{interface.__name__} has {len(names)} verbs"
    suite = (HERE / SUITES[interface]).read_text()
    missing = [n for n in names if not re.search(rf"\.{n}\(", suite)]
    assert not missing, f"{SUITES[interface]} never calls {interface.__name__}.{missing}"


#: Every verb of the store interfaces with its signature: what a custom store (a subclass of
#: ``Store`` written for an earlier release) implements and the guard calls. A change here is a
#: change of the public API: a new optional argument passed only when given (as ``finish``'s
#: ``copy``, 0.2.0) keeps 0.1 stores working; anything else needs a CHANGELOG entry and a
#: release note.
FROZEN_VERBS = {
    'CallStore.register': '(self, call: CallSpec) -> None',
    'CallStore.register_many': '(self, calls: list[CallSpec]) -> None',
    'CallStore.begin': '(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult',
    'CallStore.renew': '(self, lease: Lease) -> bool',
    'CallStore.finish': '(self, lease: Lease, outcome: Outcome, config: GuardConfig, copy: ResultCopy | None = None) -> FinishResult',
    'CallStore.release': '(self, lease: Lease) -> None',
    'CallStore.hand_on': '(self, lease: Lease) -> None',
    'CallStore.fenced': '(self, lease: Lease, cause: str | None = None) -> None',
    'CallStore.record': '(self, call: CallSpec, outcome: Outcome, kind: RecordKind = first) -> bool',
    'CallStore.events': '(self, call_id: str) -> list[Event]',
    'CallStore.result': '(self, call_id: str) -> Outcome | None',
    'Checkpoints.save_checkpoint': '(self, lease: Lease, checkpoint: str) -> bool',
    'Checkpoints.last_checkpoint': '(self, call_id: str) -> Checkpoint | None',
    'RecoveryIndex.expired': '(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]',
    'RecoveryIndex.claim_recovery': '(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int',
    'RecoveryIndex.abandon': '(self, call: CallSpec, outcome: Outcome) -> bool',
    'Operations.calls': '(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]',
    'Operations.resolve': '(self, call_id: str, verdict: "Literal[completed, failed]", note: str, by: str, value: Any = None) -> Outcome',
    'Operations.settle': '(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool',
    'Operations.purge': '(self, before: float) -> int',
    'Budgets.spend': '(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool',
    'RunRecords.put_run': '(self, record: RunRecord) -> None',
    'RunRecords.get_run': '(self, key: str) -> RunRecord | None',
    'RunRecords.list_runs': '(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False, limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]',
    'RunRecords.find_runs': '(self, run_id: str) -> list[RunRecord]',
    'RunRecords.lease_run': '(self, key: str, holder: str, ttl_s: float) -> bool',
    'RunRecords.release_run': '(self, key: str, holder: str) -> None',
    'RunRecords.forget_run': '(self, key: str) -> None',
    'RunRecords.purge_runs': '(self, before: float) -> int',
    'RunJournal.append_run_events': '(self, key: str, events: Sequence[dict[str, Any]]) -> None',
    'RunJournal.run_events': '(self, key: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]',
    'RunJournal.record_turn': '(self, key: str, turn: int, response: dict[str, Any]) -> dict[str, Any]',
    'RunJournal.recorded_turn': '(self, key: str, turn: int) -> dict[str, Any] | None',
    'RunJournal.decide_approval': '(self, key: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool',
    'RunJournal.approval_decision': '(self, key: str, call_id: str, digest: str) -> dict[str, Any] | None',
    'SchemaVersions.schema_version': '(self) -> StoreVersion',
    'SchemaVersions.migrate': '(self) -> StoreVersion',
    'Store.now': '(self) -> float',
    'Store.abandon': '(self, call: CallSpec, outcome: Outcome) -> bool',
    'Store.close': '(self) -> None',
}


def test_the_verbs_of_the_store_interfaces_and_their_signatures_are_frozen():
    seen = {}
    for interface in [*SUITES, Store]:
        for name in verbs(interface):
            sig = str(inspect.signature(getattr(interface, name))).replace("'", "")
            seen[f"{interface.__name__}.{name}"] = sig
    assert seen == FROZEN_VERBS
