"""Prometheus metrics of the guard, exposed by each worker (``pip install aaa_celery[metrics]``).

Turned on per worker by a port: the app setting ``aaa_metrics_port``, or the environment
variable ``AAA_METRICS_PORT`` (one per worker process on a host), and optionally
``aaa_metrics_addr`` or ``AAA_METRICS_ADDR`` (default ``127.0.0.1``; ``0.0.0.0`` to be
scraped from elsewhere).
The worker's main process then serves ``http://<addr>:<port>/metrics``.

**Prefork.** The pool's children run the calls, so the metrics use prometheus-client's
multiprocess mode: before the pool forks, the worker points ``PROMETHEUS_MULTIPROC_DIR``
at a fresh directory of its own (unless it is set already: then it is yours to empty at
start), every process writes its samples there, and the main process's endpoint adds them
up. A child that dies keeps its counts. Solo and threads pools work the same way.

**Names and labels** follow celery-exporter (``name``, ``queue_name``, ``hostname``; the
worker's node name); no call id is ever a label, and a concurrency key only as the store's
digest of it, for at most :data:`SLOT_KEY_LABELS` keys per process (the rest: ``key="other"``):

=============================================  =======================================================
``aaa_task_attempts_started_total``            attempts claimed and started
``aaa_task_takeovers_total``                   attempts n > 1 (a lost attempt taken over)
``aaa_task_duplicates_absorbed_total``         deliveries dropped because another worker held the call
``aaa_task_fenced_total``                      attempts cancelled after losing their lease
``aaa_task_stale_results_total``               results of superseded attempts, kept as audit only
``aaa_task_reconciled_total``                  calls settled by a ``reconcile`` function
``aaa_task_outcome_unknown_total``             calls ended as ``OutcomeUnknown``
``aaa_task_abandoned_total``                   calls ended as ``ExecutionAbandoned``
``aaa_task_slot_waits_total``                  deliveries sent back to wait for a concurrency slot
``aaa_task_slot_skips_total``                  calls skipped or refused: every concurrency slot of their key held
``aaa_slots_held``                             gauge: concurrency slots the worker's calls hold (``key``, ``hostname``)
``aaa_task_runtime_seconds``                   histogram: an attempt's start to its recorded result
``aaa_lease_renew_failures_total``             renewals that failed (``hostname``)
``aaa_heartbeat_lag_seconds``                  histogram: how late each renewal came (``hostname``)
``aaa_store_latency_seconds``                  histogram: store round trips (``op``, ``store``, ``hostname``)
=============================================  =======================================================

The task counters come from the guard's audit events as the runner emits them
(:class:`~aaa_celery.worker.events.TaskEvents`); the store ones from :class:`MeteredStore`,
which wraps the app's store in each worker process.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from celery import bootsteps
from celery.signals import task_postrun, worker_process_init

from ..config import GuardConfig
from ..errors import ConfigError
from ..lifecycle import (
    COMPLETED,
    FAILED,
    FENCED,
    RECONCILED,
    RETRIED,
    SLOT_GRACE_S,
    STALE_RESULT,
    STARTED,
    BeginResult,
    CallSpec,
    Checkpoint,
    Claimed,
    Draft,
    Event,
    FinishResult,
    Lease,
    Outcome,
    RecordKind,
    SlotPlan,
)
from ..stores.base import ResultCopy, Store, StoreVersion
from ..stores.runs import RunRecord

from .setting_names import spelled
from .stores import app_store, use_store

if TYPE_CHECKING:
    from ..stores.ops import CallRecord

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("aaa_celery.worker")

PORT_SETTING, ADDR_SETTING = "aaa_metrics_port", "aaa_metrics_addr"
PORT_ENV, ADDR_ENV = "AAA_METRICS_PORT", "AAA_METRICS_ADDR"
#: The worker's node name, recorded before the pool forks (children label store metrics with it).
HOSTNAME_SETTING = "aaa_metrics_hostname"
_TASK_LABELS = ("name", "queue_name", "hostname")
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def configured_port(app: Any) -> int | None:
    """The metrics port of this worker process, or None (metrics off)."""
    raw = os.environ.get(PORT_ENV) or app.conf.get(PORT_SETTING)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{spelled(app, PORT_SETTING)}/{PORT_ENV}: {raw!r} is not a port number") from None


class Metrics:
    """The guard's metric objects (made once per worker, before the pool forks)."""

    def __init__(self, registry: Any = None) -> None:
        try:
            from prometheus_client import REGISTRY, Counter, Gauge, Histogram
        except ImportError as e:
            raise ConfigError("aaa metrics need prometheus-client: pip install 'aaa_celery[metrics]'") from e
        reg = REGISTRY if registry is None else registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = _TASK_LABELS) -> Any:
            return Counter(name, doc, labels, registry=reg)

        self.started = counter("aaa_task_attempts_started", "Attempts of guarded calls claimed and started.")
        self.takeovers = counter("aaa_task_takeovers", "Attempts n > 1: a lost attempt taken over.")
        self.duplicates = counter("aaa_task_duplicates_absorbed",
                                  "Deliveries dropped because another worker held the call.")
        self.fenced = counter("aaa_task_fenced", "Attempts cancelled after losing their lease.")
        self.stale = counter("aaa_task_stale_results", "Results of superseded attempts, kept as audit only.")
        self.reconciled = counter("aaa_task_reconciled", "Calls settled by their reconcile function.")
        self.unknown = counter("aaa_task_outcome_unknown", "Calls ended as OutcomeUnknown.")
        self.abandoned = counter("aaa_task_abandoned", "Calls ended as ExecutionAbandoned.")
        self.slot_waits = counter("aaa_task_slot_waits", "Deliveries sent back to wait for a concurrency slot.")
        self.slot_skips = counter("aaa_task_slot_skips",
                                  "Calls skipped or refused: every concurrency slot of their key was held.")
        self.slots_held = Gauge("aaa_slots_held", "Concurrency slots the worker's calls hold, per key.",
                                ("key", "hostname"), multiprocess_mode="livesum", registry=reg)
        self.runtime = Histogram("aaa_task_runtime_seconds", "From an attempt's start to its recorded result.",
                                 _TASK_LABELS, buckets=_DURATION_BUCKETS, registry=reg)
        self.renew_failures = counter("aaa_lease_renew_failures", "Lease renewals that failed.", ("hostname",))
        self.heartbeat_lag = Histogram("aaa_heartbeat_lag_seconds", "How late each lease renewal came.",
                                       ("hostname",), buckets=_LAG_BUCKETS, registry=reg)
        self.store_latency = Histogram("aaa_store_latency_seconds", "Store round trips of the guard.",
                                       ("op", "store", "hostname"), buckets=_LATENCY_BUCKETS, registry=reg)


