"""The guard's Prometheus metrics, scraped from real prefork workers after a run with a
takeover (a worker kill -9ed mid-call) and a duplicate delivery (a second copy of a running
call, dropped by the worker that received it)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from aaa_celery.testing import Ledger, duplicate_delivery, wait_for
from aaa_celery.testing.fleet import WorkerProcess

from ..servers import free_port
from .fleet_app import make_app

pytestmark = [pytest.mark.redis, pytest.mark.fleet]
ROOT = Path(__file__).resolve().parents[2]
TTL = 2.0


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """The samples of ``/metrics``: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, metric: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == metric and want <= ls)


def test_a_worker_counts_a_takeover_and_an_absorbed_duplicate(redis_url, tmp_path):
    env = {"AAA_FLEET_BROKER": redis_url, "AAA_FLEET_TTL": str(TTL)}
    ports = [free_port(), free_port()]
    workers = [WorkerProcess("tests.worker.fleet_app", hostname=f"m{n}@metrics", concurrency=2, cwd=ROOT,
                             env={**env, "AAA_METRICS_PORT": str(port)}, workdir=tmp_path / f"w{n}")
               for n, port in enumerate(ports)]
    client, ledger = make_app(env), Ledger(redis_url)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_ready(60)
        # A takeover: the holder of a 4 s call is kill -9ed; the other worker runs attempt 2.
        first = client.tasks["fleet.long"].delay(4.0)
        start = wait_for(lambda: ledger.entries(first.id, "start"), 30, "attempt 1")[0]
        holder = next(w for w in workers if start["pid"] in w.children() or start["pid"] == w.pid)
        survivor = next(w for w in workers if w is not holder)
        port = ports[workers.index(survivor)]
        holder.kill()
        assert first.get(timeout=40)["attempt"] == 2
        before = scrape(port)

        # A duplicate: a second copy of a running call reaches the survivor's other child.
        second = client.tasks["fleet.long"].delay(3.0)
        wait_for(lambda: ledger.entries(second.id, "start"), 30, "the second call's start")
        duplicate_delivery(client, second.id, "fleet.long", args=[3.0])
        assert second.get(timeout=30)["attempt"] == 1
        after = wait_for(lambda: (s := scrape(port)) and
                         total(s, "aaa_task_duplicates_absorbed_total") > total(before, "aaa_task_duplicates_absorbed_total")
                         and s, 20, "the duplicate counted")
    finally:
        for w in workers:
            w.stop()

    labels = {"name": "fleet.long", "hostname": survivor.hostname}
    assert total(after, "aaa_task_attempts_started_total", **labels) == 2
    assert total(after, "aaa_task_takeovers_total", **labels) == 1
    assert total(after, "aaa_task_duplicates_absorbed_total", **labels) - \
        total(before, "aaa_task_duplicates_absorbed_total", **labels) == 1
    assert total(after, "aaa_task_runtime_seconds_count", **labels) == 2
    assert 3.0 <= total(after, "aaa_task_runtime_seconds_sum", **labels) < 30
    assert total(after, "aaa_task_fenced_total") == 0 and total(after, "aaa_task_outcome_unknown_total") == 0
    assert total(after, "aaa_lease_renew_failures_total") == 0
    assert total(after, "aaa_heartbeat_lag_seconds_count", hostname=survivor.hostname) >= 3
    assert total(after, "aaa_store_latency_seconds_count", op="begin", store="redis") >= 3
    assert total(after, "aaa_store_latency_seconds_count", op="finish", store="redis") >= 2
    assert total(after, "aaa_store_latency_seconds_count", op="renew", store="redis") >= 3
    assert not [k for k in after if any(v in (first.id, second.id) for _, v in k[1])]  # never a call id

    # The recovery sweep, in the worker's main process, goes through the same metered store:
    # every sweep is an op="expired" sample, the takeover's republish claim an
    # op="claim_recovery" one; docs/operations.md names both (it said they were left out).
    assert total(after, "aaa_store_latency_seconds_count", op="expired", hostname=survivor.hostname) >= 3
    assert total(after, "aaa_store_latency_seconds_count", op="claim_recovery", hostname=survivor.hostname) >= 1
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert 'op="expired"' in doc and 'op="claim_recovery"' in doc
    assert "its round trips are not in `aaa_store_latency_seconds`" not in doc



