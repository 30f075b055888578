"""Malformed messages never stop a worker (issue 12, item 6): raw messages published through
kombu to a real Redis broker, consumed by a real prefork ``celery worker``."""

from __future__ import annotations

import json
import pickle
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange

from aaa_celery import open_store
from aaa_celery.lifecycle import STARTED
from aaa_celery.testing import WorkerProcess, wait_for

from .conftest import ROOT
from .trust_app import make_app

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

APP = "tests.worker.trust_app"
REFUSED = "refused"  # rejected without requeue, and recorded as a failed call (ToolArgsError)
DROPPED = "dropped"  # rejected without requeue; nothing recorded (no readable id, or maybe another tenant's)
RAN = "ran"  # a well-formed message: the task ran in the pool and failed as the error says


@dataclass
class Row:
    name: str
    body: Any
    ends: str
    task: str = "trust.ping"
    headers: dict[str, Any] = field(default_factory=dict)
    content_type: str = "application/json"
    error: str = "ToolArgsError"
    says: str = ""
    id: str = field(default_factory=lambda: f"bad-{uuid.uuid4().hex[:10]}")


def proto2_headers(row: Row) -> dict[str, Any]:
    return {"lang": "py", "task": row.task, "id": row.id, "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": row.id,
            "parent_id": None, "argsrepr": "", "kwargsrepr": "", "origin": "test", "ignore_result": False,
            **row.headers}


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
TABLE = [
    Row("body is a JSON object", {"x": 1}, REFUSED, says="the body is an object"),
    Row("body is an object of three keys", {"a": 1, "b": 2, "c": 3}, REFUSED, says="not [args, kwargs, embed]"),
    Row("body is a protocol-1 style object", {"args": [1], "kwargs": {}}, REFUSED, says="the body is an object"),
    Row("body is a list of two", [[1], {}], REFUSED, says="not [args, kwargs, embed]"),
    Row("args is a string", ["1", {}, EMBED], REFUSED, says="args is str"),
    Row("kwargs is a list", [[1], [1, 2], EMBED], REFUSED, says="kwargs is not an object"),
    Row("embed is a number", [[1], {}, 5], REFUSED, says="embed is int"),
    Row("body is not JSON", b"{not json", REFUSED, says="cannot be decoded"),
    Row("body is a pickle", pickle.dumps(([1], {}, EMBED)), REFUSED, content_type="application/x-python-serialize",
        says="cannot be decoded"),
    Row("body is huge", [["x" * (2 * 1024 * 1024)], {}, EMBED], REFUSED, says="more than aaa_max_message_bytes"),
    Row("timelimit is a word", [[1], {}, EMBED], REFUSED, headers={"timelimit": "soon"}, says="'timelimit'"),
    Row("retries is a word", [[1], {}, EMBED], REFUSED, headers={"retries": "many"}, says="'retries'"),
    # bad aaa_ headers: the id may be another tenant's call, so nothing is written under it
    Row("aaa_tenant is an object", [[1], {}, EMBED], DROPPED, headers={"aaa_tenant": {"x": 1}}),
    Row("aaa_run_id forges a log line", [[1], {}, EMBED], DROPPED, headers={"aaa_run_id": "r\nINFO forged"}),
    Row("aaa_tool_call_id is too long", [[1], {}, EMBED], DROPPED, headers={"aaa_tool_call_id": "c" * 2000}),
    Row("aaa_tenant names another tenant than the id", {"x": 1}, DROPPED, headers={"aaa_tenant": "acme"}),
    Row("id header missing", [[1], {}, EMBED], DROPPED, headers={"id": None}),
    Row("id header is a number", [[1], {}, EMBED], DROPPED, headers={"id": 12345}),
    Row("id header forges a log line", [[1], {}, EMBED], DROPPED, headers={"id": "x\nINFO forged"}),
    Row("tool arguments of the wrong type", [[], {"arguments": {"text": ["not", "text"]}}, EMBED], RAN,
        task="aaa.tool.echo", says="bad arguments"),
    Row("tool arguments not an object", [[], {"arguments": [1, 2]}, EMBED], RAN, task="aaa.tool.echo",
        says="arguments must be an object"),
    Row("task argument of the wrong type", [["one"], {}, EMBED], RAN, error="TypeError"),
]
QUEUES = {"trust.ping": "celery", "aaa.tool.echo": "aaa.default"}


def publish(url: str, row: Row) -> None:
    body = row.body if isinstance(row.body, bytes) else json.dumps(row.body).encode()
    headers = {k: v for k, v in proto2_headers(row).items() if v is not None or k != "id"}
    encoding = "binary" if row.content_type.endswith("serialize") else "utf-8"
    with Connection(url) as conn:
        conn.Producer().publish(body, exchange=Exchange("celery", type="direct"), routing_key=QUEUES[row.task],
                                content_type=row.content_type, content_encoding=encoding, headers=headers)


def test_malformed_messages_are_refused_and_the_worker_keeps_serving(redis_url, tmp_path):
    """Reproduces on 4a34578: a body that is a JSON object (and a missing id, a bad timelimit)
    raised in the worker's main process and stopped the worker; the message went back to the
    queue and stopped every restarted worker too."""
    env = {"AAA_TRUST_BROKER": redis_url}
    worker = WorkerProcess(APP, hostname=f"msgs-{uuid.uuid4().hex[:6]}@t", pool="prefork", concurrency=2,
                           env=env, workdir=tmp_path, cwd=ROOT).start().wait_ready()
    client, store, r = make_app(env), open_store(redis_url), redis.Redis.from_url(redis_url)
    pid = worker.pid
    try:
        for row in TABLE:
            publish(redis_url, row)

        def drained() -> bool:
            queued = sum(r.llen(q) for q in QUEUES.values()) + r.hlen("unacked")
            ended = all(store.result(row.id) is not None for row in TABLE if row.ends != DROPPED)
            return queued == 0 and ended

        wait_for(drained, 60, "every message ended")
        for row in TABLE:
            outcome = store.result(row.id)
            if row.ends == DROPPED:
                assert outcome is None and client.AsyncResult(row.id).state == "PENDING", row.name
                continue
            assert outcome is not None and not outcome.ok, row.name
            assert outcome.error == row.error and row.says in outcome.message, (row.name, outcome)
            started = [e for e in store.events(row.id) if e.type == STARTED]
            if row.ends == REFUSED:
                assert "malformed message" in outcome.message and not started, (row.name, outcome)
                result = client.AsyncResult(row.id)
                assert result.state == "FAILURE" and type(result.result).__name__ == "ToolArgsError", row.name
            else:
                assert len(started) == 1, row.name
        # the worker stayed up, and serves a normal call
        assert worker.alive and worker.pid == pid
        assert client.tasks["trust.ping"].delay(1).get(timeout=30) == 2
        assert client.tasks["aaa.tool.echo"].delay(arguments={"text": "still here"}).get(timeout=30) == "still here"
        assert worker.alive and worker.pid == pid
        assert "Unrecoverable error" not in worker.log
        assert "\nINFO forged" not in worker.log
    finally:
        worker.stop()
        store.close()
