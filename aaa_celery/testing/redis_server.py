"""A throwaway ``redis-server`` for tests: a free loopback port, data in a temp directory,
stopped by the PID it started (never by name)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .faults import stop_process


class RedisUnavailable(RuntimeError):
    """``redis-server`` is not installed here."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayRedis:
    """``redis-server`` with AOF on ``127.0.0.1:<free port>``; :meth:`stop` ends it by PID."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable("redis-server is not installed (apt-get install redis-server), "
                                   "or pass --aaa-redis-url / set AAA_TEST_REDIS_URL")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = Path(tempfile.mkdtemp(prefix="aaa-test-redis-"))
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                 "--save", "", "--appendonly", "yes", "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not self._pong():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log_text}")
            time.sleep(0.05)

    def _pong(self) -> bool:
        return pongs(self.port)

    def stop(self) -> None:
        stop_process(self.proc)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.workdir)


def pongs(port: int) -> bool:
    """Whether a Redis server on loopback ``port`` answers PING now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False
