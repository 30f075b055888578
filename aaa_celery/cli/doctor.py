"""``celery aaa doctor``: the app's settings against what the guarantees need.

Each check returns one :class:`Check`, ``pass``, ``warn`` or ``fail``, with what it saw
and what to do. The checks read the app (its settings and its guarded tasks), the store
that the app's guarded tasks use, and, where it can be asked, the fleet.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import AAACeleryError, UnsafeDeployment
from ..stores import Store
from ..worker.stores import app_store, store_url

#: Clock skew between this host and the store, in seconds, that is worth a warning / a failure.
SKEW_WARN_S, SKEW_FAIL_S = 0.5, 5.0


@dataclass(frozen=True)
class Check:
    status: str  # "pass" | "warn" | "fail"
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():<4} {self.name}: {self.detail}"


def guarded_tasks(app: Any) -> list[Any]:
    """The app's guarded tasks (GuardedTask and bound tools)."""
    app.loader.import_default_modules()
    return sorted((t for t in app.tasks.values() if hasattr(t, "guard_config")), key=lambda t: t.name)


def _enabled(tasks: list[Any]) -> list[Any]:
    return [t for t in tasks if t.guard_config.enabled]


def check_acks_late(app: Any, tasks: list[Any]) -> Check:
    early = [t.name for t in _enabled(tasks) if not t.acks_late]
    if early:
        return Check("fail", "acks_late", f"{early} ack before they run: a worker lost mid-call loses the message; "
                     "keep acks_late=True (GuardedTask's default)")
    return Check("pass", "acks_late", f"{len(tasks)} guarded tasks ack after they finish")


def check_reject_on_worker_lost(app: Any, tasks: list[Any]) -> Check:
    off = [t.name for t in _enabled(tasks) if not t.reject_on_worker_lost]
    if off:
        return Check("fail", "reject_on_worker_lost", f"{off}: a killed pool child's message is acked as failed "
                     "instead of redelivered; keep reject_on_worker_lost=True (GuardedTask's default)")
    return Check("pass", "reject_on_worker_lost", "a killed child's message goes back to the queue")


def check_serializers(app: Any, tasks: list[Any]) -> Check:
    conf = app.conf
    used = set(conf.accept_content or []) | {conf.task_serializer, conf.result_serializer}
    risky = sorted(str(c) for c in used if c and ("pickle" in str(c) or "yaml" in str(c)))
    if risky:
        return Check("fail", "serializers", f"{risky} accepted: set accept_content=['json'], "
                     "task_serializer='json', result_serializer='json'")
    return Check("pass", "serializers", f"JSON only ({sorted(map(str, filter(None, used)))})")


def check_prefetch(app: Any, tasks: list[Any]) -> Check:
    multiplier = app.conf.worker_prefetch_multiplier
    if multiplier is None or multiplier > 1:
        return Check("warn", "prefetch", f"worker_prefetch_multiplier={multiplier}: a worker holds messages it "
                     "cannot start while a long tool runs; set worker_prefetch_multiplier=1")
    return Check("pass", "prefetch", f"worker_prefetch_multiplier={multiplier}")


def check_visibility_timeout(app: Any, tasks: list[Any]) -> Check:
    broker = str(app.conf.broker_url or "")
    if not broker.startswith(("redis", "rediss", "sqs")):
        return Check("pass", "visibility_timeout", f"not used by the {broker.partition(':')[0] or '?'} broker")
    vt = float((app.conf.broker_transport_options or {}).get("visibility_timeout", 3600))
    guarded = _enabled(tasks)
    ttl = max((t.guard_config.lease_ttl_s for t in guarded), default=0.0)
    longest = max((t.timeout_s or 0.0 for t in guarded), default=0.0)
    if vt < ttl:
        return Check("fail", "visibility_timeout", f"{vt:g} s is below a lease TTL ({ttl:g} s): the broker "
                     "redelivers calls whose holder is alive; raise broker_transport_options"
                     "['visibility_timeout'] above every lease_ttl_s")
    if vt < longest:
        return Check("warn", "visibility_timeout", f"{vt:g} s is below a task's timeout_s ({longest:g} s): long "
                     "calls are redelivered while they run (the guard drops the copies)")
    return Check("pass", "visibility_timeout", f"{vt:g} s, above lease TTLs ({ttl:g} s) and timeouts ({longest:g} s)")


