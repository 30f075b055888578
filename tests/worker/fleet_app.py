"""The Celery app the fleet tests run in real ``celery worker`` processes.

Configured from environment variables, so one module serves every scenario
(``make_app(env)`` builds the same app in the test process, as a client):

- ``AAA_FLEET_BROKER``: broker URL (required); also the result backend unless
  ``AAA_FLEET_BACKEND`` is set.
- ``AAA_FLEET_STORE``: ``aaa_store_url`` (default: the broker's Redis).
- ``AAA_FLEET_LEDGER``: Redis URL of the effect ledger (default: the broker).
- ``AAA_FLEET_TTL``: the guard's ``lease_ttl_s`` (default 2).
- ``AAA_FLEET_VT``: the broker's ``visibility_timeout`` (default: kombu's, one hour).
- ``AAA_FLEET_RESTORE_S``: kombu's unacked restore interval and throttle 1 (the
  broker restores expired messages every that many seconds).
- ``AAA_FLEET_GRACE``: ``aaa_unclaimed_grace_s``.
- ``AAA_FLEET_LOST_AFTER`` / ``AAA_FLEET_LOST_CHECK``: ``aaa_lost_after_s`` / ``aaa_lost_check_s``.
- ``AAA_FLEET_HOLD`` / ``AAA_FLEET_MAX_TRIES``: ``aaa_recovery_hold_s`` / ``aaa_recovery_max_tries``.
- ``AAA_FLEET_STORE_OPTIONS``: ``aaa_store_options``, as JSON (``{"key_prefix": "x", "shards": 3}``).
- ``AAA_FLEET_PIN_STORE``: ``1`` gives those options through ``use_store`` instead, in
  every process (the app's module and each pool child pin a store object of their own).
- ``AAA_FLEET_RECOVERY_S``: ``aaa_recovery_interval_s`` (default 1).
- ``AAA_FLEET_ENABLED``: ``0`` turns the guard off for every task.
- ``AAA_FLEET_FENCE_DB``: SQLAlchemy URL of the database ``fleet.fenced_write`` writes to
  through :class:`aaa_celery.fencing.SQLFence`.

Each body appends ``start`` to the ledger when it begins, and the long ones
``after`` on the line after their sleep, so a test sees runs the guard cut short.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from kombu import Queue

from aaa_celery import GuardedTask, ToolArgsError, ToolContext, ToolError, open_store
from aaa_celery.policy import Concurrency
from aaa_celery.tools import ToolHandler, ToolRegistry, tool
from aaa_celery.tools.handler import use_store
from tests.fleet_apps import FLEET_CONF, ProcessLedger


def make_app(env: Mapping[str, str]) -> Celery:
    broker = env["AAA_FLEET_BROKER"]
    app = Celery("fleet_app", broker=broker, backend=env.get("AAA_FLEET_BACKEND") or broker)
    transport: dict[str, Any] = {}
    if env.get("AAA_FLEET_VT"):
        transport["visibility_timeout"] = float(env["AAA_FLEET_VT"])
    if env.get("AAA_FLEET_RESTORE_S"):
        transport["unacked_restore_interval"] = float(env["AAA_FLEET_RESTORE_S"])
        transport["unacked_restore_throttle"] = 1
    ttl = float(env.get("AAA_FLEET_TTL") or 2)
    app.conf.update(
        FLEET_CONF,
        broker_transport_options=transport,
        aaa_guard={"lease_ttl_s": ttl, "wait_poll_s": 0.25, "enabled": env.get("AAA_FLEET_ENABLED", "1") != "0"},
        aaa_recovery_interval_s=float(env.get("AAA_FLEET_RECOVERY_S") or 1),
    )
    # Each queue bound by its own name: ToolHandler.bind adds Queue("aaa.<pool>"), which
    # Celery binds with the default routing key "celery", so over Redis every message to
    # the default queue would be copied into aaa.default too (reported with issue 4).
    app.conf.task_queues = [Queue("celery", routing_key="celery"), Queue("aaa.default", routing_key="aaa.default")]
    if env.get("AAA_FLEET_STORE"):
        app.conf.aaa_store_url = env["AAA_FLEET_STORE"]
    if env.get("AAA_FLEET_GRACE"):
        app.conf.aaa_unclaimed_grace_s = float(env["AAA_FLEET_GRACE"])
    for var, setting in (("LOST_AFTER", "aaa_lost_after_s"), ("LOST_CHECK", "aaa_lost_check_s"),
                         ("HOLD", "aaa_recovery_hold_s"), ("MAX_TRIES", "aaa_recovery_max_tries")):
        if env.get(f"AAA_FLEET_{var}"):
            app.conf[setting] = float(env[f"AAA_FLEET_{var}"])
    if env.get("AAA_FLEET_STORE_OPTIONS") and env.get("AAA_FLEET_PIN_STORE") == "1":
        options = json.loads(env["AAA_FLEET_STORE_OPTIONS"])
        url = env.get("AAA_FLEET_STORE") or broker

        def pin(**_: Any) -> None:
            use_store(app, open_store(url, **options))

        pin()
        worker_process_init.connect(pin, weak=False)
    elif env.get("AAA_FLEET_STORE_OPTIONS"):
        app.conf.aaa_store_options = json.loads(env["AAA_FLEET_STORE_OPTIONS"])
    ledger_url = env.get("AAA_FLEET_LEDGER") or broker
    record = ProcessLedger(ledger_url).record

    def long(seconds: float, ctx: ToolContext) -> dict[str, Any]:
        record("start", ctx)
        time.sleep(seconds)
        record("after", ctx)
        return {"attempt": ctx.attempt, "pid": os.getpid()}

    # at_least_once, on_lost_lease=cancel (the defaults)
    app.task(base=GuardedTask, name="fleet.long")(long)
    app.task(base=GuardedTask, name="fleet.long_amo", delivery="at_most_once")(long)
    app.task(base=GuardedTask, name="fleet.long_finish", guard={"on_lost_lease": "finish", "fence_results": True})(long)
    # timeout_s bounds the body: a body that sleeps past it becomes a failed ToolTimeout result
    app.task(base=GuardedTask, name="fleet.long_timeout", timeout_s=1.0)(long)

    def fenced_write(seconds: float, ctx: ToolContext) -> dict[str, Any]:
        """Sleep, then write the attempt number through the SQL fence (table ``effects``);
        the ledger's ``after`` entry says whether the database took the write."""
        import sqlalchemy as sa

        from aaa_celery.fencing import SQLFence, StaleFence

        record("start", ctx)
        time.sleep(seconds)
        engine = sa.create_engine(env["AAA_FLEET_FENCE_DB"])
        fence, meta = SQLFence(), sa.MetaData()
        effects = sa.Table("effects", meta, sa.Column("key", sa.String, primary_key=True),
                           sa.Column("attempt", sa.Integer))
        fence.create(engine)
        meta.create_all(engine)
        try:
            with engine.begin() as conn:
                fence.check(conn, ctx.idempotency_key, ctx.fence)
                conn.execute(effects.delete().where(effects.c.key == ctx.idempotency_key))
                conn.execute(effects.insert().values(key=ctx.idempotency_key, attempt=ctx.attempt))
        except StaleFence:
            record("after", ctx, outcome="rejected")
            raise
        finally:
            engine.dispose()
        record("after", ctx, outcome="written")
        return {"attempt": ctx.attempt}

    # on_lost_lease=finish: a thawed stale attempt surely reaches its write
    app.task(base=GuardedTask, name="fleet.fenced_write", guard={"on_lost_lease": "finish"})(fenced_write)

    def limited(shop: int, seconds: float, ctx: ToolContext) -> dict[str, Any]:
        """Hold a concurrency slot of ``shop`` for ``seconds`` (``start`` / ``after`` bound the body)."""
        record("start", ctx, shop=shop)
        time.sleep(seconds)
        record("after", ctx, shop=shop)
        return {"attempt": ctx.attempt, "pid": os.getpid()}

    # at most 2 calls per shop at once (tests/worker/test_concurrency_fleet.py)
    for on_busy in ("wait", "skip"):
        app.task(base=GuardedTask, name=f"fleet.limited_{on_busy}",
                 concurrency=Concurrency(key="shop", limit=2, on_busy=on_busy))(limited)
    # a beat-scheduled task that must never overlap itself
    app.task(base=GuardedTask, name="fleet.unique", unique=True)(limited)

    @app.task(base=GuardedTask, name="fleet.poison")
    def poison(ctx: ToolContext) -> None:
        record("start", ctx)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(base=GuardedTask, name="fleet.quick")
    def quick(x: int, ctx: ToolContext) -> int:
        record("start", ctx)
        return x + 1

    @app.task(base=GuardedTask, name="fleet.fail")
    def fail(kind: str, ctx: ToolContext) -> None:
        record("start", ctx)
        raise {"tool": ToolError, "args": ToolArgsError}[kind](f"{kind} failed on purpose")

    @app.task(name="fleet.threads")
    def threads(pause: float = 0.0) -> dict[str, Any]:
        """The live threads of the process that runs tasks (not guarded: a probe)."""
        from aaa_celery.guard import active_calls

        time.sleep(pause)
        return {"pid": os.getpid(), "threads": sorted(t.name for t in threading.enumerate()),
                "watched": active_calls()}

    @tool(pool="default")
    def echo(text: str, ctx: ToolContext) -> str:
        """Echo the text (a tool bound with ToolHandler.bind)."""
        record("start", ctx)
        return text

    ToolHandler(ToolRegistry([echo]), guard={"lease_ttl_s": ttl, "wait_poll_s": 0.25}).bind(app)
    return app


app = make_app(os.environ) if "AAA_FLEET_BROKER" in os.environ else None
