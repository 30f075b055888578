"""The redaction test of issue 12 on a real fleet: a secret argument reaches the tool
intact, and is found nowhere else in clear: not in Redis (broker, result backend and
store: every key and value), not in the events a ``celery events`` consumer receives
(``celery.events.EventReceiver``, workers started with ``-E``), not in the Flask pages
and JSON, not in the worker's log (at DEBUG). A call whose message the broker lost is
republished by recovery from its sealed spec, and its tool still gets the secret.

Reproduces on 23716a3: a password argument appeared in the run events, the pages and
JSON, Celery's ``task-received`` event and the Redis spec hash; there was no way to
mark an argument secret.
"""

from __future__ import annotations

import secrets as pysecrets
import time
from typing import Any

import pytest
import redis
from cryptography.fernet import Fernet

from aaa_celery.llm import FakeLLMClient, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.testing import Fleet, wait_for

from ..runtime.test_secrets import redis_dump
from .conftest import ROOT
from .secrets_app import digest, handler, make_app
from .test_fleet_events_timeout import EventLog

flask = pytest.importorskip("flask")

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def flask_app(client_app: Any, model: Any) -> Any:
    from aaa_celery.contrib.flask import AAACelery

    web = flask.Flask("secrets")
    web.config.update(SECRET_KEY="test", AAA_CELERY_APP=client_app, AAA_CELERY_TOOLS=handler,
                      AAA_CELERY_LLM=FakeLLMClient(model), AAA_CELERY_ALLOW_ANONYMOUS=True)
    AAACelery().init_app(web)
    return web


def test_secrets_reach_the_tool_intact_and_are_nowhere_else_in_clear(redis_url, tmp_path):
    secret = {name: f"s3cr3t-{name}-{pysecrets.token_hex(8)}" for name in
              ("plain_pw", "plain_token", "run_pw", "run_token", "card", "lost_pw", "lost_token")}
    env = {"AAA_SECRETS_BROKER": redis_url, "AAA_SECRETS_KEY": Fernet.generate_key().decode(),
           "AAA_SECRETS_GRACE": "1"}
    client = make_app(env)
    shown: list[str] = []

    # Given a call sent while no worker runs, whose message the broker then loses
    lost = handler.task("login").delay(user="lou", password=secret["lost_pw"], token=secret["lost_token"])
    shown.append(redis_dump(redis_url))  # the queued message and the registered spec: sealed
    broker = redis.Redis.from_url(redis_url)
    assert broker.delete("aaa.default") == 1
    broker.close()

    fleet = Fleet("tests.worker.secrets_app", size=1, env=env, cwd=ROOT, workdir=tmp_path / "fleet",
                  loglevel="DEBUG", extra_args=("-E",))
    log = None
    web = None
    try:
        fleet.start()
        log = EventLog(client)
        # When recovery republishes the lost call from its sealed spec, the tool gets the secret
        assert lost.get(timeout=30) == {"user": "lou", "password": digest(secret["lost_pw"]),
                                        "token": digest(secret["lost_token"])}
        # And a plain send
        plain = handler.task("login").delay(user="ann", password=secret["plain_pw"], token=secret["plain_token"])
        assert plain.get(timeout=30) == {"user": "ann", "password": digest(secret["plain_pw"]),
                                         "token": digest(secret["plain_token"])}

        # And a run driven through the Flask pages, with a person approving a payment
        def model(request: Any) -> LLMResponse:
            if request.messages[-1].role == "user":
                return LLMResponse(tool_calls=(
                    ToolCall("login", {"user": "bo", "password": secret["run_pw"], "token": secret["run_token"]}),
                    ToolCall("pay", {"amount": 30, "card": secret["card"]}),
                ))
            return text(" | ".join(m.content for m in request.messages if m.role == "tool"))

        web = flask_app(client, model)
        browser = web.test_client()
        browser.environ_base["HTTP_X_CSRFTOKEN"] = browser.get("/aaa/csrf").get_json()["csrf_token"]
        run_id = browser.post("/aaa/runs", json={"task": "pay"}).get_json()["run_id"]
        [pending] = wait_for(lambda: browser.get("/aaa/approvals").get_json()["approvals"], 30, "an approval")
        assert pending["arguments"] == {"amount": 30, "card": "**********"}
        shown += [browser.get("/aaa/").get_data(as_text=True), browser.get(f"/aaa/runs/{run_id}").get_data(as_text=True),
                  browser.get("/aaa/approvals").get_data(as_text=True)]
        decided = browser.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                               json={"decision": "approve", "digest": pending["digest"]})
        assert decided.status_code == 200, decided.get_data(as_text=True)
        run = wait_for(lambda: (r := browser.get(f"/aaa/runs/{run_id}/events").get_json())["status"] == "completed"
                       and r, 60, "the run to complete")
        # the tools got every secret intact
        facts = {e["data"]["name"]: e["data"]["value"] for e in run["events"] if e["type"] == "aaa.tool.completed"}
        assert facts["login"]["password"] == digest(secret["run_pw"])
        assert facts["login"]["token"] == digest(secret["run_token"])
        assert facts["pay"]["card"] == digest(secret["card"])
        requested = [e["data"]["arguments"] for e in run["events"] if e["type"] == "aaa.tool.requested"]
        assert {"user": "bo", "password": "**********", "token": "**********"} in requested
        shown += [browser.get(f"/aaa/runs/{run_id}/events").get_data(as_text=True),
                  browser.get(f"/aaa/runs/{run_id}/attempts").get_data(as_text=True)]

        # Then no secret is anywhere in clear
        wait_for(lambda: sum(e["type"] == "task-succeeded" for e in log.events) >= 4, 15, "the task events")
        time.sleep(0.5)
        assert {e["type"] for e in log.events} >= {"task-received", "task-started", "task-succeeded"}
        received = [e for e in log.events if e["type"] == "task-received"]
        assert any("**********" in e["kwargs"] for e in received)  # Celery shows the redacted arguments
        shown += [repr(log.events), redis_dump(redis_url), fleet.logs()]
    finally:
        if log is not None:
            log.stop()
        if web is not None:
            from aaa_celery.contrib.flask import AAACelery

            AAACelery.close(web)
        fleet.stop()
    everything = "\n".join(shown)
    for name, value in secret.items():
        assert value not in everything, f"the {name} secret leaked"
    assert "aaa_sealed" in everything  # the store keeps the sealed form, for recovery