_metrics: Metrics | None = None
_local = threading.local()


def current() -> Metrics | None:
    """This process's metrics, if the worker turned them on."""
    return _metrics


def enable_multiprocess() -> str:
    """Use prometheus-client's multiprocess mode in this process and the children it forks;
    returns the samples' directory."""
    from prometheus_client import values

    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")
    if not path:
        path = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="aaa-metrics-")
        atexit.register(_remove_samples, path, os.getpid())  # ours: gone with the worker
    os.makedirs(path, exist_ok=True)
    if values.ValueClass is values.MutexValue:
        # Chosen when prometheus_client was first imported; ours are made after this.
        # (prometheus-client leaves MultiProcessValue and MultiProcessCollector unannotated)
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    return path


def _remove_samples(path: str, owner: int) -> None:
    if os.getpid() == owner:  # the worker's main process, never a pool child that exits
        shutil.rmtree(path, ignore_errors=True)


def setup(registry: Any = None) -> Metrics:
    """Make this process's metrics (once)."""
    global _metrics
    if _metrics is None:
        _metrics = Metrics(registry)
    return _metrics


def serve(port: int, addr: str, path: str) -> Any:
    """Serve the samples of every process of this worker on ``addr:port``."""
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]  # unannotated
    return start_http_server(port, addr=addr, registry=registry)


