"""The Celery app of the chaos workload, for ``celery -A aaa_celery.chaos.app worker``.

Configured from environment variables (the runner sets them for each worker,
and builds the same app in its own process with :func:`make_app` to send):

- ``AAA_CHAOS_BROKER``: the broker URL (required).
- ``AAA_CHAOS_STORE``: the guard's store URL (default: the broker's Redis).
- ``AAA_CHAOS_LEDGER``: Redis URL of the effect ledger (default: the broker),
  and ``AAA_CHAOS_LEDGER_PREFIX`` its keys' prefix (one per run).
- ``AAA_CHAOS_QUEUE``: the queue the workload uses (one per run).
- ``AAA_CHAOS_TTL``: ``lease_ttl_s`` (default 2); ``AAA_CHAOS_MAX_ATTEMPTS`` (default 3).
- ``AAA_CHAOS_GRACE``: ``aaa_unclaimed_grace_s`` (default 20).
- ``AAA_CHAOS_VT`` / ``AAA_CHAOS_RESTORE_S``: the Redis transport's
  ``visibility_timeout`` and unacked-restore interval (kombu's defaults if unset).
- ``AAA_CHAOS_BASELINE=1``: register the same tools as plain Celery tasks
  (``acks_late`` + ``reject_on_worker_lost``) with no guard.
- ``AAA_CHAOS_SLOT_LIMIT``: the limit of the ``*_limited`` tasks (default 2; :data:`LIMITED_TASKS`).
- ``AAA_CHAOS_EFFECTS_DB``: a SQLAlchemy URL; keyed bodies then apply their effect as a row
  of its ``chaos_effects`` table (one row per application, never deduplicated by the table),
  through :func:`aaa_celery.effects.once` under the guard, by a plain insert in the baseline.

Every tool has one body (:func:`run_body`): it writes ``start``, sleeps its
duration in short slices writing a ``tick`` after each, applies its keyed
effect halfway (if the call is keyed), and writes ``end`` with the value it
returns. Tasks (see :data:`TASKS`): ``chaos.at_least_once``, ``chaos.at_most_once`` and
``chaos.at_least_once_finish`` (``on_lost_lease="finish"``: a stalled attempt runs
to its end, and only the fence keeps its result out), each taking ``(duration_s, keyed)``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from celery import Celery

from ..testing.ledger import EFFECT, END, START, TICK, EffectLedger, new_exec_id

if TYPE_CHECKING:
    from ..context import ToolContext

#: (delivery, on_lost_lease) -> task name.
TASKS = {
    ("at_least_once", "cancel"): "chaos.at_least_once",
    ("at_least_once", "finish"): "chaos.at_least_once_finish",
    ("at_most_once", "cancel"): "chaos.at_most_once",
}
#: (delivery, on_lost_lease) -> the task with a concurrency limit: ``Concurrency(key="slot",
#: limit=AAA_CHAOS_SLOT_LIMIT, on_busy="wait")``, taking ``(duration_s, keyed, slot)``.
LIMITED_TASKS = {key: f"{name}_limited" for key, name in TASKS.items()}
#: Seconds between a body's ``tick`` entries.
TICK_S = 0.2

#: The effects table of ``AAA_CHAOS_EFFECTS_DB``.
EFFECTS_TABLE = "chaos_effects"

_ledgers: dict[tuple[int, str, str], EffectLedger] = {}
_engines: dict[tuple[int, str], Any] = {}


def ledger_for(url: str, prefix: str) -> EffectLedger:
    """This process's ledger client (one per process: never shared across a fork)."""
    key = (os.getpid(), url, prefix)
    if key not in _ledgers:
        _ledgers[key] = EffectLedger(url, prefix)
    return _ledgers[key]


