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
