"""The processes a test run leaves behind: a worker, a server or a web app still alive
when pytest ends (``pytest_sessionfinish`` in tests/conftest.py fails the run on them).

A process counts as the run's when it descends from the pytest process, or when its
environment carries ``AAA_TEST_RUN=<pytest's pid>`` (``mark_run`` exports it, so every
process the tests start inherits it): a daemon that detached itself (``pg_ctl`` starts
PostgreSQL in a session of its own) or an orphan whose parent died is reparented away
from pytest, but keeps its environment. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MARK = "AAA_TEST_RUN"

#: Helpers the Python runtime starts for the pytest process itself and keeps until it
#: exits (multiprocessing's semaphore tracker and fork server): not a test's leftovers.
RUNTIME_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def mark_run(run_pid: int | None = None) -> int:
    """Export the run's mark (this process's pid, or ``run_pid``: an xdist worker takes its
    controller's) for every process started from now on; returns it."""
    run_pid = os.getpid() if run_pid is None else run_pid
    os.environ[MARK] = str(run_pid)
    return run_pid


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    state: str
    started: int  # clock ticks after boot: with the pid, tells a reused pid apart
    name: str
    cmdline: str

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid}): {self.cmdline[:200]}"


def _read(pid: int) -> Process | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return Process(pid, int(fields[1]), fields[0], int(fields[19]), name, cmdline or f"[{name}]")


def _mark(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(MARK.encode() + b"="):
                return entry.partition(b"=")[2].decode(errors="replace")
    return None


def _processes() -> dict[int, Process]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _read(int(entry))) is not None:
            found[proc.pid] = proc
    return found


def leftovers(run_pid: int) -> list[Process]:
    """The live processes of the run ``run_pid`` (itself and its runtime helpers aside)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    ours, todo = set(), [run_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    ours |= {pid for pid in procs if _mark(pid) == str(run_pid)}
    ours.discard(run_pid)
    return sorted(
        (procs[pid] for pid in ours
         if procs[pid].state not in ("Z", "X")
         and not (procs[pid].ppid == run_pid and any(h in procs[pid].cmdline for h in RUNTIME_HELPERS))),
        key=lambda p: p.pid,
    )


def wait_for_leftovers(run_pid: int, timeout_s: float) -> list[Process]:
    """``leftovers``, once those still shutting down have had ``timeout_s`` to go."""
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(run_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill(procs: list[Process]) -> None:
    """SIGKILL each process by its pid, unless the pid now names another process."""
    for proc in procs:
        now = _read(proc.pid)
        if now is not None and now.started == proc.started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