#: RabbitMQ's default ``consumer_timeout`` (ms): a delivery unacked that long closes the channel.
RABBITMQ_CONSUMER_TIMEOUT_MS = 1_800_000


def check_consumer_timeout(app: Any, tasks: list[Any]) -> Check | None:
    """RabbitMQ: a task that runs past ``consumer_timeout`` has its channel closed and its
    message redelivered while it still runs (celery-facts §8). The timeout is the queues'
    ``x-consumer-timeout`` argument, else the app setting ``aaa_rabbitmq_consumer_timeout_s``
    (what the server is configured with), else RabbitMQ's default, 30 minutes."""
    broker = str(app.conf.broker_url or "")
    if not broker.startswith(("amqp", "pyamqp", "amqps")):
        return None
    per_queue = [int(a["x-consumer-timeout"]) for q in (app.conf.task_queues or [])
                 if (a := getattr(q, "queue_arguments", None) or {}).get("x-consumer-timeout")]
    configured = app.conf.get("aaa_rabbitmq_consumer_timeout_s")
    limit_ms = min(per_queue) if per_queue else (
        int(float(configured) * 1000) if configured else RABBITMQ_CONSUMER_TIMEOUT_MS)
    guarded = _enabled(tasks)
    too_long = sorted(t.name for t in guarded if t.timeout_s and t.timeout_s * 1000 >= limit_ms)
    unbounded = sorted(t.name for t in guarded if not t.timeout_s)
    name = "rabbitmq consumer_timeout"
    if too_long:
        return Check("fail", name, f"{too_long} may run past consumer_timeout ({limit_ms / 1000:g} s): RabbitMQ "
                     "closes the channel and redelivers the call while it runs; raise consumer_timeout "
                     "(or x-consumer-timeout) above every timeout_s")
    if unbounded:
        return Check("warn", name, f"{unbounded} have no timeout_s: one running past consumer_timeout "
                     f"({limit_ms / 1000:g} s) is redelivered while it runs")
    return Check("pass", name, f"every timeout_s is below consumer_timeout ({limit_ms / 1000:g} s)")


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj = __import__(module, fromlist=["_"])
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    return obj


def check_web_authorize(flask_app: str | None = None) -> Check | None:
    """The agent-run web routes need an ``AUTHORIZE`` hook; ``ALLOW_ANONYMOUS`` lets anyone
    approve calls (development only). Reads the Flask app ``flask_app`` (``module:app`` or
    ``module:create_app``), else the Django settings named by ``DJANGO_SETTINGS_MODULE``."""
    name = "web authorize"
    if flask_app:
        try:
            app = _import(flask_app)
            if not hasattr(app, "config"):
                app = app()
        except AAACeleryError as e:  # init_app refuses routes without a hook
            return Check("fail", name, f"{flask_app}: {e}")
        authorize, anonymous = app.config.get("AAA_CELERY_AUTHORIZE"), app.config.get("AAA_CELERY_ALLOW_ANONYMOUS")
        where = f"{flask_app} AAA_CELERY_AUTHORIZE"
    elif os.environ.get("DJANGO_SETTINGS_MODULE"):
        from django.conf import settings

        config = getattr(settings, "AAA_CELERY", None) or {}
        authorize, anonymous = config.get("AUTHORIZE"), config.get("ALLOW_ANONYMOUS")
        where = "AAA_CELERY['AUTHORIZE']"
    else:
        return None
    if authorize:
        return Check("pass", name, f"{where} is set")
    if anonymous:
        return Check("fail", name, f"{where} is unset and ALLOW_ANONYMOUS is on: anyone who reaches the pages "
                     "may see runs and approve calls; set an authorize(request, run, call) hook")
    return Check("fail", name, f"{where} is unset: the routes refuse to load; set an authorize hook")