# -- Task events -> counters -------------------------------------------------------------------


class Observer:
    """Counts one delivery's audit events (made by ``TaskEvents`` for each delivery)."""

    def __init__(self, metrics: Metrics, task: Any) -> None:
        self.metrics = metrics
        request = task.request
        self.labels = {"name": task.name, "hostname": str(getattr(request, "hostname", None) or ""),
                       "queue_name": str((getattr(request, "delivery_info", None) or {}).get("routing_key") or "")}
        self.task_id = getattr(request, "id", None)
        self.started_at: float | None = None

    def __call__(self, audit_type: str, attempt: int | None, fields: dict[str, Any]) -> None:
        m, labels = self.metrics, self.labels
        if audit_type == STARTED:
            self.started_at = time.monotonic()
            m.started.labels(**labels).inc()
            if (attempt or 1) > 1:
                m.takeovers.labels(**labels).inc()
        elif audit_type in (COMPLETED, FAILED):
            if self.started_at is not None:
                m.runtime.labels(**labels).observe(time.monotonic() - self.started_at)
            error = fields.get("error")
            if error == "OutcomeUnknown":
                m.unknown.labels(**labels).inc()
            elif error == "ExecutionAbandoned":
                m.abandoned.labels(**labels).inc()
            elif fields.get("slot"):  # lifecycle.busy_outcome: CallSkipped, or PolicyDenied
                m.slot_skips.labels(**labels).inc()
        elif audit_type == FENCED:
            m.fenced.labels(**labels).inc()
        elif audit_type == STALE_RESULT:
            m.stale.labels(**labels).inc()
        elif audit_type == RECONCILED and fields.get("error") != "OutcomeUnknown":
            m.reconciled.labels(**labels).inc()  # settled: it happened, or it did not
        if audit_type in (FENCED, STALE_RESULT, RETRIED):
            _local.explained = self.task_id  # this delivery's Ignore is not a duplicate


def observer(task: Any) -> Observer | None:
    """An observer of one delivery of ``task``, or None when metrics are off."""
    return None if _metrics is None else Observer(_metrics, task)


def slot_wait(task: Any) -> None:
    """Count a delivery of ``task`` sent back to wait for a concurrency slot (metrics on)."""
    if _metrics is not None:
        request = task.request
        _metrics.slot_waits.labels(
            name=task.name, hostname=str(getattr(request, "hostname", None) or ""),
            queue_name=str((getattr(request, "delivery_info", None) or {}).get("routing_key") or ""),
        ).inc()


