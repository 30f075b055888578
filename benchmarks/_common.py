"""What every benchmark shares: servers, process CPU, percentiles, tables and JSON.

Servers come from ``tests/servers.py`` (real ``redis-server`` / PostgreSQL on free
loopback ports in temp dirs, stopped by PID). Processes this module starts are
stopped by their PID only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.servers import PostgresServer, RedisServer, libpq_url  # noqa: E402

__all__ = [
    "DurablePostgres", "PostgresServer", "RedisServer", "ROOT", "Worker", "commandstats", "cpu_seconds",
    "libpq_url", "machine", "pct", "spread", "table", "write_json",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")


class DurablePostgres(PostgresServer):
    """The tests' throwaway PostgreSQL with the server's default durability (``fsync``,
    ``synchronous_commit`` and ``full_page_writes`` on): every commit waits for its WAL
    flush, as in production."""

    settings = {"max_connections": "300"}


# -- numbers ----------------------------------------------------------------------------
def pct(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def spread(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of a few repeated figures."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def fmt(v: Any, digits: int = 3) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A GitHub-markdown table (also readable in a terminal)."""
    cells = [[fmt(c) for c in r] for r in rows]
    lines = [f"**{title}**", ""] if title else []
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


# -- environment ----------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """Where a figure came from."""
    import celery
    import kombu
    import redis

    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis_py": redis.__version__,
        "redis_server": server.stdout.split()[2].removeprefix("v=") if server.stdout else "",
        "kernel": platform.release(),
    }


def parser(doc: str | None, name: str, quick: str) -> argparse.ArgumentParser:
    """A benchmark's argument parser, with the ``--quick`` and ``--out`` every one has."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"smoke run (< 30 s): {quick}")
    ap.add_argument("--out", default=name, help="write results/<OUT>.json (default %(default)s)")
    return ap


def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime()),
               "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(), **data}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


# -- processes --------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from 3 (state) on


def children(pid: int) -> list[int]:
    """Live children of ``pid`` (this kernel has no /proc/<pid>/task/*/children)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and int(st[1]) == pid:
                found.append(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    """User+system CPU of ``pid``, its reaped children, and its live children."""
    st = _stat(pid)
    if st is None:
        return math.nan
    # fields 14..17 (utime stime cutime cstime) sit at offsets 11..14 here
    total = sum(int(x) for x in st[11:15])
    for child in children(pid):
        cst = _stat(child)
        if cst is not None:
            total += int(cst[11]) + int(cst[12])
    return total / CLK_TCK


def commandstats(client: Any) -> dict[str, int]:
    """``INFO commandstats``: calls per command."""
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}


def server_cpu(client: Any) -> float:
    """A Redis server's CPU seconds so far (``INFO cpu``: user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


class Worker:
    """A ``celery worker`` subprocess on ``benchmarks.bench_app``, stopped by its PID."""

    def __init__(self, env: dict[str, str], pool: str, concurrency: int, *, queues: str = "",
                 name: str = "bench", log: Path | None = None) -> None:
        args = [sys.executable, "-m", "celery", "-A", "benchmarks.bench_app", "worker",
                "-P", pool, "-c", str(concurrency), "-n", f"{name}-{os.getpid()}-{time.monotonic_ns()}@localhost",
                "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"]
        if queues:
            args += ["-Q", queues]
        self.log = log
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if log:
            out.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def kill(self) -> None:
        """kill -9 the main process (prefork children get SIGKILL via PDEATHSIG)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 15) -> None:
        if self.proc.poll() is not None:
            return
        kids = children(self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        for kid in kids:  # pool children the main process started
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)


@contextlib.contextmanager
def redis_server(**kw: Any) -> Iterator[RedisServer]:
    server = RedisServer.start(**kw)
    try:
        yield server
    finally:
        server.stop()


def wait_until(check: Any, timeout_s: float, poll_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return bool(check())
