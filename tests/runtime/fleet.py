"""A small fleet of real ``celery worker`` subprocesses for the engine tests.

Each worker is started with its own queues and stopped by the PID this module
started (warm shutdown, then SIGKILL), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The signal on which a fleet app's processes write their threads' stacks (tests/fleet_apps.py).
STACKS_SIGNAL = signal.SIGUSR2


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask), so sending
    it does not kill the process."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def fleet_logs(workers: Sequence[Worker], tail: int = 4000) -> str:
    """The end of each worker's log, for a failing test's message; first each process of the
    worker that catches :data:`STACKS_SIGNAL` (a fleet app's) writes its threads' stacks there."""
    sent = False
    for w in workers:
        for pid in [w.proc.pid, *w.children()]:
            if w.proc.poll() is None and catches(pid, STACKS_SIGNAL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, STACKS_SIGNAL)
                    sent = True
                    time.sleep(0.3)  # one process at a time: their stacks do not interleave in the log
    if sent:
        tail *= 4
    return "\n".join(f"===== {w.name} =====\n{w.log[-tail:]}" for w in workers)


class Worker:
    """``celery -A <app> worker -Q <queues> -c <n>``, run in ``cwd`` (also put on ``PYTHONPATH``)."""

    def __init__(self, name: str, queues: Sequence[str], concurrency: int, env: dict[str, str], logdir: Path,
                 *, app: str = "tests.runtime.fleet_engine_app", cwd: Path = ROOT) -> None:
        self.name = name
        self.log_path = logdir / f"{name}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-P", "prefork", "-c", str(concurrency), "-Q", ",".join(queues), "-n", f"{name}@localhost",
            "--loglevel", "INFO", "--without-mingle", "--without-gossip",
        ]
        full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(cwd), str(ROOT), os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=cwd, env=full_env)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while " ready." not in self.log:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited while starting:\n{self.log[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.name} not ready after {timeout_s} s:\n{self.log[-4000:]}")
            time.sleep(0.05)

    def children(self) -> list[int]:
        """The live pool children of this worker (by parent PID)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
                    if int(fields[1]) == self.proc.pid and fields[0] not in ("Z", "X"):
                        found.append(int(entry))
        return found

    def stop(self, timeout_s: float = 15.0) -> None:
        children = self.children()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in children:  # a child left behind by a hard stop (now an orphan)
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1]) in (1, self.proc.pid):
                    os.kill(pid, signal.SIGKILL)
