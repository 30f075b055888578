"""Celery results of guarded calls, the store being down at begin, and worker lifecycle,
on real ``celery worker`` processes over Redis."""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from aaa_celery import ToolArgsError, ToolError, open_store
from aaa_celery.lifecycle import COMPLETED, FAILED, STARTED
from aaa_celery.testing import WorkerProcess, duplicate_delivery, wait_for

from ..servers import RedisServer
from .conftest import APP, ROOT
from .test_fleet_faults import TTL, started, types

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_results_values_and_tool_errors_reach_async_result_get_as_their_types_over_json(fleet):
    f = fleet(TTL=TTL)
    assert f.client.conf.result_serializer == "json" and f.client.conf.accept_content == ["json"]
    ok = f.client.tasks["fleet.quick"].delay(1)
    echo = f.client.tasks["aaa.tool.echo"].delay(arguments={"text": "hi"})
    tool_error = f.client.tasks["fleet.fail"].delay("tool")
    args_error = f.client.tasks["fleet.fail"].delay("args")
    with pytest.raises(ToolArgsError):  # refused before it is published (issue 12)
        f.client.tasks["aaa.tool.echo"].delay(arguments={"nope": 1})
    # sent around apply_async, the worker refuses it: a recorded ToolArgsError
    bad_args = f.client.send_task("aaa.tool.echo", kwargs={"arguments": {"nope": 1}}, queue="aaa.default")
    assert ok.get(timeout=15) == 2
    assert echo.get(timeout=15) == "hi"
    for result, cls in ((tool_error, ToolError), (args_error, ToolArgsError), (bad_args, ToolArgsError)):
        with pytest.raises(ToolError) as err:
            result.get(timeout=15)
        assert type(err.value) is cls
    assert "failed on purpose" in str(pytest.raises(ToolError, tool_error.get).value)
    # the result backend holds JSON naming our exception type
    meta = json.loads(redis.Redis.from_url(f.env["AAA_FLEET_BROKER"]).get(f"celery-task-meta-{args_error.id}"))
    assert meta["result"]["exc_type"] == "ToolArgsError" and meta["result"]["exc_module"] == "aaa_celery.errors"
    assert types(f.store, ok.id) == [STARTED, COMPLETED]
    assert types(f.store, bad_args.id) == [STARTED, FAILED]
    assert f.store.result(bad_args.id).error == "ToolArgsError"
    # a redelivery of a finished call answers with the recorded result and runs nothing
    again = duplicate_delivery(f.client, ok.id, "fleet.quick", [1])
    time.sleep(1.5)
    assert again.get(timeout=10) == 2
    assert len(f.ledger.entries(ok.id, "start")) == 1
    assert types(f.store, ok.id) == [STARTED, COMPLETED]


@pytest.fixture
def store_server():
    server = RedisServer.start()
    try:
        yield server
    finally:
        server.stop()


def test_store_unavailable_at_begin_never_runs_the_tool_and_keeps_the_message(fleet, store_server, redis_url):
    f = fleet(TTL=TTL, STORE=store_server.url, LEDGER=redis_url)
    warm = f.client.tasks["fleet.quick"].delay(0)
    assert warm.get(timeout=15) == 1
    store_server._halt(kill=False)  # the store goes down (same port and data when it returns)
    try:
        # the send goes out (registration after it is logged, not raised: the call will run)
        sent = f.client.tasks["fleet.quick"].delay(1)
        result = duplicate_delivery(f.client, "store-down-call", "fleet.quick", [1])
        time.sleep(4)
        assert f.ledger.entries(result.id, "start") == [] and f.ledger.entries(sent.id, "start") == []
        assert result.state == "PENDING" and sent.state == "PENDING"
    finally:
        store_server._spawn()
    for call in (result, sent):
        assert call.get(timeout=20) == 2
        assert len(f.ledger.entries(call.id, "start")) == 1
        assert types(f.store, call.id) == [STARTED, COMPLETED]


def test_worker_with_non_redis_broker_and_no_store_url_refuses_to_start(redis_url, tmp_path):
    env = {"AAA_FLEET_BROKER": "amqp://guest:guest@127.0.0.1:9//", "AAA_FLEET_BACKEND": redis_url}
    worker = WorkerProcess(APP, hostname="nostore@test", env=env, cwd=ROOT, workdir=tmp_path).start()
    try:
        wait_for(lambda: not worker.alive, 30, "the worker to exit")
        assert worker.proc.returncode != 0
        assert "aaa_store_url" in worker.log
        assert " ready." not in worker.log
    finally:
        worker.stop()


def test_after_many_calls_no_lease_keys_or_heartbeat_threads_remain(fleet):
    f = fleet(TTL=TTL)
    calls = [f.client.tasks["fleet.quick"].delay(i) for i in range(30)]
    calls += [f.client.tasks["fleet.long"].delay(1.0) for _ in range(4)]
    calls += [f.client.tasks["fleet.fail"].delay("tool") for _ in range(4)]
    for c in calls:
        c.get(timeout=30, propagate=False)
    probes = [f.client.tasks["fleet.threads"].delay(0.5) for _ in range(6)]
    seen = [p.get(timeout=15) for p in probes]
    assert len({s["pid"] for s in seen}) >= 2  # both workers' pool children answered
    # one watchdog thread per process at most, and it watches no call once they ended
    assert all(s["threads"].count("aaa-watchdog") <= 1 and s["watched"] == 0 for s in seen), seen
    broker = redis.Redis.from_url(f.env["AAA_FLEET_BROKER"], decode_responses=True)
    store = open_store(f.env["AAA_FLEET_BROKER"])
    assert broker.exists(store.key(calls[0].id, "result"))  # the key layout this test reads is live
    assert [k for k in broker.scan_iter("aaa:*") if k.endswith(":lease")] == []
    indexes = [k for k in broker.scan_iter("aaa:*") if k.endswith((":running", ":unclaimed"))]
    assert sum(broker.zcard(k) for k in indexes) == 0


def test_warm_shutdown_sigterm_lets_the_running_call_finish_with_one_result(fleet):
    f = fleet(TTL=TTL)
    result = f.client.tasks["fleet.long"].delay(4.0)
    holder = f.worker_of(started(f, result.id)[0]["pid"])
    holder.proc.send_signal(signal.SIGTERM)
    assert result.get(timeout=20)["attempt"] == 1
    assert holder.proc.wait(20) == 0
    assert len(f.ledger.entries(result.id, "start")) == 1
    assert types(f.store, result.id) == [STARTED, COMPLETED]