def effects_metadata() -> Any:
    """The ``chaos_effects`` table (and ``once``'s own tables) on a new metadata."""
    import sqlalchemy as sa

    from ..effects import EffectLog

    metadata = sa.MetaData()
    sa.Table(EFFECTS_TABLE, metadata, sa.Column("n", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("key", sa.String, nullable=False), sa.Column("call_id", sa.String, nullable=False),
             sa.Column("attempt", sa.Integer), sa.Column("exec", sa.String, nullable=False))
    EffectLog(metadata)
    return metadata


def db_effect(url: str, ctx: ToolContext | None, call_id: str, key: str) -> Callable[[str], bool]:
    """The effect as a row of ``chaos_effects`` in the database ``url``: through ``once``
    under the guard (``ctx``), a plain insert without it; True if this body's row is the one."""
    import sqlalchemy as sa

    from ..effects import once

    if (os.getpid(), url) not in _engines:  # a forked pool child opens its own
        _engines[os.getpid(), url] = sa.create_engine(url, pool_pre_ping=True)
    engine, table = _engines[os.getpid(), url], effects_metadata().tables[EFFECTS_TABLE]

    def effect(ex: str) -> bool:
        def insert(conn: Any) -> str:
            conn.execute(table.insert().values(key=key, call_id=call_id, attempt=ctx.attempt if ctx else None,
                                               exec=ex))
            return ex

        with engine.begin() as conn:
            return (once(conn, ctx, insert) if ctx is not None else insert(conn)) == ex
    return effect


def run_body(ledger: EffectLedger, call_id: str, attempt: int | None, key: str | None,
             duration_s: float, keyed: bool, host: str | None = None,
             effect: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The workload's tool body: what it really did goes to the ledger (``host``: the
    worker's node name). With ``effect`` a keyed body applies its effect by ``effect(exec id)``
    at its first tick (the database's table records it; the ledger only a try that found it
    applied)."""
    ex = new_exec_id()
    host = host or socket.gethostname()
    common: dict[str, Any] = {"attempt": attempt, "fence": attempt, "host": host}
    ledger.record(START, call_id, ex, key=key, duration_s=duration_s, **common)
    started = time.monotonic()
    # the effect halfway; in the app's database at the first tick, so that most faults come
    # after its commit, the case effects.once is for
    halfway = started + (TICK_S if effect is not None else duration_s / 2)
    applied = None

    def apply() -> bool:
        if effect is None:
            return ledger.apply_effect(key or call_id, call_id, ex, attempt=attempt, fence=attempt)
        done = effect(ex)
        if not done:
            ledger.record(EFFECT, call_id, ex, key=key or call_id, applied=False, **common)
        return done

    while True:
        left = started + duration_s - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(TICK_S, left))
        ledger.record(TICK, call_id, ex, **common)
        if keyed and applied is None and time.monotonic() >= halfway:
            applied = apply()
    if keyed and applied is None:
        applied = apply()
    value = {"call": call_id, "attempt": attempt, "exec": ex, "pid": os.getpid(), "applied": applied}
    ledger.record(END, call_id, ex, value=value, **common)
    return value


def make_app(env: Mapping[str, str]) -> Celery:
    broker = env["AAA_CHAOS_BROKER"]
    app = Celery("aaa_chaos", broker=broker)
    transport: dict[str, Any] = {}
    if env.get("AAA_CHAOS_VT"):
        transport["visibility_timeout"] = float(env["AAA_CHAOS_VT"])
    if env.get("AAA_CHAOS_RESTORE_S"):
        transport["unacked_restore_interval"] = float(env["AAA_CHAOS_RESTORE_S"])
        transport["unacked_restore_throttle"] = 1
    queue = env.get("AAA_CHAOS_QUEUE") or "aaa-chaos"
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        worker_hijack_root_logger=False,
        aaa_guard={
            "lease_ttl_s": float(env.get("AAA_CHAOS_TTL") or 2),
            "max_attempts": int(env.get("AAA_CHAOS_MAX_ATTEMPTS") or 3),
            "wait_poll_s": 0.25,
        },
        aaa_recovery_interval_s=1.0,
        aaa_unclaimed_grace_s=float(env.get("AAA_CHAOS_GRACE") or 20),
    )
    if env.get("AAA_CHAOS_STORE"):
        app.conf.aaa_store_url = env["AAA_CHAOS_STORE"]
    if env.get("AAA_CHAOS_STORE_REPLICAS"):  # a write of a call counts once this many replicas have it
        app.conf.aaa_store_options = {"replicas": int(env["AAA_CHAOS_STORE_REPLICAS"]), "replicas_timeout_s": 2.0}
    ledger_url = env.get("AAA_CHAOS_LEDGER") or broker
    prefix = env.get("AAA_CHAOS_LEDGER_PREFIX") or "aaa:chaos:ledger"
    effects_db = env.get("AAA_CHAOS_EFFECTS_DB")

    if env.get("AAA_CHAOS_BASELINE") == "1":
        # Plain Celery: the message stays unacked until the task returns, and a
        # lost child re-queues it. No lease, no attempt numbers, no fencing.
        for name in (*TASKS.values(), *LIMITED_TASKS.values()):  # the baseline has no limit

            def plain(self: Any, duration_s: float, keyed: bool = False, slot: str = "") -> dict[str, Any]:
                cid = self.request.id
                effect = db_effect(effects_db, None, cid, cid) if effects_db and keyed else None
                return run_body(ledger_for(ledger_url, prefix), cid, None, cid, duration_s, keyed,
                                self.request.hostname, effect)

            app.task(name=name, bind=True, acks_late=True, reject_on_worker_lost=True)(plain)
        return app

    from ..context import ToolContext
    from ..policy import Concurrency
    from ..worker import GuardedTask

    limit = Concurrency(key=("slot",), limit=int(env.get("AAA_CHAOS_SLOT_LIMIT") or 2), on_busy="wait")
    for (delivery, on_lost), name in TASKS.items():

        def guarded(duration_s: float, keyed: bool = False, slot: str = "", *, ctx: ToolContext) -> dict[str, Any]:
            effect = db_effect(effects_db, ctx, ctx.call_id, ctx.idempotency_key) if effects_db and keyed else None
            return run_body(ledger_for(ledger_url, prefix), ctx.call_id, ctx.attempt, ctx.idempotency_key,
                            duration_s, keyed, ctx.meta.get("hostname"), effect)

        guarded.__annotations__["ctx"] = ToolContext
        app.task(base=GuardedTask, name=name, delivery=delivery, guard={"on_lost_lease": on_lost})(guarded)
        app.task(base=GuardedTask, name=LIMITED_TASKS[delivery, on_lost], delivery=delivery,
                 guard={"on_lost_lease": on_lost}, concurrency=limit)(guarded)
    return app


app = make_app(os.environ) if "AAA_CHAOS_BROKER" in os.environ else None
