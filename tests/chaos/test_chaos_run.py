"""A seeded chaos run on real ``celery worker`` processes: the guard shows zero violations.

The short run is part of the fleet suite (about a minute); the long one runs only
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


def test_short_chaos_run_has_no_violations(redis_url, tmp_path):
    report = chaos(redis_url, tmp_path, calls=20, workers=2, concurrency=2, faults=5, ttl_s=2.0, seed=4,
                   drain_s=60)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    assert sum(report["faults"].values()) >= 4, report["fault_log"]  # the nemesis really acted
    assert report["summary"]["body_starts"] >= 20


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AAA_CHAOS_LONG") != "1", reason="set AAA_CHAOS_LONG=1 for the long chaos run")
@pytest.mark.timeout(1800)
def test_long_chaos_run_has_no_violations(redis_url, tmp_path):
    report = chaos(redis_url, tmp_path, calls=int(os.environ.get("AAA_CHAOS_CALLS", 300)), workers=3,
                   concurrency=2, faults=int(os.environ.get("AAA_CHAOS_FAULTS", 60)), ttl_s=2.0, seed=5,
                   drain_s=120)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
