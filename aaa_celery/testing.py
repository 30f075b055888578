"""Helpers for testing guarded tasks on real ``celery worker`` processes.

Start a fleet of workers, break them the way production breaks them, and check
what the tools really did::

    from aaa_celery.testing import Fleet, Ledger, freeze, kill9, kill_child

    with Fleet("proj.celery", size=2, env={"BROKER_URL": url}) as fleet:
        result = refund.delay("A-100")
        ...                                   # wait until the ledger shows the body started
        kill9(fleet[0].pid)                   # the whole worker dies mid-call
        result.get(timeout=30)                # at_least_once: attempt 2 on fleet[1]

Every process these helpers start is stopped by its PID (never by name) when the
fleet stops, also after a test failure.

* :class:`WorkerProcess` is one ``celery -A <module> worker`` subprocess, and
  :class:`Fleet` a group of them with distinct hostnames.
* Faults: :func:`kill9` (a crash), :func:`kill_child` (one prefork pool child),
  :func:`freeze` (``SIGSTOP`` … ``SIGCONT``: a GC pause, a VM freeze), and
  :func:`duplicate_delivery` (the same task id sent again).
* :class:`Ledger` is an external effect log in Redis that a tool appends to, so a
  test sees every body run, including runs the guard cut short.
* :func:`check_history` checks the guard's invariants I1..I7 over a store's audit
  trail and an :class:`EffectLedger` (the chaos harness's ledger, with a uniqueness
  constraint on idempotency keys); it returns the list of :class:`Violation`.

A worker is ready when its ``worker_ready`` signal fires: ``aaa_celery`` writes the
worker's PID to the file named by ``AAA_READY_FILE`` (set here for each worker).
Log lines containing ``ready.`` count too, for apps that don't import the guard.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .chaos.checker import Call, Violation, check_history
from .chaos.ledger import Ledger as EffectLedger
from .worker.install import READY_FILE_ENV

__all__ = [
    "Call",
    "EffectLedger",
    "Violation",
    "check_history",
    "Fleet",
    "Frozen",
    "Ledger",
    "WorkerProcess",
    "duplicate_delivery",
    "freeze",
    "kill9",
    "kill_child",
    "pid_alive",
    "pool_children",
    "wait_for",
]


# -- processes ---------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.isdir("/proc")


def pool_children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a prefork worker's pool), oldest first.

    Scans ``/proc/*/stat`` for the parent pid: some kernels have no
    ``/proc/<pid>/task/*/children``.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        # after the command: state, ppid, pgrp, session, tty, tpgid, flags, ... starttime (#22)
        if len(fields) > 19 and int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append((int(fields[19]), int(entry)))
    return [p for _, p in sorted(found)]


def kill9(pid: int) -> None:
    """``kill -9 pid``: the process dies at once, without cleanup (a crash, an OOM kill).

    A prefork worker's pool children die with it (Celery sets their parent-death
    signal to SIGKILL).
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def kill_child(worker: WorkerProcess | int, pid: int | None = None, *, timeout_s: float = 10.0) -> int:
    """``kill -9`` one pool child of a prefork worker; returns its PID.

    ``pid`` picks the child (for example the one the ledger shows running a call);
    it must be a child of ``worker``. Without it, the oldest child is killed. The
    worker's main process lives on and starts a new child.
    """
    main = worker.pid if isinstance(worker, WorkerProcess) else worker
    deadline = time.monotonic() + timeout_s
    while True:
        children = pool_children(main)
        if pid is not None and pid in children:
            victim = pid
            break
        if pid is None and children:
            victim = children[0]
            break
        if time.monotonic() > deadline:
            what = f"child {pid}" if pid is not None else "any child"
            raise RuntimeError(f"worker {main} has no {what} (children: {children})")
        time.sleep(0.05)
    kill9(victim)
    return victim


class Frozen:
    """Processes stopped with ``SIGSTOP``; :meth:`thaw` (or leaving the ``with``) resumes them."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.thawed = False
        for p in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)

    def thaw(self) -> None:
        """Send ``SIGCONT`` to every frozen process (safe to call twice)."""
        if self.thawed:
            return
        self.thawed = True
        for p in reversed(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)

    def __enter__(self) -> Frozen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.thaw()


def freeze(target: WorkerProcess | int, seconds: float | None = None, *, children: bool = True) -> Frozen:
    """Stop a process as a GC pause or a VM freeze would: it keeps its sockets, runs nothing.

    ``target`` is a :class:`WorkerProcess` or a PID; with ``children`` (the default)
    its pool children freeze too, so the whole worker stalls, heartbeat included.
    With ``seconds``, blocks that long and thaws; otherwise returns a
    :class:`Frozen` to thaw later (usable as a context manager).
    """
    main = target.pid if isinstance(target, WorkerProcess) else target
    pids = [main] + (pool_children(main) if children else [])
    frozen = Frozen(pids)
    if isinstance(target, WorkerProcess):
        target._frozen.append(frozen)
    if seconds is not None:
        try:
            time.sleep(seconds)
        finally:
            frozen.thaw()
    return frozen


def duplicate_delivery(
    app: Any,
    task_id: str,
    name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Publish task ``name`` again under an existing ``task_id`` (an ``AsyncResult``).

    This is what a broker redelivery or a client retry looks like to workers: a
    second message for the same call. It goes straight to the broker
    (``app.send_task``), without registering the call again.
    """
    return app.send_task(name, args=list(args), kwargs=dict(kwargs or {}), task_id=task_id, **options)


