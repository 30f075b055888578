"""``celery aaa doctor``: the app's settings against what the guarantees need.

Each check returns one :class:`Check`, ``pass``, ``warn`` or ``fail``, with what it saw
and what to do. The checks read the app (its settings and its guarded tasks), the store
that the app's guarded tasks use, and, where it can be asked, the fleet. A check that
raises is a failed check line naming the error, never a traceback that hides the others.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import AAACeleryError, UnsafeDeployment
from ..stores.base import OperatorStore
from ..worker.clock import skew_limit_s
from ..worker.setting_names import name_problems, spelled
from ..worker.settings import ALLOW_PROCESS_LOCAL, process_local
from ..worker.stores import app_store, store_url

if TYPE_CHECKING:
    from ..stores.redis import RedisStore

#: Clock skew between this host and the store, in seconds, that is worth a warning / a failure
#: (a failure from a quarter of the shortest lease on, if that is less: worker/clock.py).
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
    timeouts = f"timeouts ({longest:g} s)" if longest else "timeouts (no task sets timeout_s)"
    return Check("pass", "visibility_timeout", f"{vt:g} s, above lease TTLs ({ttl:g} s) and {timeouts}")


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


def check_setting_names(app: Any, tasks: list[Any]) -> Check:
    """``aaa_*`` settings that do nothing as written (a typo, an unprefixed name beside a
    namespace): what ``bind()`` and worker start refuse, for an app that ``bind()`` never saw."""
    errors, warns = name_problems(app)
    if errors:
        return Check("fail", "setting names", "; ".join(errors))
    if warns:
        return Check("warn", "setting names", "; ".join(warns))
    return Check("pass", "setting names", "every aaa_* setting is one, as Celery reads it")


def check_store_scope(app: Any, tasks: list[Any]) -> Check:
    """A store held in one process's memory is no store a fleet can share."""
    url = store_url(app)
    if not process_local(url):
        return Check("pass", "store shared", f"every process opens the same {url.partition(':')[0]} store")
    detail = (f"{_safe(url)} is held in one process's memory: each worker, each of its pool processes and "
              "this command has a store of its own, so the guard cannot keep a call from running twice")
    if app.conf.get(ALLOW_PROCESS_LOCAL):
        return Check("warn", "store shared", f"{detail} ({spelled(app, ALLOW_PROCESS_LOCAL)} is on: tests only)")
    return Check("fail", "store shared", f"{detail}; set {spelled(app, 'aaa_store_url')} to a redis://, "
                 "postgresql+psycopg:// or sqlite:/// URL")


#: The names a Flask app is looked up by in a module, when the target names none (as ``flask --app``).
FLASK_APP_NAMES = ("app", "application", "create_app", "make_app")


def _flask_app(target: str) -> Any:
    """The Flask app ``module:app``, ``module:create_app`` (called) or ``module`` (its ``app``,
    ``application``, ``create_app`` or ``make_app``)."""
    import importlib

    module_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path:  # as `flask --app` finds it: Celery took '' off the path after -A
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    found = [n for n in FLASK_APP_NAMES if hasattr(module, n)]
    attr = attr or (found[0] if found else "")
    if not attr:
        raise LookupError(f"module {module_name!r} has none of {', '.join(FLASK_APP_NAMES)}")
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            hint = f" (it has {', '.join(found)}: try {module_name}:{found[0]})" if found else ""
            raise LookupError(f"module {module_name!r} has no {attr!r}{hint}")
        obj = getattr(obj, part)
    return obj if hasattr(obj, "config") else obj()


