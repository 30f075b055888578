"""Real ``celery worker`` processes of an app: :class:`WorkerProcess` and :class:`Fleet`.

A worker runs as ``python -m aaa_celery.testing.worker -A <app> worker ...``: Celery's
own CLI, launched by :mod:`aaa_celery.testing.worker` so that the worker writes its
PID to its ready file (``AAA_READY_FILE``) when its ``worker_ready`` signal fires.
A log line containing `` ready.`` counts as ready too. Every process started here
is stopped by its PID (never by name), also after a test failure.
"""

from __future__ import annotations

import contextlib
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

from .faults import Frozen, kill9, parent_of, pid_alive, pool_children
from .ready import READY_FILE_ENV

#: The module a worker runs as (``python -m``): the ``celery`` command plus the ready file.
LAUNCHER = "aaa_celery.testing.worker"


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


class WorkerProcess:
    """One ``celery -A <app> worker`` subprocess, started and stopped by its PID.

    It runs through :mod:`aaa_celery.testing.worker` (see :meth:`command`), which
    writes the ready file that :meth:`wait_ready` watches.

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
        python: the interpreter to run (default: this one), e.g. a venv of another release
            of aaa_celery for a mixed-version fleet. The worker then imports everything,
            ``app`` too, from that interpreter's own packages: neither this process's
            ``PYTHONPATH`` nor ``cwd`` is put on its path.
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
        python: str | Path | None = None,
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
        self.python = str(python) if python else None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in hostname)
        self.log_path = self.workdir / f"{safe}.log"
        self.ready_path = self.workdir / f"{safe}.ready"
        self.proc: subprocess.Popen[bytes] | None = None
        self._frozen: list[Frozen] = []
        self._seen_children: set[int] = set()

    def command(self) -> list[str]:
        """The command line this worker runs: ``celery``'s arguments, through the launcher."""
        cmd = [self.python or sys.executable, "-m", LAUNCHER, "-A", self.app, "worker", "-P", self.pool,
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
        if self.python is None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        else:  # another installation: its own packages only (python -m puts cwd first: a neutral one)
            env.pop("PYTHONPATH", None)
            root = str(self.workdir)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=root, env=env,
            )
        return self

    def keep_frozen(self, frozen: Frozen) -> None:
        """Remember a :func:`~aaa_celery.testing.freeze` of this worker, to thaw it on :meth:`stop`."""
        self._frozen.append(frozen)

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
        if self.pool == "prefork":  # what is left of timeout_s, 10 s at least: a loaded machine forks slowly
            wait_for(lambda: len(self.children()) >= self.concurrency,
                     max(10.0, deadline - time.monotonic()), f"{self.hostname} pool")
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
            if pid_alive(child) and parent_of(child) in (1, self.proc.pid):
                kill9(child)
        return self.proc.returncode

    def __enter__(self) -> WorkerProcess:
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<WorkerProcess {self.hostname} pid={pid} {self.pool} -c{self.concurrency}>"



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
