"""The benchmarks' Celery app, configured by environment variables.

    BENCH_BROKER        broker URL (redis://...)                  required
    BENCH_BACKEND       result backend URL, or django-db          default: none
    BENCH_DJANGO_DB     with django-db: Django's PostgreSQL (a libpq URL)
    BENCH_STORE         aaa_store_url                             default: the broker
    BENCH_QUEUE         default queue                             default: bench
    BENCH_PREFETCH      worker_prefetch_multiplier                default: 4 (Celery's)
    BENCH_LEASE_TTL     the guard's lease_ttl_s                   default: 15 (GuardConfig's)
    BENCH_RECOVERY_S    aaa_recovery_interval_s                   default: 2 (the library's)
    BENCH_VISIBILITY    broker visibility_timeout (s)             default: kombu's (3600)
    BENCH_STARTS        a Redis URL where sleepers log their starts
    BENCH_BODY_MS       the overhead tasks' body sleeps this long  default: 0 (returns at once)
    BENCH_STORE_REPLICAS  the Redis store's ``replicas`` option     default: 0 (no WAIT)

Workers: ``celery -A benchmarks.bench_app worker -Q bench,aaa.default ...``
"""

from __future__ import annotations

import os
import time

from celery import Celery

from aaa_celery.tools import ToolContext, ToolHandler
from aaa_celery.worker.task import GuardedTask
from benchmarks.bench_tools import body, registry

BROKER = os.environ.get("BENCH_BROKER", "")
if os.environ.get("BENCH_BACKEND") == "django-db":  # django-celery-results: Django first
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.django_settings")
    django.setup()
app = Celery("bench", broker=BROKER or None, backend=os.environ.get("BENCH_BACKEND") or None,
             set_as_current=True)
transport: dict[str, float] = {}
if os.environ.get("BENCH_VISIBILITY"):
    transport["visibility_timeout"] = float(os.environ["BENCH_VISIBILITY"])
REPLICAS = int(os.environ.get("BENCH_STORE_REPLICAS") or 0)
app.conf.update(
    aaa_store_url=os.environ.get("BENCH_STORE") or BROKER,
    # overhead.py --store memory:// is a diagnostic that knows each process keeps its own store
    aaa_allow_process_local_store=(os.environ.get("BENCH_STORE") or "").startswith("memory:"),
    aaa_guard={"lease_ttl_s": float(os.environ.get("BENCH_LEASE_TTL", "15"))},
    # only a Redis store has the option (PostgreSQL refuses an option it does not take)
    aaa_store_options={"replicas": REPLICAS} if REPLICAS else {},
    aaa_recovery_interval_s=float(os.environ.get("BENCH_RECOVERY_S", "2")),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    broker_transport_options=transport,
    broker_connection_retry_on_startup=True,
)


# -- overhead: the same body three ways (trivial, or a sleep of BENCH_BODY_MS) ---------------------------------------
@app.task(name="bench.plain", acks_late=True)
def plain(i: int) -> int:
    return body(i)


@app.task(name="bench.guarded", base=GuardedTask)
def guarded(i: int) -> int:
    return body(i)


# -- takeover: a call that runs long on attempt 1 ------------------------------------
def _log_start(kind: str, task_id: str, attempt: int) -> None:
    url = os.environ.get("BENCH_STARTS")
    if url:
        import redis

        with redis.Redis.from_url(url) as r:
            r.rpush(f"bench:starts:{task_id}", f"{time.time()}|{os.getpid()}|{kind}|{attempt}")


@app.task(name="bench.sleep_plain", bind=True, acks_late=True, reject_on_worker_lost=True)
def sleep_plain(self, seconds: float) -> str:
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    _log_start("plain", self.request.id, 2 if redelivered else 1)
    if not redelivered:
        time.sleep(seconds)
    return "done"


@app.task(name="bench.sleep_guarded", base=GuardedTask)
def sleep_guarded(seconds: float, ctx: ToolContext) -> str:
    _log_start("guarded", ctx.meta["task_id"], ctx.attempt)
    if ctx.attempt == 1:
        time.sleep(seconds)
    return f"attempt {ctx.attempt}"


@app.task(name="bench.sleep_at_most_once", base=GuardedTask, delivery="at_most_once")
def sleep_at_most_once(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


handler = ToolHandler(registry)
handler.bind(app)