def _django_pages_settings() -> Any:
    """The Django settings, when the aaa pages (``aaa_celery.contrib.django``) are installed."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    from django.conf import settings

    installed = [str(a) for a in getattr(settings, "INSTALLED_APPS", None) or []]
    if not any(a == "aaa_celery.contrib.django" or a.startswith("aaa_celery.contrib.django.") for a in installed):
        return None  # a project without the pages has no routes to protect
    return settings


def check_web_authorize(flask_app: str | None = None) -> Check | None:
    """The agent-run web routes need an ``AUTHORIZE`` hook; ``ALLOW_ANONYMOUS`` lets anyone
    approve calls (development only). Reads the Flask app ``flask_app`` (``module:app``,
    ``module:create_app`` or ``module``), else the Django settings named by
    ``DJANGO_SETTINGS_MODULE`` when ``aaa_celery.contrib.django`` is in ``INSTALLED_APPS``.
    None when no aaa web app is known."""
    name = "web authorize"
    if flask_app:
        try:
            app = _flask_app(flask_app)
        except AAACeleryError as e:  # init_app refuses routes without a hook
            return Check("fail", name, f"{flask_app}: {e}")
        except Exception as e:  # noqa: BLE001 - an app that cannot be loaded is what to report
            return Check("fail", name, f"{flask_app}: cannot load the Flask app: {type(e).__name__}: {e}")
        if "aaa_celery" not in getattr(app, "extensions", {}):
            return Check("warn", name, f"{flask_app} does not use AAACelery (no init_app): no aaa pages to check")
        authorize, anonymous = app.config.get("AAA_CELERY_AUTHORIZE"), app.config.get("AAA_CELERY_ALLOW_ANONYMOUS")
        where = f"{flask_app} AAA_CELERY_AUTHORIZE"
    else:
        settings = _django_pages_settings()
        if settings is None:
            return None
        config = getattr(settings, "AAA_CELERY", None) or {}
        authorize, anonymous = config.get("AUTHORIZE"), config.get("ALLOW_ANONYMOUS")
        where = "AAA_CELERY['AUTHORIZE']"
    if authorize:
        return Check("pass", name, f"{where} is set")
    if anonymous:
        return Check("fail", name, f"{where} is unset and ALLOW_ANONYMOUS is on: anyone who reaches the pages "
                     "may see runs and approve calls; set an authorize(request, run, call) hook")
    return Check("fail", name, f"{where} is unset: the routes refuse to load; set an authorize hook")


def _server_now(store: OperatorStore) -> float:
    """The store server's own clock: Redis TIME, PostgreSQL clock_timestamp(), else the store's."""
    engine = getattr(store, "engine", None)
    if getattr(store, "kind", "") == "postgresql" and engine is not None:
        import sqlalchemy as sa

        with engine.connect() as conn:
            return float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    return store.now()


def check_store(app: Any, tasks: list[Any], store: OperatorStore | None, error: str | None) -> Check:
    if store is None:
        return Check("fail", "store reachable", error or "no store")
    return Check("pass", "store reachable", f"{store.kind} store at {_safe(store_url(app))}")


def check_store_schema(store: OperatorStore) -> Check:
    """The store's schema version against this release's (``celery aaa migrate`` upgrades it)."""
    try:
        version = store.schema_version()
    except (AAACeleryError, OSError) as e:
        return Check("warn", "store schema", f"cannot read the store's version: {e}")
    if version.newer:
        return Check("fail", "store schema", f"{version.describe()}: upgrade aaa_celery on this host")
    if version.outdated:
        return Check("fail", "store schema", f"{version.describe()}: run `celery -A proj aaa migrate`, "
                     "or set aaa_store_auto_migrate=True (docs/upgrading.md)")
    return Check("pass", "store schema", version.describe())


def check_redis_aof(store: OperatorStore) -> Check | None:
    if getattr(store, "kind", "") != "redis":
        return None
    try:
        info = cast("RedisStore", store)._redis.info("persistence")  # noqa: SLF001 - the store's own client
    except Exception as e:  # noqa: BLE001 - a cluster or a restricted server may refuse INFO
        return Check("warn", "redis persistence", f"cannot read INFO persistence: {e}")
    if str(info.get("aof_enabled")) != "1":
        return Check("fail", "redis persistence", "appendonly is off: a Redis restart forgets leases, attempt "
                     "counters and results (a call may run twice); run redis-server with --appendonly yes")
    return Check("pass", "redis persistence", "AOF on")


def check_clock(store: OperatorStore, local: Callable[[], float] = time.time,
                tasks: list[Any] | None = None) -> Check:
    before = local()
    server = _server_now(store)
    after = local()
    skew = server - (before + after) / 2
    detail = f"store clock {skew:+.3f} s from this host's" if round(skew, 3) else "store clock within 1 ms of this host's"
    limit = min(SKEW_FAIL_S, skew_limit_s(tasks or []))
    if abs(skew) >= limit:
        return Check("fail", "clock skew", f"{detail} (a failure from {limit:.3f} s): leases and retention are "
                     "judged by the store's clock, Celery's eta/expires by this host's; run NTP on every host")
    if abs(skew) >= SKEW_WARN_S:
        return Check("warn", "clock skew", f"{detail}; run NTP on every host")
    return Check("pass", "clock skew", detail)


def check_worker_clocks(app: Any, tasks: list[Any], timeout_s: float = 1.0) -> Check:
    """Each worker's clock against the store's, as the worker measures it (``aaa_clock``)."""
    try:
        replies = app.control.broadcast("aaa_clock", reply=True, timeout=timeout_s) or []
    except Exception as e:  # noqa: BLE001 - the broker may be down; the check says so
        return Check("warn", "worker clocks", f"cannot ask the workers: {e}")
    seen: dict[str, float] = {}
    errors: list[str] = []
    limit = skew_limit_s(tasks)
    for reply in replies:
        for name, answer in reply.items():
            if isinstance(answer, dict) and isinstance(answer.get("ok"), dict):
                seen[name] = -float(answer["ok"]["offset_s"])  # the worker's clock minus the store's
            else:
                errors.append(f"{name}: {answer.get('error') if isinstance(answer, dict) else answer}")
    if not seen and not errors:
        return Check("warn", "worker clocks", "no worker answered aaa_clock (a worker of an older release, "
                     "or none running)")
    off = {n: v for n, v in sorted(seen.items()) if abs(v) > limit}
    if off:
        named = ", ".join(f"{n} {v:+.3f} s" for n, v in off.items())
        return Check("fail", "worker clocks", f"{named} off the store's clock (more than {limit:.3f} s, a quarter "
                     "of the shortest lease): run NTP on those hosts")
    if errors:
        return Check("warn", "worker clocks", f"{len(seen)} within {limit:.3f} s of the store's; "
                     f"could not measure: {'; '.join(errors)}")
    worst = max(seen.values(), key=abs)
    return Check("pass", "worker clocks", f"{len(seen)} workers within {limit:.3f} s of the store's clock "
                 f"(the farthest {worst:+.3f} s)")


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
    count = f"{len(names)} workers, all names distinct" if len(names) > 1 else "1 worker"
    return Check("pass", "worker node names", count)


def _safe(url: str) -> str:
    """A URL without its password."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.partition(':')[0]}:***@{host}"