def wait_for(check: Any, timeout_s: float, what: str = "condition", poll_s: float = 0.05) -> Any:
    """Poll ``check()`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true after {timeout_s} s")
        time.sleep(poll_s)


# -- workers -----------------------------------------------------------------------------


class WorkerProcess:
    """One ``celery -A <app> worker`` subprocess, started and stopped by its PID.

    Args:
        app: the ``-A`` argument (``proj.celery`` or ``proj.celery:app``).
        hostname: the node name (``-n``), e.g. ``w1@fleet``; unique per worker.
        pool: ``prefork`` (the default), ``threads`` or ``solo``.
        concurrency: ``-c``: pool children or threads.
        queues: ``-Q``: the queues to consume (default: the app's).
        env: extra environment variables for the worker (its broker and store URLs).
        workdir: where its log and ready file go (a temp directory by default).
        fast_start: start without mingle and gossip (each costs a second or more
            at start-up and nothing the guard needs).
        extra_args: more ``celery worker`` arguments.
        cwd: the working directory (the import root of ``app``).
    """

    def __init__(
        self,
        app: str,
        *,
        hostname: str,
        pool: str = "prefork",
        concurrency: int = 1,
        queues: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        loglevel: str = "INFO",
        workdir: str | Path | None = None,
        fast_start: bool = True,
        extra_args: Sequence[str] = (),
        cwd: str | Path | None = None,
    ) -> None:
        self.app, self.hostname, self.pool = app, hostname, pool
        self.concurrency = concurrency
        self.queues = list(queues or [])
        self.env = dict(env or {})
        self.loglevel = loglevel
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="aaa-worker-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fast_start = fast_start
        self.extra_args = list(extra_args)
        self.cwd = Path(cwd) if cwd else Path.cwd()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in hostname)
        self.log_path = self.workdir / f"{safe}.log"
        self.ready_path = self.workdir / f"{safe}.ready"
        self.proc: subprocess.Popen[bytes] | None = None
        self._frozen: list[Frozen] = []
        self._seen_children: set[int] = set()

    def command(self) -> list[str]:
        """The command line this worker runs."""
        cmd = [sys.executable, "-m", "celery", "-A", self.app, "worker", "-P", self.pool,
               "-c", str(self.concurrency), "-n", self.hostname, "--loglevel", self.loglevel]
        if self.queues:
            cmd += ["-Q", ",".join(self.queues)]
        if self.fast_start:
            cmd += ["--without-mingle", "--without-gossip"]
        return cmd + self.extra_args

    def start(self) -> WorkerProcess:
        """Start the worker (without waiting; see :meth:`wait_ready`)."""
        if self.proc is not None:
            raise RuntimeError(f"worker {self.hostname} was already started")
        with contextlib.suppress(FileNotFoundError):
            self.ready_path.unlink()
        env = {**os.environ, **self.env, READY_FILE_ENV: str(self.ready_path)}
        root = str(self.cwd)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=root, env=env,
            )
        return self

    @property
    def pid(self) -> int:
        """The worker's main process id."""
        if self.proc is None:
            raise RuntimeError(f"worker {self.hostname} is not started")
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """Whether the main process still runs."""
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """The pool's child processes now (prefork)."""
        if not self.alive:
            return []
        found = pool_children(self.pid)
        self._seen_children.update(found)
        return found

    @property
    def log(self) -> str:
        """Everything the worker logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def is_ready(self) -> bool:
        """Whether the worker finished starting and consumes its queues."""
        return self.ready_path.exists() or " ready." in self.log

    def wait_ready(self, timeout_s: float = 60.0) -> WorkerProcess:
        """Block until the worker is ready; raise with its log if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while not self.is_ready():
            if not self.alive:
                raise RuntimeError(f"worker {self.hostname} exited while starting:\n{self.log[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.hostname} not ready after {timeout_s} s:\n{self.log[-4000:]}")
            time.sleep(0.05)
        if self.pool == "prefork":
            wait_for(lambda: len(self.children()) >= self.concurrency, 10, f"{self.hostname} pool")
        return self

    def kill(self) -> None:
        """``kill -9`` the main process (its prefork children die with it)."""
        self.children()
        kill9(self.pid)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """Stop the worker: thaw it, warm shutdown (``SIGTERM``), then ``SIGKILL``
        after ``timeout_s``; any pool child left over is killed too. Returns the
        exit code. Safe to call twice."""
        if self.proc is None:
            return None
        for frozen in self._frozen:
            frozen.thaw()
        self.children()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                kill9(self.proc.pid)
                self.proc.wait(10)
        for child in self._seen_children:
            if pid_alive(child) and _parent_of(child) in (1, self.proc.pid):
                kill9(child)
        return self.proc.returncode

    def __enter__(self) -> WorkerProcess:
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<WorkerProcess {self.hostname} pid={pid} {self.pool} -c{self.concurrency}>"


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class Fleet:
    """Several :class:`WorkerProcess` of one app, named ``<prefix><n>@<host>``.

    ``Fleet(app, size=2, **options)`` takes the options of :class:`WorkerProcess`
    (``pool``, ``concurrency``, ``env`` ...) for every worker. As a context manager it
    starts all workers, waits until each is ready, and stops them all at the end.
    """

    def __init__(self, app: str, *, size: int = 2, prefix: str = "w", host: str | None = None,
                 workdir: str | Path | None = None, **options: Any) -> None:
        self.app = app
        self.options = options
        self.prefix = prefix
        self.host = host or socket.gethostname()
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="aaa-fleet-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workers: list[WorkerProcess] = []
        for _ in range(size):
            self.add(start=False)

    def add(self, *, start: bool = True, **options: Any) -> WorkerProcess:
        """Add one more worker (started and ready unless ``start=False``)."""
        n = len(self.workers) + 1
        worker = WorkerProcess(self.app, hostname=f"{self.prefix}{n}@{self.host}",
                               workdir=self.workdir, **{**self.options, **options})
        self.workers.append(worker)
        if start:
            worker.start().wait_ready()
        return worker

    def start(self, timeout_s: float = 60.0) -> Fleet:
        """Start every worker not started yet, and wait until all are ready."""
        try:
            for w in self.workers:
                if w.proc is None:
                    w.start()
            for w in self.workers:
                w.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every worker (see :meth:`WorkerProcess.stop`)."""
        for w in self.workers:
            with contextlib.suppress(Exception):
                if w.alive:
                    os.kill(w.pid, signal.SIGCONT)
        errors = []
        for w in self.workers:
            try:
                w.stop()
            except Exception as e:  # noqa: BLE001 - stop the others anyway
                errors.append(e)
        if errors:
            raise errors[0]

    def worker_of(self, pid: int) -> WorkerProcess:
        """The worker whose main process or pool child has this PID."""
        for w in self.workers:
            if w.proc is not None and (w.pid == pid or pid in w._seen_children or pid in w.children()):
                return w
        raise LookupError(f"pid {pid} belongs to no worker of this fleet")

    def others(self, worker: WorkerProcess) -> list[WorkerProcess]:
        return [w for w in self.workers if w is not worker]

    def logs(self) -> str:
        """Every worker's log, for a failure message."""
        return "\n".join(f"===== {w.hostname} =====\n{w.log[-6000:]}" for w in self.workers)

    def __getitem__(self, i: int) -> WorkerProcess:
        return self.workers[i]

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the effect ledger ------------------------------------------------------------------


class Ledger:
    """An external effect log: a Redis list of JSON entries that tools append to.

    A tool calls ``ledger.record("start", ctx=ctx)`` where its effect begins (and
    again at later points); the test reads :meth:`entries`. Because the list lives
    outside the guard's store, it shows what really ran, including body runs that
    the guard fenced or a crash cut short.
    """

    def __init__(self, url: str, key: str = "aaa:test:ledger") -> None:
        import redis

        self.url, self.key = url, key
        self._redis = redis.Redis.from_url(url, decode_responses=True)

    def record(self, event: str, *, task_id: str | None = None, ctx: Any = None, **fields: Any) -> dict[str, Any]:
        """Append ``{"event", "task_id", "attempt", "pid", "at", ...}`` and return it."""
        meta = getattr(ctx, "meta", None) or {}
        entry = {
            "event": event,
            "task_id": task_id or meta.get("task_id"),
            "attempt": getattr(ctx, "attempt", None),
            "hostname": meta.get("hostname"),
            "pid": os.getpid(),
            "at": time.time(),
            **fields,
        }
        self._redis.rpush(self.key, json.dumps(entry, separators=(",", ":")))
        return entry

    def entries(self, task_id: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        """Entries in order, optionally only one call's and one kind."""
        out = [json.loads(raw) for raw in self._redis.lrange(self.key, 0, -1)]
        return [e for e in out if (task_id is None or e["task_id"] == task_id)
                and (event is None or e["event"] == event)]

    def clear(self) -> None:
        self._redis.delete(self.key)

    def close(self) -> None:
        self._redis.close()
