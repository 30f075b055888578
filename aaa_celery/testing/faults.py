"""Faults for real worker processes: crash, kill one pool child, freeze, deliver twice.

Each takes a PID or anything with a ``pid`` (a :class:`~aaa_celery.testing.WorkerProcess`):

* :func:`kill9`: a crash (``SIGKILL``), :func:`kill_child`: one prefork pool child;
* :func:`freeze`: ``SIGSTOP`` … ``SIGCONT`` (a GC pause, a VM freeze), as a :class:`Frozen`;
* :func:`duplicate_delivery`: the same task id sent again;
* :func:`pid_alive` and :func:`pool_children` read ``/proc``;
* :func:`skewed_clock`: the environment that starts a process with its wall clock off by
  some seconds (libfaketime), as on a machine whose NTP sync failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


#: Where Debian's ``libfaketime`` package puts its preload library (the multi-threaded one).
FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


def skewed_clock(offset_s: float, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: none) plus what makes a process started with it read a wall clock
    ``offset_s`` seconds off (``time.time()``, ``datetime.now()``), through libfaketime. Its
    monotonic clock stays the machine's, as on a machine whose NTP sync failed (a wall
    clock off by minutes ticks at the right rate); the launcher of
    :class:`~aaa_celery.testing.WorkerProcess` then sleeps on timed waits (libfaketime 0.9.10
    refuses CPython's monotonic ``clock_nanosleep``). Raises ``FileNotFoundError`` when
    libfaketime is not installed (Debian: ``apt-get install faketime``)."""
    if not os.path.exists(FAKETIME_LIBRARY):
        raise FileNotFoundError(f"{FAKETIME_LIBRARY}: libfaketime is not installed (apt-get install faketime)")
    preload = " ".join(p for p in ((env or {}).get("LD_PRELOAD", ""), FAKETIME_LIBRARY) if p)
    return {**(env or {}), "LD_PRELOAD": preload, "FAKETIME": f"{offset_s:+.3f}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


class HasPid(Protocol):
    """A worker process: its main PID (a :class:`~aaa_celery.testing.WorkerProcess`)."""

    @property
    def pid(self) -> int: ...


def _main_pid(target: HasPid | int) -> int:
    return target if isinstance(target, int) else target.pid


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


def parent_of(pid: int) -> int | None:
    """The parent PID of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def kill9(pid: int) -> None:
    """``kill -9 pid``: the process dies at once, without cleanup (a crash, an OOM kill).

    A prefork worker's pool children die with it (Celery sets their parent-death
    signal to SIGKILL).
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop_process(proc: Any, grace_s: float = 10.0) -> None:
    """Stop a ``subprocess.Popen`` this test started: SIGTERM, then ``kill -9`` if it has not
    exited within ``grace_s``; returns once it has been reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        kill9(proc.pid)
        proc.wait(grace_s)


def kill_child(worker: HasPid | int, pid: int | None = None, *, timeout_s: float = 10.0) -> int:
    """``kill -9`` one pool child of a prefork worker; returns its PID.

    ``pid`` picks the child (for example the one the ledger shows running a call);
    it must be a child of ``worker``. Without it, the oldest child is killed. The
    worker's main process lives on and starts a new child.
    """
    main = _main_pid(worker)
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


def freeze(target: HasPid | int, seconds: float | None = None, *, children: bool = True) -> Frozen:
    """Stop a process as a GC pause or a VM freeze would: it keeps its sockets, runs nothing.

    ``target`` is a :class:`~aaa_celery.testing.WorkerProcess` or a PID; with
    ``children`` (the default) its pool children freeze too, so the whole worker
    stalls, heartbeat included. With ``seconds``, blocks that long and thaws;
    otherwise returns a :class:`Frozen` to thaw later (usable as a context manager).
    A worker process keeps what it was frozen with and thaws it when it stops.
    """
    main = _main_pid(target)
    pids = [main] + (pool_children(main) if children else [])
    frozen = Frozen(pids)
    keep = getattr(target, "keep_frozen", None)
    if keep is not None:
        keep(frozen)
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