def _checked(name: str, check: Callable[..., Check | None], *args: Any) -> Check | None:
    """``check(*args)``; a check that raises is a failed line naming the error."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
        return Check("fail", name, f"the check could not run: {type(e).__name__}: {e}")


def _open_store(app: Any) -> tuple[OperatorStore | None, list[Check]]:
    """The app's store, and the failed lines when it cannot be opened or reached."""
    try:
        store = app_store(app)
        store.now()
        return store, []
    except UnsafeDeployment as e:  # PostgreSQL behind a transaction-pooling proxy
        error = f"{type(e).__name__}: {e}"
        return None, [Check("fail", "postgres pooler mode", str(e)), check_store(app, [], None, error)]
    except Exception as e:  # noqa: BLE001 - a bad URL or driver error is a finding too
        return None, [check_store(app, [], None, f"{type(e).__name__}: {e}")]


def diagnose(app: Any, *, ping_timeout_s: float = 1.0, flask_app: str | None = None) -> list[Check]:
    """Every check, in order (those that do not apply to this deployment are left out)."""
    found: list[Check | None] = []
    try:
        tasks = guarded_tasks(app)
    except Exception as e:  # noqa: BLE001 - the app's task modules did not import
        tasks = []
        found.append(Check("fail", "guarded tasks", f"cannot import the app's tasks: {type(e).__name__}: {e}"))
    for name, check in (("setting names", check_setting_names), ("acks_late", check_acks_late),
                        ("reject_on_worker_lost", check_reject_on_worker_lost), ("serializers", check_serializers),
                        ("prefetch", check_prefetch), ("visibility_timeout", check_visibility_timeout),
                        ("rabbitmq consumer_timeout", check_consumer_timeout)):
        found.append(_checked(name, check, app, tasks))
    store, failed = _open_store(app)
    found.extend(failed)
    if store is not None:
        found.append(_checked("store reachable", check_store, app, tasks, store, None))
        found.append(_checked("store shared", check_store_scope, app, tasks))
        found.append(_checked("store schema", check_store_schema, store))
        if store.kind == "postgresql":
            found.append(Check("pass", "postgres pooler mode", "the store's sessions stay pinned (no "
                               "transaction-pooling proxy): its leases, session advisory locks, hold"))
        found.append(_checked("redis persistence", check_redis_aof, store))
        found.append(_checked("clock skew", check_clock, store, time.time, tasks))
        found.append(_checked("worker clocks", check_worker_clocks, app, tasks, ping_timeout_s))
    found.append(_checked("worker node names", check_node_names, app, ping_timeout_s))
    found.append(_checked("web authorize", check_web_authorize, flask_app))
    return [c for c in found if c is not None]
