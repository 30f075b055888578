"""A seeded chaos run on real ``celery worker`` processes: the guard shows zero violations.

The CI run (100 calls, 3 workers, 23 faults planned, at least 20 of them made, store faults among them) is part of the fleet suite (about a minute); the long one runs only
with ``AAA_CHAOS_LONG=1``.
"""

from __future__ import annotations

import os

import pytest

from aaa_celery.chaos.report import format_table
from aaa_celery.chaos.workload import (
    CLOCK_FAULTS,
    PARTITION_FAULTS,
    STORE_FAULTS,
    WORKER_FAULTS,
    ChaosConfig,
    ChaosRun,
)

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


#: What a chaos call may end as: its body's value, or the delivery policy's answer to a loss.
#: Any other error (a RuntimeError, a TypeError) is the guard's or the harness's bug.
ENDINGS = {"completed", "OutcomeUnknown", "ExecutionAbandoned", "no result"}


def chaos(redis_url: str, tmp_path, **kw) -> dict:
    config = ChaosConfig(broker=redis_url, workdir=str(tmp_path / "chaos"), **kw)
    report = ChaosRun(config).run().to_dict()
    print(format_table(report))
    assert set(report["summary"]["results"]) <= ENDINGS, report["summary"]["results"]
    return report


def test_ci_chaos_run_100_calls_3_workers_20_faults_has_no_violations(redis_url, tmp_path):
    # The short seeded run CI makes on every push (about a minute here). Issue 13: the
    # nemesis breaks the store too. The run starts its own store redis-server with AOF;
    # store_pause pauses its writes past the lease TTL, store_restart kills it -9 and
    # starts it again on its AOF.
    # Issue 41: the store waits for its replica (replicas=1), so a store_failover loses no
    # write of a call and its calls are held to every invariant, none excused.
    # Issue 40: a third of the calls have a concurrency limit (2 a key, on_busy="wait"), held to I9.
    report = chaos(redis_url, tmp_path, calls=100, workers=3, concurrency=2, faults=23, ttl_s=2.0, seed=7,
                   drain_s=90, kinds=(*WORKER_FAULTS, "duplicate", *STORE_FAULTS), store_replicas=1,
                   limited_share=0.3)
    assert report["violations"] == []
    assert report["config"]["limited_share"] == 0.3
    assert report["documented_exceptions"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    acted = [f for f in report["fault_log"] if f["done_at"] is not None and not f["skipped"]]
    assert len(acted) >= 20, report["fault_log"]  # the nemesis really acted
    assert len([k for k, n in report["faults"].items() if n]) >= 4  # of several kinds
    assert all(report["faults"].get(kind, 0) >= 1 for kind in STORE_FAULTS), report["faults"]
    assert report["summary"]["body_starts"] >= 100


def test_ci_partition_run_100_calls_20_faults_has_no_violations(redis_url, tmp_path):
    # Issue 24: the nemesis cuts the network. Each worker reaches the store and the broker
    # through a TCP proxy of its own; partition_store / partition_broker cut one path both
    # ways, one way or with resets, past the lease TTL; slow_store delays it by seconds.
    report = chaos(redis_url, tmp_path, calls=100, workers=3, concurrency=2, faults=20, ttl_s=2.0, seed=11,
                   drain_s=90, kinds=(*PARTITION_FAULTS, "kill_child"))
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    acted = [f for f in report["fault_log"] if f["done_at"] is not None and not f["skipped"]]
    assert len(acted) >= 18, report["fault_log"]
    assert all(report["faults"].get(kind, 0) >= 1 for kind in PARTITION_FAULTS), report["faults"]
    cuts = {f["target"].split(" path ")[1].split(",")[0] for f in acted if f["kind"].startswith("partition")}
    assert len(cuts) >= 3, cuts  # both ways, one way, reset: several ways of cutting
    assert report["summary"]["body_starts"] >= 100


def test_ci_chaos_run_with_effects_in_the_apps_database_applies_each_effect_once(redis_url, postgres_url, tmp_path):
    # Issue 24: keyed calls apply their effect as a row of a PostgreSQL table through
    # aaa_celery.effects.once, one row per application (the table never deduplicates); I6
    # counts those rows, not results: exactly one per completed keyed call, never two.
    report = chaos(redis_url, tmp_path, calls=100, workers=3, concurrency=2, faults=30, ttl_s=2.0, seed=13,
                   drain_s=90, keyed_share=1.0, at_most_once_share=0.15, kinds=("kill_child", "kill_main", "stop_cont"),
                   effects_db=postgres_url)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
    acted = [f for f in report["fault_log"] if f["done_at"] is not None and not f["skipped"]]
    assert len(acted) >= 15, report["fault_log"]  # some find no worker up while the others restart
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key, count(*) FROM chaos_effects GROUP BY key")).all()
    engine.dispose()
    assert rows and all(n == 1 for _, n in rows), rows
    assert report["summary"]["effects_applied"] == len(rows)
    # attempts that came after an effect committed found it and applied nothing again
    assert report["summary"]["effects_deduplicated_by_key"] >= 3, report["summary"]


#: Every fault kind a Redis store has, the clock nemesis among them (issue 43's acceptance);
#: SQLite has no store server to break and no network path to cut.
EVERY_REDIS_KIND = (*WORKER_FAULTS, *CLOCK_FAULTS, "duplicate", *STORE_FAULTS, *PARTITION_FAULTS)


@pytest.mark.parametrize(("store", "seed", "kinds"), [
    ("redis", 62, EVERY_REDIS_KIND),
    ("sqlite", 1, (*WORKER_FAULTS, *CLOCK_FAULTS)),
])
def test_ci_clock_nemesis_run_with_every_fault_kind_has_no_violations(redis_url, tmp_path, store, seed, kinds):
    # Issue 43: the clock nemesis restarts workers with their wall clock up to 300 s ahead or
    # behind (libfaketime), among every other fault kind. Leases are judged on the store's clock
    # (Redis TIME; SQLite: the machine's kernel clock), so a skewed worker never takes a live
    # call over, and never turns a healthy call into OutcomeUnknown or ExecutionAbandoned: I8
    # finds no in-doubt result and no re-run without a lost attempt. Seed 62 skews five times
    # among all twelve kinds (24 faults), seed 1 skews all three slots early. On SQLite judging
    # leases on each process's own time.time() breaks it (seen red on 2026-12-04: a re-run
    # without a lost attempt, I8, and calls left without a result, I1).
    extra = {"store": f"sqlite:///{tmp_path}/store.db"} if store == "sqlite" else {"store_replicas": 1}
    # SQLite's machine clock puts a skewed worker within 1 s of the others (docs/recovery.md), so
    # its leases may look up to 1 s shorter to them: a 2 s lease renewed every 0.67 s left no margin
    # (CI of f094ca9: a skewed holder's lease, 0.95 s short on this boot, lapsed for the others under
    # load; I2 caught the overlap). 4 s keeps a margin above that second.
    report = chaos(redis_url, tmp_path, calls=80, workers=3, concurrency=2, faults=24 if store == "redis" else 16,
                   ttl_s=2.0 if store == "redis" else 4.0, seed=seed, drain_s=90, kinds=kinds, **extra)
    assert report["violations"] == []
    assert report["documented_exceptions"] == []
    assert report["summary"]["violations"]["I8"] == 0
    assert report["summary"]["results"].get("no result", 0) == 0
    skews = [f for f in report["fault_log"] if f["kind"] == "clock_skew" and f["done_at"] is not None]
    assert len(skews) >= 3, report["fault_log"]  # the clock nemesis really acted
    assert any(" s (" in f["target"] or f["target"].endswith(" s") for f in skews), skews
    assert len([k for k, n in report["faults"].items() if n]) >= (8 if store == "redis" else 4)  # of several kinds
    assert report["summary"]["body_starts"] >= 80


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AAA_CHAOS_LONG") != "1", reason="set AAA_CHAOS_LONG=1 for the long chaos run")
@pytest.mark.timeout(1800)
def test_long_chaos_run_has_no_violations(redis_url, tmp_path):
    report = chaos(redis_url, tmp_path, calls=int(os.environ.get("AAA_CHAOS_CALLS", 300)), workers=3,
                   concurrency=2, faults=int(os.environ.get("AAA_CHAOS_FAULTS", 60)), ttl_s=2.0, seed=5,
                   drain_s=120)
    assert report["violations"] == []
    assert report["summary"]["results"].get("no result", 0) == 0