def on_task_postrun(sender: Any = None, task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    """``task_postrun`` receiver: a guarded delivery that ended ignored (acked without a
    result) without being fenced or stale was a duplicate that found the call held."""
    explained, _local.explained = getattr(_local, "explained", None), None
    if _metrics is None or state != "IGNORED" or not hasattr(sender, "guard_config") or explained == task_id:
        return
    request = sender.request
    _metrics.duplicates.labels(
        name=sender.name, hostname=str(getattr(request, "hostname", None) or ""),
        queue_name=str((getattr(request, "delivery_info", None) or {}).get("routing_key") or ""),
    ).inc()


# -- The store, timed -------------------------------------------------------------------------


def _safely(record: Any) -> None:
    """Record a sample; a metrics failure (its directory gone, a full disk) never fails the
    store operation it measures."""
    try:
        record()
    except Exception as e:  # noqa: BLE001 - monitoring never fails a call
        log.debug("aaa: a store metric was not recorded: %r", e)


#: The most concurrency keys one process labels ``aaa_slots_held`` with; the slots of any
#: further key count under ``key="other"``, so keys made from argument values cannot grow
#: the metric's series without bound.
SLOT_KEY_LABELS = 100


class HeldSlots:
    """The concurrency slots this process's calls hold, by key, as the ``aaa_slots_held``
    gauge: a take that the store granted adds one until its slot would lapse (the lease TTL
    and ``lifecycle.SLOT_GRACE_S``, unless renewed: a call that lost its lease keeps no
    slot); a take that found every slot held (a renewal that lost its slot) or a free
    removes it. The gauge is set at each take and free of the process."""

    def __init__(self, metrics: Metrics, hostname: str) -> None:
        self.metrics, self.hostname = metrics, hostname
        self._until: dict[str, dict[str, float]] = {}  # key -> call id -> when its slot lapses (monotonic)
        self._labels: dict[str, str] = {}
        self._lock = threading.Lock()

    def note(self, key: str, call_id: str, ttl_s: float | None) -> None:
        """``call_id`` holds a slot of ``key`` for ``ttl_s`` more (None: it holds none)."""
        now = time.monotonic()
        with self._lock:
            calls = self._until.setdefault(key, {})
            if ttl_s is None:
                calls.pop(call_id, None)
            else:
                calls[call_id] = now + ttl_s + SLOT_GRACE_S
            if key not in self._labels:
                named = len(set(self._labels.values()) - {"other"})
                self._labels[key] = key if named < SLOT_KEY_LABELS else "other"
            counts: dict[str, int] = {}
            for k, label in self._labels.items():
                counts[label] = counts.get(label, 0) + sum(1 for t in self._until.get(k, {}).values() if t > now)
        for label, count in counts.items():
            _safely(lambda: self.metrics.slots_held.labels(key=label, hostname=self.hostname).set(count))


class MeteredStore(Store):
    """A store whose round trips, renewals and heartbeat lag are measured: every verb of the
    store interfaces is written out here, timed, and handed to the wrapped store (a verb added
    to an interface fails tests/worker/test_metered_store.py until it is added here). A
    backend's own attributes (a PostgreSQL store's ``engine``) are reached through it unchanged."""

    def __init__(self, inner: Store, metrics: Metrics, hostname: str) -> None:
        self.inner, self.metrics, self.hostname = inner, metrics, hostname
        self.kind, self.ttl_leases = inner.kind, inner.ttl_leases
        self._beats: dict[str, tuple[float, float]] = {}  # lease token -> (last renewal, period)
        self._beats_lock = threading.Lock()
        self._slots = HeldSlots(metrics, hostname)

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes, not the verbs
        return getattr(self.inner, name)

    def _timed(self, op: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            _safely(lambda: self.metrics.store_latency.labels(op=op, store=self.kind, hostname=self.hostname)
                    .observe(elapsed))

    def _forget(self, lease: Lease) -> None:
        with self._beats_lock:
            self._beats.pop(lease.token, None)

    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        got: BeginResult = self._timed("begin", self.inner.begin, call, worker, config, token)
        if isinstance(got, Claimed):
            with self._beats_lock:
                self._beats[got.lease.token] = (time.monotonic(), config.heartbeat_period_s)
        return got

    def renew(self, lease: Lease) -> bool:
        now = time.monotonic()
        with self._beats_lock:
            last = self._beats.get(lease.token)
            if last is not None:
                self._beats[lease.token] = (now, last[1])
        if last is not None:
            lag = max(0.0, now - last[0] - last[1])
            _safely(lambda: self.metrics.heartbeat_lag.labels(hostname=self.hostname).observe(lag))
        ok = False
        try:
            ok = bool(self._timed("renew", self.inner.renew, lease))
            return ok
        finally:
            if not ok and self._held(lease):
                _safely(lambda: self.metrics.renew_failures.labels(hostname=self.hostname).inc())

    def _held(self, lease: Lease) -> bool:
        """Whether no end of ``lease`` (finish, release, hand-on, fence) has begun: the
        heartbeat goes on through ``finish``, so a renewal in flight as the call finishes
        finds its lease gone, and that is no failure (the guard ignores it too)."""
        with self._beats_lock:
            return lease.token in self._beats

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig,
               copy: ResultCopy | None = None) -> FinishResult:
        self._forget(lease)
        if copy is None:  # an inner store written for 0.1 takes no copy
            return self._timed("finish", self.inner.finish, lease, outcome, config)
        return self._timed("finish", self.inner.finish, lease, outcome, config, copy)

    def release(self, lease: Lease) -> None:
        self._forget(lease)
        self._timed("release", self.inner.release, lease)

    def hand_on(self, lease: Lease) -> None:
        self._forget(lease)
        self._timed("hand_on", self.inner.hand_on, lease)

    def fenced(self, lease: Lease, cause: str | None = None) -> None:
        self._forget(lease)
        self._timed("fenced", self.inner.fenced, lease, cause)

    def close(self) -> None:
        self.inner.close()

    # -- every other verb, timed -----------------------------------------------------------

    def register(self, call: CallSpec) -> None:
        self._timed("register", self.inner.register, call)

    def register_many(self, calls: list[CallSpec]) -> None:
        self._timed("register_many", self.inner.register_many, calls)

    def record(self, call: CallSpec, outcome: Outcome, kind: RecordKind = "first") -> bool:
        return self._timed("record", self.inner.record, call, outcome, kind)

    def events(self, call_id: str) -> list[Event]:
        return self._timed("events", self.inner.events, call_id)

    def result(self, call_id: str) -> Outcome | None:
        return self._timed("result", self.inner.result, call_id)

    def save_checkpoint(self, lease: Lease, checkpoint: str) -> bool:
        return self._timed("save_checkpoint", self.inner.save_checkpoint, lease, checkpoint)

    def last_checkpoint(self, call_id: str) -> Checkpoint | None:
        return self._timed("last_checkpoint", self.inner.last_checkpoint, call_id)

    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        return self._timed("expired", self.inner.expired, now, unclaimed_grace_s)

    def claim_recovery(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int:
        return self._timed("claim_recovery", self.inner.claim_recovery, call_id, worker, hold_s, max_hold_s)

    def abandon(self, call: CallSpec, outcome: Outcome) -> bool:
        return self._timed("abandon", self.inner.abandon, call, outcome)

    def calls(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]:
        return self._timed("calls", self.inner.calls, since, until)

    def resolve(self, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                value: Any = None) -> Outcome:
        return self._timed("resolve", self.inner.resolve, call_id, verdict, note, by, value)

    def settle(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool:
        return self._timed("settle", self.inner.settle, call_id, expected, outcome, event)

    def purge(self, before: float) -> int:
        return self._timed("purge", self.inner.purge, before)

    def spend(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool:
        return self._timed("spend", self.inner.spend, key, token, amount, limit, window_s)

    def take_slot(self, key: str, call_id: str, limit: int, ttl_s: float) -> SlotPlan:
        plan: SlotPlan = self._timed("take_slot", self.inner.take_slot, key, call_id, limit, ttl_s)
        self._slots.note(key, call_id, None if plan.reply == "full" else ttl_s)
        return plan

    def free_slot(self, key: str, call_id: str) -> None:
        try:
            self._timed("free_slot", self.inner.free_slot, key, call_id)
        finally:
            self._slots.note(key, call_id, None)  # a slot left unfreed lapses in the store

    def slot_holders(self, key: str) -> list[str]:
        return self._timed("slot_holders", self.inner.slot_holders, key)

    def put_run(self, record: RunRecord) -> None:
        self._timed("put_run", self.inner.put_run, record)

    def get_run(self, key: str) -> RunRecord | None:
        return self._timed("get_run", self.inner.get_run, key)

    def list_runs(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False,
                  limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]:
        return self._timed("list_runs", self.inner.list_runs, tenant=tenant, all_tenants=all_tenants,
                           active=active, limit=limit, before=before)

    def find_runs(self, run_id: str) -> list[RunRecord]:
        return self._timed("find_runs", self.inner.find_runs, run_id)

    def lease_run(self, key: str, holder: str, ttl_s: float) -> bool:
        return self._timed("lease_run", self.inner.lease_run, key, holder, ttl_s)

    def release_run(self, key: str, holder: str) -> None:
        self._timed("release_run", self.inner.release_run, key, holder)

    def forget_run(self, key: str) -> None:
        self._timed("forget_run", self.inner.forget_run, key)

    def purge_runs(self, before: float) -> int:
        return self._timed("purge_runs", self.inner.purge_runs, before)

    def append_run_events(self, key: str, events: Sequence[dict[str, Any]]) -> None:
        self._timed("append_run_events", self.inner.append_run_events, key, events)

    def run_events(self, key: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return self._timed("run_events", self.inner.run_events, key, after, limit)

    def record_turn(self, key: str, turn: int, response: dict[str, Any]) -> dict[str, Any]:
        return self._timed("record_turn", self.inner.record_turn, key, turn, response)

    def recorded_turn(self, key: str, turn: int) -> dict[str, Any] | None:
        return self._timed("recorded_turn", self.inner.recorded_turn, key, turn)

    def decide_approval(self, key: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool:
        return self._timed("decide_approval", self.inner.decide_approval, key, call_id, digest, decision)

    def approval_decision(self, key: str, call_id: str, digest: str) -> dict[str, Any] | None:
        return self._timed("approval_decision", self.inner.approval_decision, key, call_id, digest)

    def schema_version(self) -> StoreVersion:
        return self._timed("schema_version", self.inner.schema_version)

    def migrate(self) -> StoreVersion:
        return self._timed("migrate", self.inner.migrate)

    def now(self) -> float:
        return self._timed("now", self.inner.now)


def meter_store(app: Any) -> None:
    """Make this process use the app's store, metered (a worker process with metrics on)."""
    if _metrics is None:
        return
    store = app_store(app)
    if not isinstance(store, MeteredStore):
        hostname = str(app.conf.get(HOSTNAME_SETTING) or "")
        use_store(app, MeteredStore(store, _metrics, hostname))


class MetricsStep(bootsteps.StartStopStep):
    """A worker bootstep serving the guard's metrics when the worker has a metrics port."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        app = worker.app
        self.port, self.server, self.path = configured_port(app), None, ""
        if self.port is None:
            return
        # Before the pool forks: the children inherit the mode, the metrics and the receivers.
        self.path = enable_multiprocess()
        setup()
        app.conf[HOSTNAME_SETTING] = str(getattr(worker, "hostname", "") or "")
        task_postrun.connect(on_task_postrun, weak=False, dispatch_uid="aaa_celery.metrics.postrun")

        def meter_child(**_: Any) -> None:
            try:
                meter_store(app)
            except Exception as e:  # noqa: BLE001 - never stop a child for its metrics
                log.warning("aaa: no store metrics in this pool process: %s", e)

        worker_process_init.connect(meter_child, weak=False, dispatch_uid="aaa_celery.metrics.meter_child")

    def start(self, worker: Any) -> None:
        if self.port is None or self.server is not None:
            return
        meter_store(worker.app)  # the main process: recovery sweeps, and the calls of solo/threads pools
        addr = str(os.environ.get(ADDR_ENV) or worker.app.conf.get(ADDR_SETTING) or "127.0.0.1")
        self.server = serve(self.port, addr, self.path)
        log.info("aaa: metrics on http://%s:%s/metrics (samples in %s)", addr, self.port, self.path)

    def stop(self, worker: Any) -> None:
        server, self.server = self.server, None
        if isinstance(server, tuple):  # prometheus-client >= 0.20 returns (server, thread)
            server[0].shutdown()