def test_a_worker_counts_lost_calls_stale_results_and_keeps_a_dead_childs_counts(redis_url, tmp_path):
    """The rest of docs/operations.md's metric table, on real prefork workers: an at_most_once
    call whose pool child is kill -9ed (OutcomeUnknown; the dead child's start is still
    counted), a frozen holder's late result (stale), a poison call (abandoned)."""
    from aaa_celery import ExecutionAbandoned, OutcomeUnknown
    from aaa_celery.testing import freeze, kill_child

    env = {"AAA_FLEET_BROKER": redis_url, "AAA_FLEET_TTL": str(TTL)}
    ports = [free_port(), free_port()]
    workers = [WorkerProcess("tests.worker.fleet_app", hostname=f"l{n}@metrics", concurrency=2, cwd=ROOT,
                             env={**env, "AAA_METRICS_PORT": str(port)}, workdir=tmp_path / f"w{n}")
               for n, port in enumerate(ports)]
    client, ledger = make_app(env), Ledger(redis_url)

    def holder_of(call):
        start = wait_for(lambda: ledger.entries(call.id, "start"), 30, f"{call.id} started")[-1]
        return next(w for w in workers if start["pid"] in w.children() or start["pid"] == w.pid), start["pid"]

    def both(metric: str, **labels: str) -> float:
        return sum(total(scrape(p), metric, **labels) for p in ports)

    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_ready(60)
        lost = client.tasks["fleet.long_amo"].delay(4.0)
        worker, child = holder_of(lost)
        kill_child(worker, child)
        with pytest.raises(OutcomeUnknown):
            lost.get(timeout=30)
        # the killed child's count of attempt 1 is still served by its worker
        assert total(scrape(ports[workers.index(worker)]), "aaa_task_attempts_started_total",
                     name="fleet.long_amo", queue_name="celery") == 1
        wait_for(lambda: both("aaa_task_outcome_unknown_total", name="fleet.long_amo") == 1, 20, "OutcomeUnknown")

        late = client.tasks["fleet.long_finish"].delay(4.0)
        worker, _ = holder_of(late)
        frozen = freeze(worker)
        try:
            wait_for(lambda: len(ledger.entries(late.id, "start")) >= 2, 30, "attempt 2")
        finally:
            frozen.thaw()
        assert late.get(timeout=30)["attempt"] == 2
        wait_for(lambda: both("aaa_task_stale_results_total", name="fleet.long_finish") == 1, 30, "the stale result")

        poison = client.tasks["fleet.poison"].delay()
        with pytest.raises(ExecutionAbandoned):
            poison.get(timeout=90)
        wait_for(lambda: both("aaa_task_abandoned_total", name="fleet.poison") == 1, 20, "ExecutionAbandoned")
    finally:
        for w in workers:
            w.stop()


def test_a_prefork_worker_gauges_the_concurrency_slots_its_calls_hold(redis_url, tmp_path):
    """``aaa_slots_held``, summed over a prefork worker's children: two calls of one key hold
    two slots while their bodies run, labelled by the key's digest, and none once they end."""
    from aaa_celery.policy import Concurrency

    env = {"AAA_FLEET_BROKER": redis_url, "AAA_FLEET_TTL": str(TTL)}
    port = free_port()
    worker = WorkerProcess("tests.worker.fleet_app", hostname="s0@metrics", concurrency=2, cwd=ROOT,
                           env={**env, "AAA_METRICS_PORT": str(port)}, workdir=tmp_path / "w0")
    client, ledger = make_app(env), Ledger(redis_url)
    key = Concurrency(key="shop", limit=2, on_busy="skip").slot_key("fleet.limited_skip", None, {"shop": 41})
    try:
        worker.start()
        worker.wait_ready(60)
        calls = [client.tasks["fleet.limited_skip"].delay(41, 4.0) for _ in range(2)]
        wait_for(lambda: all(ledger.entries(c.id, "start") for c in calls), 30, "both bodies started")
        held = wait_for(lambda: (s := scrape(port)) and total(s, "aaa_slots_held", hostname="s0@metrics") == 2
                        and s, 10, "two slots held")
        assert total(held, "aaa_slots_held", key=key) == 2
        assert {dict(ls)["key"] for (n, ls), v in held.items() if n == "aaa_slots_held" and v} == {key}
        for c in calls:
            c.get(timeout=30)
        wait_for(lambda: total(scrape(port), "aaa_slots_held") == 0, 10, "no slot held")
    finally:
        worker.stop()
