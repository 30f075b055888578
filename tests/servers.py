"""Real Redis and PostgreSQL servers for tests, from the machine's Debian packages.

Each server runs on a free loopback port with its data in a temp directory, and is
stopped by the PID this module started, never by name. Set ``AAA_TEST_REDIS_URL`` or
``AAA_TEST_POSTGRES_URL`` to use a server you already run instead (``from_env``).

    server = RedisServer.start()        # or PostgresServer.start()
    server.url                          # redis://127.0.0.1:P/0
    server.restart()                    # same port, same data directory
    server.stop()

PostgreSQL refuses to run as root, so as root its commands run through
``runuser -u postgres`` in a directory owned by ``postgres`` (celery-facts.md §9).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from aaa_celery.testing.redis_server import pongs

REDIS_ENV = "AAA_TEST_REDIS_URL"
POSTGRES_ENV = "AAA_TEST_POSTGRES_URL"

#: Ports other test runs on this machine use; never start a server there.
RESERVED_PORTS = frozenset({6391, 5491})


class ServerUnavailable(RuntimeError):
    """The server's binaries are not installed here (the caller skips or fails)."""


def free_port() -> int:
    """A loopback port nobody listens on now (outside RESERVED_PORTS)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def _wait_for(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up within {timeout_s} s")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_pid(pid: int, sig: int, wait_s: float) -> bool:
    """Send ``sig`` to ``pid`` and wait for it to go; True once it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _pid_alive(pid):
            return True
        time.sleep(0.02)
    return not _pid_alive(pid)


class _Server:
    """What both servers share: a URL, and (if this process started it) a port and a
    temp directory that ``stop`` removes. Subclasses provide ``_spawn`` and ``_halt``."""

    #: The env var naming a server to use instead of starting one.
    ENV = ""

    def __init__(self, url: str, *, port: int | None = None, workdir: Path | None = None) -> None:
        self.url = url
        self.port = port
        self.workdir = workdir

    @property
    def owned(self) -> bool:
        """True if this object started the server (False: it came from the env var)."""
        return self.workdir is not None

    @classmethod
    def from_env(cls):
        url = os.environ.get(cls.ENV)
        return cls(url) if url else None

    def _launch(self):
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self) -> None:
        raise NotImplementedError

    def _halt(self, kill: bool) -> None:
        raise NotImplementedError

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server we started, by its PID (gracefully, or as a crash with
        ``kill``), and remove its data. Safe to call twice; a no-op for an env server."""
        if self.workdir is not None:
            self._halt(kill)
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same port with the same data directory;
        ``kill`` stops it as a crash would (only what reached disk survives)."""
        if not self.owned:
            raise RuntimeError(f"cannot restart a server this test did not start ({self.url})")
        self._halt(kill)
        self._spawn()


class RedisServer(_Server):
    """``redis-server`` on a free loopback port, data (AOF) in a temp directory."""

    ENV = REDIS_ENV

    def __init__(self, url: str, *, port: int | None = None, workdir: Path | None = None,
                 appendonly: bool = True, appendfsync: str = "everysec") -> None:
        super().__init__(url, port=port, workdir=workdir)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str:
        found = shutil.which("redis-server")
        if found is None:
            raise ServerUnavailable("redis-server is not installed (apt-get install redis-server)")
        return found

    @classmethod
    def start(cls, *, appendonly: bool = True, appendfsync: str = "everysec") -> RedisServer:
        """Start a new server; raises ServerUnavailable if redis-server is missing."""
        cls.binary()
        workdir = Path(tempfile.mkdtemp(prefix="aaa-redis-"))
        port = free_port()
        return cls(f"redis://127.0.0.1:{port}/0", port=port, workdir=workdir,
                   appendonly=appendonly, appendfsync=appendfsync)._launch()

    def _spawn(self) -> None:
        assert self.workdir is not None and self.port is not None
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        args = [
            self.binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.workdir), "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
        ]
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        _wait_for(self._ping, 10, f"redis-server on port {self.port}")

    def _ping(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{tail}")
        return pongs(self.port)

    def _halt(self, kill: bool) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if kill or not _kill_pid(proc.pid, signal.SIGTERM, 10):
            _kill_pid(proc.pid, signal.SIGKILL, 10)
        proc.wait()


def postgres_bin(name: str) -> str:
    """Path of a PostgreSQL server binary: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not candidates:
        raise ServerUnavailable(
            f"PostgreSQL's {name} is not installed (apt-get install postgresql)"
        )
    return candidates[-1]


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://…``) as libpq/psycopg takes it."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+')[0]}{sep}{rest}"


class PostgresServer(_Server):
    """A throwaway PostgreSQL cluster (initdb + pg_ctl) on a free loopback port."""

    ENV = POSTGRES_ENV

    def __init__(self, url: str, *, port: int | None = None, workdir: Path | None = None) -> None:
        super().__init__(url, port=port, workdir=workdir)
        self._pg_ctl = ""

    @property
    def datadir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "data"

    @staticmethod
    def _as_owner(args: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *args]
        return args

    def _run(self, args: list[str], timeout_s: float = 60) -> None:
        done = subprocess.run(self._as_owner(args), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb a cluster in a temp directory and start it; raises ServerUnavailable
        if PostgreSQL (or, as root, its ``postgres`` user) is missing."""
        initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
        workdir = Path(tempfile.mkdtemp(prefix="aaa-pg-"))
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(workdir, ignore_errors=True)
                raise ServerUnavailable("running as root but there is no 'postgres' user") from None
            os.chown(workdir, owner.pw_uid, owner.pw_gid)
        port = free_port()
        server = cls(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres",
                     port=port, workdir=workdir)
        server._pg_ctl = pg_ctl
        try:
            server._run([initdb, "-D", str(server.datadir), "-A", "trust", "-U", "postgres",
                         "--no-sync", "-E", "UTF8"], timeout_s=120)
        except BaseException:
            server.stop()
            raise
        return server._launch()

    #: Server settings (``-c name=value``). The tests trade durability for speed; a
    #: benchmark's server keeps PostgreSQL's defaults (``benchmarks/_common.DurablePostgres``).
    settings: dict[str, str] = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                                "max_connections": "300"}

    def _spawn(self) -> None:
        opts = (f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 "
                + " ".join(f"-c {name}={value}" for name, value in self.settings.items()))
        log = str(self.workdir / "postgres.log")
        self._run([self._pg_ctl, "-D", str(self.datadir), "-o", opts, "-l", log,
                   "-w", "-t", "60", "start"], timeout_s=90)

    def pid(self) -> int | None:
        """The postmaster's PID, from its pid file."""
        if self.workdir is None:
            return None
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _halt(self, kill: bool) -> None:
        pid = self.pid()
        if pid is None or not _pid_alive(pid):
            return
        if not kill:
            with contextlib.suppress(Exception):
                self._run([self._pg_ctl, "-D", str(self.datadir), "-m", "fast", "-w", "-t", "30",
                           "stop"], timeout_s=40)
        if _pid_alive(pid) and not _kill_pid(pid, signal.SIGQUIT, 5):
            _kill_pid(pid, signal.SIGKILL, 5)