def _server_now(store: Store) -> float:
    """The store server's own clock: Redis TIME, PostgreSQL clock_timestamp(), else the store's."""
    engine = getattr(store, "engine", None)
    if getattr(store, "kind", "") == "postgresql" and engine is not None:
        import sqlalchemy as sa

        with engine.connect() as conn:
            return float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    return store.now()


def check_store(app: Any, tasks: list[Any], store: Store | None, error: str | None) -> Check:
    if store is None:
        return Check("fail", "store reachable", error or "no store")
    return Check("pass", "store reachable", f"{store.kind} store at {_safe(store_url(app))}")


def check_redis_aof(store: Store) -> Check | None:
    if getattr(store, "kind", "") != "redis":
        return None
    try:
        info = store._redis.info("persistence")  # noqa: SLF001 - the store's own client
    except Exception as e:  # noqa: BLE001 - a cluster or a restricted server may refuse INFO
        return Check("warn", "redis persistence", f"cannot read INFO persistence: {e}")
    if str(info.get("aof_enabled")) != "1":
        return Check("fail", "redis persistence", "appendonly is off: a Redis restart forgets leases, attempt "
                     "counters and results (a call may run twice); run redis-server with --appendonly yes")
    return Check("pass", "redis persistence", "AOF on")


def check_clock(store: Store, local: Callable[[], float] = time.time) -> Check:
    before = local()
    server = _server_now(store)
    after = local()
    skew = server - (before + after) / 2
    detail = f"store clock {skew:+.3f} s from this host's"
    if abs(skew) >= SKEW_FAIL_S:
        return Check("fail", "clock skew", f"{detail}: leases and retention are judged by the store's clock; "
                     "run NTP on every host")
    if abs(skew) >= SKEW_WARN_S:
        return Check("warn", "clock skew", f"{detail}; run NTP on every host")
    return Check("pass", "clock skew", detail)


def check_node_names(app: Any, timeout_s: float = 1.0) -> Check:
    try:
        replies = app.control.broadcast("ping", reply=True, timeout=timeout_s) or []
    except Exception as e:  # noqa: BLE001 - the broker may be down; the check says so
        return Check("warn", "worker node names", f"cannot ask the workers: {e}")
    names = Counter(name for reply in replies for name in reply)
    dupes = sorted(n for n, c in names.items() if c > 1)
    if dupes:
        return Check("fail", "worker node names", f"{dupes} answered more than once: give every worker its own "
                     "-n name@%h (holders and remote control are told apart by it)")
    if not names:
        return Check("warn", "worker node names", "no worker answered a ping")
    return Check("pass", "worker node names", f"{len(names)} workers, all names distinct")


def _safe(url: str) -> str:
    """A URL without its password."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.partition(':')[0]}:***@{host}"


def diagnose(app: Any, *, ping_timeout_s: float = 1.0, flask_app: str | None = None) -> list[Check]:
    """Every check, in order (those that do not apply to this deployment are left out)."""
    tasks = guarded_tasks(app)
    checks = [check(app, tasks) for check in (check_acks_late, check_reject_on_worker_lost, check_serializers,
                                               check_prefetch, check_visibility_timeout)]
    rabbit = check_consumer_timeout(app, tasks)
    if rabbit is not None:
        checks.append(rabbit)
    store, error = None, None
    try:
        store = app_store(app)
        store.now()
    except UnsafeDeployment as e:  # PostgreSQL behind a transaction-pooling proxy
        store, error = None, f"{type(e).__name__}: {e}"
        checks.append(Check("fail", "postgres pooler mode", str(e)))
    except (AAACeleryError, OSError) as e:
        store, error = None, f"{type(e).__name__}: {e}"
    checks.append(check_store(app, tasks, store, error))
    if store is not None and store.kind == "postgresql":
        checks.append(Check("pass", "postgres pooler mode", "the store's sessions stay pinned (no "
                            "transaction-pooling proxy): its leases, session advisory locks, hold"))
    if store is not None:
        aof = check_redis_aof(store)
        if aof is not None:
            checks.append(aof)
        checks.append(check_clock(store))
    checks.append(check_node_names(app, ping_timeout_s))
    web = check_web_authorize(flask_app)
    if web is not None:
        checks.append(web)
    return checks
