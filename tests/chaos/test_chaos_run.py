"""A seeded chaos run on real ``celery worker`` processes: the guard shows zero violations.

The CI run (100 calls, 3 workers, 20 faults) is part of the fleet suite (about a minute); the long one runs only
with ``AAA_CHAOS_LONG=1``.
"""

from __future__ import annotations

import os

import pytest

from aaa_celery.chaos.report import format_table
from aaa_celery.chaos.workload import ChaosConfig, ChaosRun

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def chaos(redis_url: str, tmp_path, **kw) -> dict:
    config = ChaosConfig(broker=redis_url, workdir=str(tmp_path / "chaos"), **kw)
    report = ChaosRun(config).run().to_dict()
    print(format_table(report))
    return report


def test_ci_chaos_run_100_calls_3_workers_20_faults_has_no_violations(redis_url, tmp_path):
    # The short seeded run CI makes on every push (about a minute here).
    report = chaos(redis_url, tmp_path, calls=100, workers=3, concurrency=2, faults=20, ttl_s=2.0, seed=7,
                   drain_s=90)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    assert sum(report["faults"].values()) >= 18, report["fault_log"]  # the nemesis really acted
    assert len([k for k, n in report["faults"].items() if n]) >= 4  # of several kinds
    assert report["summary"]["body_starts"] >= 100


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AAA_CHAOS_LONG") != "1", reason="set AAA_CHAOS_LONG=1 for the long chaos run")
@pytest.mark.timeout(1800)
def test_long_chaos_run_has_no_violations(redis_url, tmp_path):
    report = chaos(redis_url, tmp_path, calls=int(os.environ.get("AAA_CHAOS_CALLS", 300)), workers=3,
                   concurrency=2, faults=int(os.environ.get("AAA_CHAOS_FAULTS", 60)), ttl_s=2.0, seed=5,
                   drain_s=120)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AAA_CHAOS_STORE_FAULTS") != "1",
                    reason="set AAA_CHAOS_STORE_FAULTS=1 for the chaos run with store faults (about 150 s)")
@pytest.mark.xfail(strict=False, reason=(
    "issue 13 item 3, open: a call published while the store restarts is sent but not registered; "
    "its delivery finds the store down and is handed back, and the call was lost (seed 11: 1 of 100)"))
def test_ci_chaos_run_with_store_pause_and_restart_has_no_violations(redis_url, tmp_path):
    # Issue 13: the nemesis breaks the store too. The run starts its own store redis-server
    # with AOF; store_pause pauses its writes past the lease TTL, store_restart kills it -9
    # and starts it again on its AOF.
    kinds = ("kill_main", "kill_child", "stop_cont", "duplicate", "store_pause", "store_restart")
    report = chaos(redis_url, tmp_path, calls=100, workers=3, concurrency=2, faults=20, ttl_s=2.0, seed=11,
                   drain_s=90, kinds=kinds)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    assert sum(report["faults"].values()) >= 18, report["fault_log"]
    assert report["faults"].get("store_pause", 0) >= 1 and report["faults"].get("store_restart", 0) >= 1
    assert report["summary"]["body_starts"] >= 100
