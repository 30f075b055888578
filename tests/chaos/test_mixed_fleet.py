"""A mixed-version fleet (issue 20 item 6): a seeded chaos run, worker faults and duplicate
deliveries, with half of the workers on 0.1.0 (commit c79799f, built from git history:
``tests/old_release.py``) and half on this release, one broker and one store, migrated
first as docs/upgrading.md says. The guard's invariants hold across both: 0 violations,
and workers of each release ran calls (some calls are taken over across releases).

The CI run is short (40 calls, 4 workers); ``AAA_CHAOS_LONG=1`` runs a longer one.
"""

from __future__ import annotations

import os

import pytest

from aaa_celery.chaos.report import format_table
from aaa_celery.chaos.workload import WORKER_FAULTS, ChaosConfig, ChaosRun
from aaa_celery.stores import open_store

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def mixed(redis_url: str, tmp_path, old_release, **kw) -> tuple[dict, dict[str, set[str]]]:
    config = ChaosConfig(broker=redis_url, workdir=str(tmp_path / "chaos"), old_python=str(old_release.python),
                         kinds=(*WORKER_FAULTS, "duplicate"), **kw)
    run = ChaosRun(config)
    report = run.run().to_dict()
    print(format_table(report))
    # Which release's workers began each call's attempts (the started events name the worker).
    began: dict[str, set[str]] = {}
    with open_store(redis_url) as store:
        for call in run.sent:
            for event in store.events(call.call_id):
                if event.type == "aaa.tool.started":
                    worker = str(event.data.get("worker", ""))
                    began.setdefault(call.call_id, set()).add("0.1.0" if "-old@" in worker else "new")
    return report, began


def test_ci_mixed_fleet_of_0_1_0_and_this_release_has_no_violations(redis_url, tmp_path, old_release):
    report, began = mixed(redis_url, tmp_path, old_release, calls=40, workers=4, concurrency=1, faults=10,
                          ttl_s=2.0, seed=11, drain_s=90)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    releases = set().union(*began.values())
    assert releases == {"0.1.0", "new"}, began  # both releases ran calls
    acted = [f for f in report["fault_log"] if f["done_at"] is not None and not f["skipped"]]
    assert len(acted) >= 6, report["fault_log"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AAA_CHAOS_LONG") != "1", reason="set AAA_CHAOS_LONG=1 for the long chaos run")
@pytest.mark.timeout(1800)
def test_long_mixed_fleet_has_no_violations(redis_url, tmp_path, old_release):
    report, began = mixed(redis_url, tmp_path, old_release, calls=int(os.environ.get("AAA_CHAOS_CALLS", 300)),
                          workers=4, concurrency=2, faults=int(os.environ.get("AAA_CHAOS_FAULTS", 60)), ttl_s=2.0,
                          seed=5, drain_s=120)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    assert set().union(*began.values()) == {"0.1.0", "new"}
