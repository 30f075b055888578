"""The chaos run: a seeded workload and nemesis against a real ``celery worker`` fleet.

:class:`ChaosRun` starts (or uses) Redis, a fleet of prefork workers of
:mod:`aaa_celery.chaos.app`, sends the planned calls at their planned times,
injects the planned faults from a second thread, restarts killed workers so the
fleet keeps its size, waits for the calls to drain, stops everything, and
checks the history with :func:`~aaa_celery.testing.check_history`.

The plan (calls, their length and policy, fault times, kinds and targets) is a
pure function of the seed and the sizes, so ``--baseline`` replays the same
workload and faults on plain Celery.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from ..testing.checker import Call, LeaseEnd, Loss, PathCut, RecordedStore, check_history, excuse, executions, summarize
from ..testing.faults import FAKETIME_LIBRARY, Frozen, freeze, kill9, pool_children, skewed_clock, stop_process
from ..testing.fleet import WorkerProcess
from ..testing.ledger import EFFECT, END, EffectLedger
from .app import EFFECTS_TABLE, LIMITED_TASKS, TASKS, effects_metadata, make_app
from .proxy import Link, ProxyHub

WORKER_FAULTS = ("kill_main", "kill_child", "freeze_kill", "stop_cont")
#: Faults of the store itself: a Redis store the run starts, with AOF (``appendfsync always``).
#: ``store_pause``: ``CLIENT PAUSE ... WRITE`` for longer than the lease TTL, timed to begin
#: just before a running body returns (so its ``finish`` meets the pause); ``store_restart``: the store's redis-server killed -9 and started again on its
#: data; ``store_failover``: a replica of the store promoted while the old primary (the one
#: the workers use) replicates from it and answers READONLY, for a few seconds, then back.
#: Only in runs that name them in ``kinds``.
STORE_FAULTS = ("store_pause", "store_restart", "store_failover")
#: Seconds the old primary still takes writes after its replica's promotion, in a store_failover.
FAILOVER_SPLIT_S = 0.5
#: Why a violation of a call that a failover touched is a documented exception (docs/chaos.md).
FAILOVER_REASON = ("store_failover: Redis replication is asynchronous, so a write the old primary "
                   "acknowledged can be lost (the guarantee holds on one server with AOF)")
#: Why an overlap of an ``on_lost_lease=finish`` call whose session a pg_kill ended is a
#: documented exception (docs/chaos.md): the lease is the session's lock, and ends with it.
PG_KILL_REASON = ("a session store's lease ends with its session, and on_lost_lease=finish lets "
                  "the body run to its end (its result fenced)")
#: Faults of the network, between one worker and the store or the broker (a :mod:`.proxy`
#: link on each of those paths, in runs that name them in ``kinds``): ``partition_store`` and
#: ``partition_broker`` cut the path both ways, one way (requests or replies held) or reset
#: it, for longer than the lease TTL; ``slow_store`` delays every chunk 0.5 to 2 s each way.
PARTITION_FAULTS = ("partition_store", "partition_broker", "slow_store")
#: Why an overlap of an ``on_lost_lease=finish`` call whose holder's store path a partition
#: cut is a documented exception (docs/chaos.md): its renewals cannot reach the store, so the
#: lease runs out while the body runs, and on_lost_lease=finish lets the body run to its end.
PARTITION_REASON = ("a worker cut off from the store cannot renew its leases, and on_lost_lease=finish "
                    "lets the body run to its end (its result fenced)")
#: The clock nemesis: ``clock_skew`` restarts a worker (warm shutdown, so its running calls
#: finish first) under libfaketime with its wall clock up to 300 s ahead or behind, as a VM
#: with a failed NTP sync; the slot keeps that clock (through restarts after kills) until a
#: later clock_skew on it brings it back to the true time. It loses no attempt: I8 holds.
CLOCK_FAULTS = ("clock_skew",)
#: The largest clock offset the clock nemesis gives a worker, in seconds (either way).
MAX_SKEW_S = 300.0
FAULT_KINDS = (*WORKER_FAULTS, *CLOCK_FAULTS, "duplicate", "pg_kill", *STORE_FAULTS, *PARTITION_FAULTS)
#: How a partition cuts its path, chosen by the fault's ``pick``.
CUTS = ("both", "up", "down", "reset")


@dataclass
class ChaosConfig:
    calls: int = 100
    workers: int = 3
    concurrency: int = 2
    faults: int = 20
    broker: str | None = None
    store: str | None = None
    baseline: bool = False
    seed: int = 1
    ttl_s: float = 2.0
    max_attempts: int = 3
    min_s: float = 0.5
    max_s: float = 4.0
    at_most_once_share: float = 0.35
    keyed_share: float = 0.5
    finish_share: float = 0.3
    load: float = 0.8
    drain_s: float = 90.0
    visibility_timeout: float | None = None
    restore_s: float | None = None
    unclaimed_grace_s: float = 20.0
    kinds: tuple[str, ...] = ()
    progress: bool = True
    workdir: str | None = None
    #: The interpreter of another release of aaa_celery (a venv where it is installed): every
    #: other worker (slots 1, 3, ...) runs it, for a mixed-version fleet during a rolling
    #: deploy. The store is migrated first (docs/upgrading.md).
    old_python: str | None = None
    #: A SQLAlchemy URL: keyed calls apply their effect as a row of its ``chaos_effects``
    #: table, through ``aaa_celery.effects.once`` (a plain insert in the baseline); I6 then
    #: counts those rows, the effects themselves.
    effects_db: str | None = None
    #: Replicas that must acknowledge each write of a call (the Redis store's ``replicas``
    #: option, ``WAIT``); with 1 or more a ``store_failover`` loses no write, and the calls it
    #: touches are held to every invariant instead of being excused.
    store_replicas: int = 0
    #: The share of calls with a concurrency limit (``Concurrency(key="slot", limit=slot_limit,
    #: on_busy="wait")``, over ``slot_keys`` keys); the checker's I9 holds them to it.
    limited_share: float = 0.0
    slot_limit: int = 2
    slot_keys: int = 2

    @property
    def heartbeat_s(self) -> float:
        return self.ttl_s / 3


@dataclass
class Fault:
    at: float
    kind: str
    worker: int
    hold_s: float
    pick: float
    done_at: float | None = None
    target: str = ""
    skipped: str = ""


@dataclass
class Plan:
    calls: list[Call]
    faults: list[Fault]


def make_plan(config: ChaosConfig, nonce: str) -> Plan:
    """The seeded workload and fault schedule (the same for the guard and the baseline)."""
    rng = random.Random(config.seed)
    mean = (config.min_s + config.max_s) / 2
    rate = config.load * config.workers * config.concurrency / mean  # calls per second
    calls = []
    for i in range(config.calls):
        delivery = "at_most_once" if rng.random() < config.at_most_once_share else "at_least_once"
        finish = rng.random() < config.finish_share and delivery == "at_least_once"
        on_lost = "finish" if finish else "cancel"
        calls.append(Call(
            call_id=f"chaos-{config.seed}-{i:05d}-{nonce}",
            delivery=delivery,
            max_attempts=config.max_attempts,
            keyed=rng.random() < config.keyed_share,
            on_lost_lease=on_lost,
            task=TASKS[delivery, on_lost],
            duration_s=round(rng.uniform(config.min_s, config.max_s), 2),
            sent_at=round(i / rate, 3),
        ))
    if config.limited_share > 0:  # drawn apart, so a seed's plan without limits is as it was
        limited = random.Random(f"{config.seed}:limited")
        for n, call in enumerate(calls):
            if limited.random() < config.limited_share:
                task = LIMITED_TASKS[call.delivery, call.on_lost_lease]
                # the slot label the checker groups by: a key is the tool's (a rule's key is per tool)
                calls[n] = replace(call, task=task, slot=f"{task}/k{limited.randrange(config.slot_keys)}",
                                   slot_limit=config.slot_limit)
    span = calls[-1].sent_at if calls else 0.0
    kinds = list(config.kinds) or [k for k in FAULT_KINDS
                                   if k != "pg_kill" and k not in STORE_FAULTS and k not in PARTITION_FAULTS]
    if not config.kinds and (config.store or "").startswith("postgresql"):
        kinds.append("pg_kill")
    times = sorted(rng.uniform(1.5, span + 3.0) for _ in range(config.faults))
    faults = []
    for t in times:
        kind = rng.choice(kinds)
        hold = rng.uniform(1.0, 3.0) if kind == "freeze_kill" else config.ttl_s + rng.uniform(1.0, 3.0)
        faults.append(Fault(round(t, 3), kind, rng.randrange(config.workers), round(hold, 2), rng.random()))
    return Plan(calls, faults)


def _args(call: Call) -> tuple[Any, ...]:
    """The arguments a call of the workload is sent with (a limited call's slot: its key's value)."""
    if call.slot:
        return call.duration_s, call.keyed, call.slot.rsplit("/", 1)[1]
    return call.duration_s, call.keyed


def segments(points: list[float], gap_s: float = 0.6) -> list[tuple[float, float]]:
    """The stretches in which a body really ran: ticks closer than ``gap_s`` apart
    (a frozen body writes none)."""
    out: list[tuple[float, float]] = []
    for t in sorted(points):
        if out and t - out[-1][1] <= gap_s:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return [(round(a, 3), round(b, 3)) for a, b in out]


class LocalRedis:
    """A throwaway ``redis-server`` on a free loopback port (stopped by its PID)."""

    def __init__(self, workdir: Path, aof: bool = False, replica_of: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: pass --broker redis://... or install it")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = open(workdir / "redis.log", "ab")  # noqa: SIM115 - closed in stop()
        persist = ["--appendonly", "yes", "--appendfsync", "always"] if aof else ["--appendonly", "no"]
        if replica_of is not None:
            persist += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persist,
                        "--dir", str(workdir)]
        self._launch()

    def _launch(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        workdir = self.workdir
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            for _ in range(200):
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited ({self.proc.returncode}); see {workdir}/redis.log")
                time.sleep(0.05)
            raise RuntimeError("redis-server did not answer in 10 s")
        finally:
            client.close()

    def restart(self) -> None:
        """kill -9 the server, then start it again on its data (AOF) and port."""
        kill9(self.proc.pid)
        self.proc.wait(10)
        self._launch()

    def command_(self, *args: Any) -> Any:
        """Run one command on this server."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return client.execute_command(*args)  # type: ignore[no-untyped-call]  # unannotated in redis-py
        finally:
            client.close()

    def wait_replicated(self, timeout_s: float = 30.0) -> bool:
        """Wait until a replica has every write this server took (``WAIT 1``): with a store
        that waits for its replica, writes are refused until then."""
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=timeout_s + 5)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    if client.execute_command("WAIT", 1, 1000):  # type: ignore[no-untyped-call]
                        return True
                time.sleep(0.1)
            return False
        finally:
            client.close()

    def pause(self, seconds: float) -> None:
        """``CLIENT PAUSE`` every write (and key expiry) for ``seconds``."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            client.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@dataclass
class Lane:
    """One worker incarnation, for the report and the timeline."""

    name: str
    slot: int
    pid: int
    started: float
    ended: float | None = None
    how: str = ""


@dataclass
class ChaosReport:
    mode: str
    config: dict[str, Any]
    command: str
    elapsed_s: float
    faults: dict[str, int]
    faults_skipped: dict[str, int]
    duplicate_sends: int
    summary: dict[str, Any]
    violations: list[str]
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    lanes: list[dict[str, Any]] = field(default_factory=list)
    undrained: int = 0
    #: Violations of calls that a fault outside the guarantee touched (see ``excuse``).
    documented_exceptions: list[str] = field(default_factory=list)

    @property
    def violation_count(self) -> int:
        return sum(self.summary["violations"].values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ChaosRun:
    """One seeded run; :meth:`run` returns the :class:`ChaosReport`. Everything it starts
    (Redis, workers) it stops by PID before returning, on errors and on Ctrl-C too."""

    def __init__(self, config: ChaosConfig, out: TextIO | None = None, command: str = "") -> None:
        self.config = config
        self.out = out or sys.stderr
        self.command = command
        self.nonce = uuid.uuid4().hex[:6]
        self.plan = make_plan(config, self.nonce)
        self.workdir = Path(config.workdir or tempfile.mkdtemp(prefix="aaa-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.slots: list[WorkerProcess] = []
        self.everyone: list[WorkerProcess] = []
        self.lanes: dict[int, Lane] = {}
        self.frozen: dict[int, Frozen] = {}
        self.generation: Counter[int] = Counter()
        self.sent: list[Call] = []
        self.done: set[str] = set()
        self.t0 = 0.0
        self.redis: LocalRedis | None = None
        #: The store's own redis-server, for the store faults.
        self.store_redis: LocalRedis | None = None
        #: Its replica, for store_failover.
        self.store_replica: LocalRedis | None = None
        #: Calls a fault outside the guarantee touched: their violations are documented exceptions.
        self.excused: dict[str, str] = {}
        #: Leases that pg_kill ended (the checker's LeaseEnd: no silence before the loss).
        self.lease_ends: list[LeaseEnd] = []
        #: Store paths a partition cut or slowed: the leases of the bodies it held end too.
        self.cuts: list[PathCut] = []
        #: The faults that lost attempts (killed, frozen past the lease, or the store's own), for I8.
        self.losses: list[Loss] = []
        #: Worker slots whose clock the clock nemesis skewed: slot -> offset in seconds.
        self.skews: dict[int, float] = {}
        self.fault_error: BaseException | None = None
        #: The partition nemesis's proxies: each worker slot's ``store`` and ``broker`` path.
        self.hub: ProxyHub | None = None
        self.paths: dict[int, dict[str, Link]] = {}

    # -- setup ------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        c = self.config
        env = {
            "AAA_CHAOS_BROKER": self.broker,
            "AAA_CHAOS_LEDGER": self.broker,
            "AAA_CHAOS_LEDGER_PREFIX": self.ledger_prefix,
            "AAA_CHAOS_QUEUE": f"aaa-chaos-{self.nonce}",
            "AAA_CHAOS_TTL": str(c.ttl_s),
            "AAA_CHAOS_MAX_ATTEMPTS": str(c.max_attempts),
            "AAA_CHAOS_GRACE": str(c.unclaimed_grace_s),
            "AAA_CHAOS_SLOT_LIMIT": str(c.slot_limit),
        }
        if c.store or self.store_redis is not None:
            env["AAA_CHAOS_STORE"] = c.store or self.store_redis.url  # type: ignore[union-attr]
        if c.baseline:
            env["AAA_CHAOS_BASELINE"] = "1"
        if c.store_replicas:
            env["AAA_CHAOS_STORE_REPLICAS"] = str(c.store_replicas)
        if c.effects_db:
            env["AAA_CHAOS_EFFECTS_DB"] = c.effects_db
        if c.visibility_timeout:
            env["AAA_CHAOS_VT"] = str(c.visibility_timeout)
        if c.restore_s:
            env["AAA_CHAOS_RESTORE_S"] = str(c.restore_s)
        return env

    def _start_worker(self, slot: int) -> WorkerProcess:
        gen = self.generation[slot]
        self.generation[slot] += 1
        old = self.config.old_python if slot % 2 else None
        w = WorkerProcess("aaa_celery.chaos.app", hostname=f"w{slot + 1}.{gen}{'-old' if old else ''}@chaos",
                          pool="prefork", concurrency=self.config.concurrency, env=self._slot_env(slot),
                          workdir=self.workdir / "workers", loglevel="WARNING", python=old)
        w.start()
        self.everyone.append(w)
        self.lanes[w.pid] = Lane(w.hostname, slot, w.pid, self._now())
        return w

    def _slot_env(self, slot: int) -> dict[str, str]:
        """A worker's env: its broker and store through its own proxied paths, if any (the
        ledger, the observer, never)."""
        env = dict(self.env)
        if slot in self.skews:
            env = skewed_clock(self.skews[slot], env)
        paths = self.paths.get(slot, {})
        if "broker" in paths:
            env["AAA_CHAOS_BROKER"] = paths["broker"].url(self.broker)
        if "store" in paths:
            env["AAA_CHAOS_STORE"] = paths["store"].url(self._store_url())
        return env

    def _store_url(self) -> str:
        return self.config.store or (self.store_redis.url if self.store_redis is not None else self.broker)

    def _open_paths(self) -> None:
        """A proxy link per worker slot to the broker, and to the store (not in a baseline run)."""
        self.hub = ProxyHub()
        for slot in range(self.config.workers):
            self.paths[slot] = {"broker": self.hub.link(self.broker)}
            if not self.config.baseline:
                self.paths[slot]["store"] = self.hub.link(self._store_url())
        self.say(f"partition proxies: {sum(len(p) for p in self.paths.values())} paths on loopback")

    def _effects_tables(self) -> None:
        import sqlalchemy as sa

        engine = sa.create_engine(self.config.effects_db)  # type: ignore[arg-type]
        try:
            effects_metadata().create_all(engine)
        finally:
            engine.dispose()
        self.say(f"keyed effects go to {EFFECTS_TABLE} through aaa_celery.effects.once")

    def _effect_rows(self) -> list[dict[str, Any]]:
        """The effects the database holds for this run's calls, as the ledger's applied
        effect entries: one per row, so I6 counts what the table really got."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.config.effects_db)  # type: ignore[arg-type]
        table = effects_metadata().tables[EFFECTS_TABLE]
        ours = {call.call_id for call in self.plan.calls}
        try:
            with engine.connect() as conn:
                rows = [r for r in conn.execute(sa.select(table)) if r.call_id in ours]
        finally:
            engine.dispose()
        return [{"kind": EFFECT, "call_id": r.call_id, "exec": r.exec, "attempt": r.attempt, "fence": r.attempt,
                 "key": r.key, "applied": True, "at": 0.0, "pid": None, "host": None} for r in rows]

    def _now(self) -> float:
        return time.time() - self.t0 if self.t0 else 0.0

    def say(self, msg: str) -> None:
        if self.config.progress:
            print(msg, file=self.out, flush=True)

    # -- the run ----------------------------------------------------------------------
    def run(self) -> ChaosReport:
        c = self.config
        started = time.monotonic()
        try:
            if c.broker:
                self.broker = c.broker
            else:
                self.redis = LocalRedis(self.workdir)
                self.broker = self.redis.url
                self.say(f"started redis-server on {self.broker} (pid {self.redis.proc.pid})")
            # store_replicas needs a replica to wait for: without one every write of a call is refused
            if not c.store and not c.baseline and (set(c.kinds) & set(STORE_FAULTS) or c.store_replicas):
                self.store_redis = LocalRedis(self.workdir / "store", aof=True)
                self.say(f"started the store's redis-server (AOF) on {self.store_redis.url}")
                if "store_failover" in c.kinds or c.store_replicas:
                    self.store_replica = LocalRedis(self.workdir / "replica", replica_of=self.store_redis.port)
            self.ledger_prefix = f"aaa:chaos:{self.nonce}"
            if set(c.kinds) & set(PARTITION_FAULTS):
                self._open_paths()
            self.env = self._env()
            self.app = make_app(self.env)
            self.ledger = EffectLedger(self.broker, self.ledger_prefix)
            self.store = None
            if not c.baseline:
                from ..worker.stores import app_store

                self.store = app_store(self.app)
                if c.old_python:  # the rolling deploy's first step: the store at this release's schema
                    self.store.migrate()
            mode = "baseline (plain Celery acks_late)" if c.baseline else "guard"
            self.say(f"chaos {mode}: {c.calls} calls, {c.workers} workers x {c.concurrency}, "
                     f"{c.faults} faults, seed {c.seed}, ttl {c.ttl_s} s, workdir {self.workdir}")
            if c.effects_db:
                self._effects_tables()
            self.slots = [self._start_worker(i) for i in range(c.workers)]
            for w in self.slots:
                w.wait_ready(90)
            self.say(f"{len(self.slots)} workers ready")
            self.t0 = time.time()
            for lane in self.lanes.values():
                lane.started = 0.0
            nemesis = threading.Thread(target=self._nemesis, name="chaos-nemesis", daemon=True)
            nemesis.start()
            undrained = self._drive()
            self.stop_event.set()
            nemesis.join(30)
            self._stop_fleet()
            return self._report(time.monotonic() - started, undrained)
        finally:
            self.stop_event.set()
            self._stop_fleet()
            if self.redis is not None:
                self.redis.stop()
            for server in (self.store_replica, self.store_redis):
                if server is not None:
                    server.stop()
            if self.hub is not None:
                self.hub.stop()

    def _drive(self) -> int:
        """Send on schedule, restart dead workers, show progress, then drain; returns how many
        calls had no result when the drain ended."""
        c = self.config
        queue = list(self.plan.calls)
        last_fault = self.plan.faults[-1].at if self.plan.faults else 0.0
        drain_from: float | None = None
        next_poll = next_say = 0.0
        # A hard bound: every send and fault (plus their holds, late on a loaded machine), then the drain.
        deadline = max(queue[-1].sent_at if queue else 0.0, last_fault) + 10 * len(self.plan.faults) + c.drain_s + 120
        while True:
            now = self._now()
            while queue and queue[0].sent_at <= now:
                call = queue.pop(0)
                self.app.tasks[call.task].apply_async(_args(call), task_id=call.call_id)
                self.sent.append(call)
            self._restart_dead()
            if now >= next_poll:
                self._poll_done()
                next_poll = now + 1.0
            faults_done = sum(1 for f in self.plan.faults if f.done_at is not None or f.skipped)
            if now >= next_say:
                up = sum(1 for w in self.slots if w.alive)
                self.say(f"[{now:6.1f}s] sent {len(self.sent)}/{c.calls}  results {len(self.done)}  "
                         f"faults {faults_done}/{len(self.plan.faults)}  workers up {up}/{c.workers}  "
                         f"frozen {len(self.frozen)}")
                next_say = now + 2.0
            if not queue and faults_done == len(self.plan.faults) and drain_from is None:
                drain_from = now
                self.say(f"[{now:6.1f}s] all sent, faults done: draining (up to {c.drain_s:.0f} s)")
            if drain_from is not None and (len(self.done) >= c.calls or now - drain_from > c.drain_s):
                self._poll_done()
                return c.calls - len(self.done)
            if self.fault_error is not None:
                raise RuntimeError(f"the nemesis failed: {self.fault_error!r}") from self.fault_error
            if now > deadline:
                raise RuntimeError("chaos run exceeded its time bound")
            time.sleep(0.05)

    def _poll_done(self) -> None:
        pending = [call.call_id for call in self.sent if call.call_id not in self.done]
        if not pending:
            return
        if self.store is not None:
            for cid in pending:
                with contextlib.suppress(Exception):
                    if self.store.result(cid) is not None:
                        self.done.add(cid)
        else:
            self.done |= {e["call_id"] for e in self.ledger.entries() if e["kind"] == END}
        with self.lock:
            for w in self.slots:
                for pid in w.children():
                    self.lanes.setdefault(pid, Lane(w.hostname, self.slots.index(w), pid, self._now(), how="child"))

    def _restart_dead(self) -> None:
        with self.lock:
            for i, w in enumerate(self.slots):
                if w.proc is not None and w.proc.poll() is not None:
                    lane = self.lanes.get(w.pid)
                    if lane is not None and lane.ended is None:
                        lane.ended = self._now()
                    self.frozen.pop(w.pid, None)
                    self.slots[i] = self._start_worker(i)
                    self.say(f"[{self._now():6.1f}s] restarted worker slot {i + 1} as {self.slots[i].hostname}")

    # -- the nemesis --------------------------------------------------------------------
    def _nemesis(self) -> None:
        try:
            for fault in self.plan.faults:
                while not self.stop_event.is_set() and self._now() < fault.at:
                    self.stop_event.wait(min(0.1, fault.at - self._now()))
                if self.stop_event.is_set():
                    fault.skipped = fault.skipped or "run stopped"
                    continue
                self._inject(fault)
        except BaseException as e:  # noqa: BLE001 - reported by the driving thread
            self.fault_error = e

    def _pick_worker(self, fault: Fault) -> WorkerProcess | None:
        with self.lock:
            n = len(self.slots)
            for k in range(n):
                w = self.slots[(fault.worker + k) % n]
                if w.alive and w.is_ready() and w.pid not in self.frozen:
                    return w
        return None

    def _inject(self, fault: Fault) -> None:
        kind = fault.kind
        if kind == "duplicate":
            live = [call for call in self.sent if call.call_id not in self.done]
            if not live:
                fault.skipped = "no live call"
                return
            call = live[int(fault.pick * len(live))]
            self.app.send_task(call.task, args=list(_args(call)), task_id=call.call_id)
            fault.target, fault.done_at = call.call_id, self._now()
            return
        if kind in ("pg_kill", *STORE_FAULTS):  # a fault of the store: every worker's attempts may be lost
            since = self.ledger.now()
            if kind == "pg_kill":
                self._pg_kill(fault)
            else:
                self._store_fault(fault)
                if self.store_replica is not None and self.store_redis is not None and fault.done_at is not None:
                    # the store refuses writes until its replica has resynced: the fault lasts as long
                    self.store_redis.wait_replicated()
            if fault.done_at is not None and not fault.skipped:
                self._lost(fault, since, None)
            return
        w = self._pick_worker(fault)
        if w is not None and kind in PARTITION_FAULTS:
            self._partition(fault, w)
            return
        if w is None:
            fault.skipped = "no worker up"
            return
        if kind == "clock_skew":
            self._clock_skew(fault, w)
            return
        fault.done_at, struck = self._now(), self.ledger.now()
        holders = frozenset([w.pid, *w.children()])
        if kind == "kill_main":
            fault.target = f"{w.hostname} main {w.pid}"
            kill9(w.pid)
            self._lost(fault, struck, holders)
        elif kind == "kill_child":
            children = pool_children(w.pid)
            if not children:
                fault.skipped, fault.done_at = "no pool child", None
                return
            victim = children[int(fault.pick * len(children))]
            fault.target = f"{w.hostname} child {victim}"
            with self.lock:
                self.lanes.setdefault(victim, Lane(w.hostname, self.slots.index(w), victim, self._now()))
                self.lanes[victim].ended, self.lanes[victim].how = self._now(), "kill -9"
            kill9(victim)
            self._lost(fault, struck, frozenset([victim]))
        elif kind in ("freeze_kill", "stop_cont"):
            frozen = freeze(w)
            with self.lock:
                self.frozen[w.pid] = frozen
            fault.target = f"{w.hostname} {w.pid} stopped {fault.hold_s:.1f} s"
            self.stop_event.wait(fault.hold_s)
            if kind == "freeze_kill":
                kill9(w.pid)  # its children die too (prefork's parent-death signal), stopped or not
                fault.target += ", then kill -9"
            else:
                frozen.thaw()
                with self.lock:
                    self.frozen.pop(w.pid, None)
            # frozen past the lease TTL; on SQLite a process frozen inside a write transaction
            # keeps the database's one write lock, so no worker renews until it thaws or dies
            self._lost(fault, struck, None if self._one_write_lock() else holders | frozenset(w.children()))
        lane = self.lanes.get(w.pid)
        if lane is not None and kind in ("kill_main", "freeze_kill"):
            lane.how = kind

    def _one_write_lock(self) -> bool:
        """Whether every worker writes the store under one lock that any process may hold (SQLite)."""
        return (self.config.store or "").startswith("sqlite")

    def _lost(self, fault: Fault, since: float, pids: frozenset[int] | None) -> None:
        """Record that ``fault`` lost the attempts of ``pids`` (None: every worker's) from
        ``since`` until now (both on the ledger's clock, the Redis server's)."""
        until = self.ledger.now()
        with self.lock:
            self.losses.append(Loss(since, until, f"{fault.kind} at {fault.done_at or 0.0:.1f} s: "
                                                        f"{fault.target}", pids))

    def _clock_skew(self, fault: Fault, w: WorkerProcess) -> None:
        """Restart ``w``'s slot with its wall clock skewed by up to ``MAX_SKEW_S`` either way
        (libfaketime), or, if the slot's clock is skewed already, with the true time again.
        The stop is a warm shutdown: the worker's running calls finish first, so no attempt
        is lost (unless the shutdown outlasts its bound and the worker is killed)."""
        if not os.path.exists(FAKETIME_LIBRARY):
            fault.skipped = "libfaketime is not installed (apt-get install faketime)"
            return
        with self.lock:
            slot = self.slots.index(w)
            if slot in self.skews:
                offset = 0.0
                self.skews.pop(slot)
            else:  # 60 to 300 s, ahead or behind
                offset = (1 if fault.pick < 0.5 else -1) * round(60 + 2 * (MAX_SKEW_S - 60) * abs(fault.pick - 0.5))
                self.skews[slot] = offset
            lane = self.lanes.get(w.pid)
            if lane is not None:
                lane.how = "clock_skew restart"
        fault.done_at, since = self._now(), self.ledger.now()
        fault.target = (f"{w.hostname} restarted with its clock {offset:+.0f} s" if offset
                        else f"{w.hostname} restarted with the true time")
        holders = frozenset([w.pid, *w.children()])
        # _restart_dead starts the slot's next worker, with the new clock, once this one exits
        if w.stop(30) == -signal.SIGKILL:
            fault.target += " (warm shutdown outlasted 30 s: killed)"
            self._lost(fault, since, holders)

    def _partition(self, fault: Fault, w: WorkerProcess) -> None:
        """Cut (or slow) one worker's path to the store or the broker for ``hold_s``, then heal it."""
        name = "broker" if fault.kind == "partition_broker" else "store"
        with self.lock:
            slot = self.slots.index(w)
        link = self.paths.get(slot, {}).get(name)
        if link is None:
            fault.skipped = f"no {name} path (a baseline run has no store)"
            return
        if fault.kind == "slow_store":
            delay = round(0.5 + 1.5 * fault.pick, 2)
            link.slow(delay)
            how = f"slowed {delay:.2f} s each way"
        else:
            cut = CUTS[min(int(fault.pick * len(CUTS)), len(CUTS) - 1)]
            if cut == "reset":
                link.reset()
            else:
                link.cut(cut)
            how = {"both": "cut both ways", "up": "cut one way (requests held)",
                   "down": "cut one way (replies held)", "reset": "reset and refused"}[cut]
        fault.done_at, cut_at = self._now(), self.ledger.now()
        fault.target = f"{w.hostname} {name} path {how}, {fault.hold_s:.1f} s"
        pids = frozenset([w.pid, *w.children()])  # and after: children killed and born during the cut
        self.stop_event.wait(fault.hold_s)
        link.heal()
        if name == "store":
            with self.lock:
                healed = self.ledger.now()
                self.losses.append(Loss(cut_at, healed, f"{fault.kind}: {fault.target}",
                                        pids | frozenset(w.children())))
                self.cuts.append(PathCut(pids | frozenset(w.children()), cut_at, healed,
                                         f"{fault.kind} at {fault.done_at:.1f} s: {fault.target}; {PARTITION_REASON}"))

    def _store_fault(self, fault: Fault) -> None:
        """Pause the store's writes past the lease TTL, or restart its server (AOF)."""
        server = self.store_redis
        if server is None:
            fault.skipped = "no redis store of the run's own"
            return
        fault.done_at = self._now()
        if fault.kind == "store_pause":
            ending = self._finish_soon()
            fault.done_at = self._now()
            fault.target = f"store CLIENT PAUSE WRITE {fault.hold_s:.1f} s" + (f", as {ending} finishes" if ending else "")
            server.pause(fault.hold_s)
            self.stop_event.wait(fault.hold_s)
        elif fault.kind == "store_failover":
            replica = self.store_replica
            if replica is None:
                fault.skipped, fault.done_at = "no replica", None
                return
            fault.target = f"store replica promoted, old primary READONLY {fault.hold_s:.1f} s, then back"
            with self.lock:
                touched = {call.call_id for call in self.sent if call.call_id not in self.done}
                sent_before = len(self.sent)
            replica.command_("REPLICAOF", "NO", "ONE")
            # The old primary takes writes a moment longer (Sentinel reconfigures it, and the
            # clients, after the promotion): what it acknowledges then, the new one never has.
            self.stop_event.wait(FAILOVER_SPLIT_S)
            server.command_("REPLICAOF", "127.0.0.1", str(replica.port))
            self.stop_event.wait(fault.hold_s)
            server.command_("REPLICAOF", "NO", "ONE")
            replica.command_("REPLICAOF", "127.0.0.1", str(server.port))
            with self.lock:
                touched |= {call.call_id for call in self.sent[sent_before:]}
                for call_id in touched if not self.config.store_replicas else ():
                    self.excused.setdefault(call_id, f"{FAILOVER_REASON} (fault at {fault.done_at:.1f} s)")
        else:
            fault.target = f"store redis-server {server.proc.pid} kill -9, restarted on its AOF"
            server.restart()

    def _finish_soon(self, within_s: float = 3.0) -> str:
        """Wait until a running body is about to return (its planned length after its
        ledger ``start``), so a pause meets that call's ``finish``; returns its call id,
        or "" when no body ends within ``within_s``."""
        durations = {call.call_id: call.duration_s for call in self.sent}
        now = self.ledger.now()
        ends = [(x.start_at + durations[x.call_id], x.call_id)
                for x in (x for xs in executions(self.ledger.entries()).values() for x in xs)
                if x.start_at is not None and not x.ended and x.call_id in durations]
        soon = [(end, cid) for end, cid in ends if now < end - 0.05 < now + within_s]
        if not soon:
            return ""
        end, call_id = min(soon)
        self.stop_event.wait(max(0.0, end - 0.05 - self.ledger.now()))
        return call_id

    def _pg_kill(self, fault: Fault) -> None:
        """Terminate one PostgreSQL backend of the store (a lease holder's, if any)."""
        store = self.config.store or ""
        if self.config.baseline or not store.startswith("postgresql"):
            fault.skipped = "no postgresql store"
            return
        import psycopg

        from ..stores.sql.schema import calls as calls_table

        url = "postgresql://" + store.split("://", 1)[1]
        with psycopg.connect(url, autocommit=True) as con:
            rows = con.execute(
                "SELECT DISTINCT a.pid, (l.pid IS NOT NULL) FROM pg_stat_activity a"
                " LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted"
                " WHERE a.application_name = 'aaa_celery' AND a.pid <> pg_backend_pid()"
                " ORDER BY 2 DESC, 1"
            ).fetchall()
            holders = [pid for pid, holds in rows if holds] or [pid for pid, _ in rows]
            if not holders:
                fault.skipped = "no store connection"
                return
            victim = holders[int(fault.pick * len(holders))]
            # the leases the victim holds: its pid prefixes their tokens (PostgresStore.begin)
            leases = con.execute(f"SELECT call_id, lease_attempt FROM {calls_table.name} WHERE lease_token LIKE %s",
                                 (f"{victim}.%",)).fetchall()
            at = self.ledger.now()
            con.execute("SELECT pg_terminate_backend(%s)", (victim,))
        fault.target, fault.done_at = f"postgres backend {victim}", self._now()
        with self.lock:
            self.lease_ends += [
                LeaseEnd(call_id, attempt, at, f"pg_kill at {fault.done_at:.1f} s: backend {victim}, holding "
                                               f"attempt {attempt}'s lease, terminated; {PG_KILL_REASON}")
                for call_id, attempt in leases if attempt is not None]
        if leases:
            fault.target += " (lease of " + ", ".join(f"{c} attempt {n}" for c, n in leases) + ")"

    # -- the end ----------------------------------------------------------------------
    def _stop_fleet(self) -> None:
        with self.lock:
            workers = list(self.everyone)
            for frozen in self.frozen.values():
                frozen.thaw()
            self.frozen.clear()
        for w in workers:
            if w.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGCONT)
                    os.kill(w.pid, signal.SIGTERM)
        for w in workers:
            with contextlib.suppress(Exception):
                w.stop(15)
            lane = self.lanes.get(w.pid) if w.proc is not None else None
            if lane is not None and lane.ended is None:
                lane.ended = self._now()

    def _where_are(self, call_ids: list[str]) -> dict[str, int]:
        """Where the broker holds the messages of calls without a result: ``unacked`` (they
        come back after ``visibility_timeout``), still queued, or gone (lost outright)."""
        import json

        import redis

        wanted = set(call_ids)
        client = redis.Redis.from_url(self.broker, decode_responses=True)
        try:
            unacked = {json.loads(raw)[0]["headers"]["id"] for raw in client.hvals("unacked")}
            queued = {json.loads(raw)["headers"]["id"] for raw in client.lrange(self.env["AAA_CHAOS_QUEUE"], 0, -1)}
        except (redis.RedisError, ValueError, KeyError, IndexError, TypeError):
            return {}
        finally:
            client.close()
        return {"in unacked": len(wanted & unacked), "queued": len(wanted & queued - unacked),
                "gone": len(wanted - unacked - queued)}

    def _report(self, elapsed: float, undrained: int) -> ChaosReport:
        c = self.config
        calls = self.plan.calls
        entries = self.ledger.entries()
        if c.effects_db:
            entries += self._effect_rows()
        store = RecordedStore.snapshot(self.store, [x.call_id for x in calls]) if self.store is not None else None
        runs = executions(entries)
        ends = self.lease_ends + [end for cut in self.cuts for end in cut.lease_ends(runs)]
        violations, exceptions = excuse(
            check_history(store, entries, calls, heartbeat_s=c.heartbeat_s, lease_ttl_s=c.ttl_s,
                          lease_ends=ends, losses=self.losses), self.excused)
        summary = summarize(store, entries, calls, violations)
        done = Counter(f.kind for f in self.plan.faults if f.done_at is not None)
        skipped = Counter(f.kind for f in self.plan.faults if f.skipped)
        dup_calls = {f.target for f in self.plan.faults if f.kind == "duplicate" and f.done_at is not None}
        summary["duplicate_sends_absorbed"] = sum(
            1 for cid in dup_calls if len([x for x in runs.get(cid, []) if x.start_at is not None]) <= 1)
        self.timeline = {
            "executions": [
                {"call_id": x.call_id, "attempt": x.attempt, "host": (x.host or "?"), "pid": x.pid,
                 "from": x.first_at - self.t0, "to": x.last_at - self.t0, "returned": x.ended,
                 "segments": segments([t - self.t0 for t in x.points])}
                for xs in runs.values() for x in xs
            ],
            "faults": [asdict(f) for f in self.plan.faults],
        }
        if summary["results"].get("no result"):
            summary["no_result_where"] = self._where_are(
                [x.call_id for x in calls if x.call_id not in self.done])
        return ChaosReport(
            mode="baseline" if c.baseline else "guard",
            config={k: v for k, v in asdict(c).items() if k not in ("progress", "workdir")},
            command=self.command,
            elapsed_s=round(elapsed, 1),
            faults=dict(sorted(done.items())),
            faults_skipped=dict(sorted(skipped.items())),
            duplicate_sends=done.get("duplicate", 0),
            summary=summary,
            violations=[str(v) for v in violations[:500]],
            documented_exceptions=[str(x) for x in exceptions[:500]],
            fault_log=[asdict(f) for f in self.plan.faults],
            lanes=[asdict(lane) for lane in self.lanes.values()],
            undrained=undrained,
        )
