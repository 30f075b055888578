"""The app of the two-web-process test: a Celery fleet app (tools) and a Flask web app on it.

Configured by ``AAA_TWO_WEB_REDIS`` (broker, result backend and store in one Redis):

- ``celery -A tests.contrib.two_web_app worker -Q aaa.default``: the worker fleet;
- ``python -m tests.contrib.two_web_app <port file>``: one web process, a real Flask app under
  werkzeug's WSGI server on a free loopback port (written to the port file), driving runs with
  ``auto_resume`` and a 2 s run lease.

Tool bodies and model requests are appended to Redis lists (``LEDGER``, ``MODEL``), so the test
counts them across every process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from celery import Celery

from aaa_celery.llm import FakeLLMClient, LLMRequest, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool
from tests.fleet_apps import ProcessRedis, redis_app

ENV = "AAA_TWO_WEB_REDIS"
LEDGER = "aaa:test:two-web:ledger"
MODEL = "aaa:test:two-web:model"
redis_client = ProcessRedis(ENV)


def note(key: str, **fields: Any) -> None:
    redis_client().rpush(key, json.dumps({"pid": os.getpid(), "at": time.time(), **fields}))


def read(key: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in redis_client().lrange(key, 0, -1)]


@tool
def lookup(order: str) -> str:
    """Read an order."""
    note(LEDGER, tool="lookup", order=order)
    return f"order {order}: paid 30 EUR"


@tool(requires_approval=True, delivery="at_most_once")
def refund(order: str, amount: int, ctx: ToolContext) -> str:
    """Refund money (a person approves)."""
    note(LEDGER, tool="refund", order=order, call_id=ctx.call_id)
    return f"refunded {amount} EUR on {order}"


@tool(delivery="at_most_once", timeout_s=120)
def long_report(order: str, ctx: ToolContext) -> str:
    """A long call (``AAA_TWO_WEB_LONG_S`` seconds, default 6)."""
    note(LEDGER, tool="long_report", event="start", call_id=ctx.call_id)
    time.sleep(float(os.environ.get("AAA_TWO_WEB_LONG_S", "6")))
    note(LEDGER, tool="long_report", event="end", call_id=ctx.call_id)
    return f"report on {order}"


REGISTRY = ToolRegistry([lookup, refund, long_report])
def new_handler() -> ToolHandler:
    return ToolHandler(REGISTRY, guard={"lease_ttl_s": 3, "wait_poll_s": 0.25})


def model(request: LLMRequest) -> LLMResponse:
    """refund <order>: look it up, refund it, answer; report <order>: look it up, run the long
    report, answer. Every request is noted (the stub model counts its requests)."""
    task = next(m.content for m in request.messages if m.role == "user")
    turn = sum(1 for m in request.messages if m.role == "assistant")
    note(MODEL, task=task, turn=turn)
    verb, _, order = task.partition(" ")
    if turn == 0:
        return LLMResponse(tool_calls=(ToolCall("lookup", {"order": order}, id="m0"),))
    if turn == 1:
        call = ToolCall("refund", {"order": order, "amount": 30}, id="m1") if verb == "refund" else \
            ToolCall("long_report", {"order": order}, id="m1")
        return LLMResponse(tool_calls=(call,))
    return text(" | ".join(m.content for m in request.messages if m.role == "tool"))


llm = FakeLLMClient(model)


def make_app(url: str) -> Celery:
    app = redis_app("two_web_app", url)
    new_handler().bind(app)
    return app


app = make_app(os.environ[ENV]) if ENV in os.environ else None


def serve(port_file: str) -> None:
    from flask import Flask
    from werkzeug.serving import make_server

    from aaa_celery.contrib.flask import AAACelery

    web = Flask("two_web")
    web.config.update(SECRET_KEY="test-only", AAA_CELERY_APP=app, AAA_CELERY_TOOLS=new_handler(), AAA_CELERY_LLM=llm,
                      AAA_CELERY_ALLOW_ANONYMOUS=True, AAA_CELERY_AUTO_RESUME=True, AAA_CELERY_RUN_LEASE_S=2.0)
    AAACelery(web)
    server = make_server("127.0.0.1", 0, web, threaded=True)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_port))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1])
