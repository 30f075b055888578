"""A throwaway RabbitMQ node for tests, from Debian's ``rabbitmq-server`` package.

Like :class:`~tests.servers.RedisServer`: one node on a free loopback port, its
data and logs in a temp directory, stopped by the PIDs this module started (never
by name). Set ``AAA_TEST_RABBITMQ_URL`` (``amqp://guest:guest@127.0.0.1:5672//``)
to use a broker you already run instead.

    server = RabbitMQServer.start(consumer_timeout_ms=5000)
    server.url                          # amqp://guest:guest@127.0.0.1:P//
    server.purge("celery")              # empty a queue between tests
    server.stop()

Everything is private to the node, so it never meets a system RabbitMQ:

- its own ``epmd`` (Erlang's port mapper), started here in the foreground on a
  free loopback port (``ERL_EPMD_PORT``) and stopped by its PID; without it the
  Erlang VM would start a shared ``epmd -daemon`` on port 4369 that outlives the test;
- a unique node name ``aaa-<port>@localhost``, with ``RABBITMQ_MNESIA_BASE``,
  ``RABBITMQ_LOG_BASE``, ``HOME`` (the Erlang cookie), the config, env and
  enabled-plugins files all in the temp directory, so ``/etc/rabbitmq`` is not read;
- AMQP, the Erlang distribution port and epmd listen on 127.0.0.1 only.

``consumer_timeout`` is how long a consumer may hold an unacked message before
RabbitMQ closes its channel (PRECONDITION_FAILED) and requeues the message. The
node checks it on every channel tick, every ``channel_tick_interval`` (60 s by
default: why celery-facts.md §8 saw a 10 s timeout enforced only at 59.5 s), so
both are set here, the tick to 1 s by default.

Run as root, it starts ``/usr/lib/rabbitmq/bin/rabbitmq-server`` directly (the
``/usr/sbin`` wrapper would ``su`` to the ``rabbitmq`` user). It is ready when an
AMQP handshake succeeds: the node opens its AMQP listener last in its boot.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from aaa_celery.testing import pool_children

from .servers import (
    ServerUnavailable,
    _kill_pid,
    _pid_alive,
    _Server,
    _wait_for,
    free_port,
)

RABBITMQ_ENV = "AAA_TEST_RABBITMQ_URL"

#: The package's own start script (runs as the calling user, root included).
SERVER_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in pool_children(todo.pop()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


class RabbitMQServer(_Server):
    """A RabbitMQ node on a free loopback port; see the module docstring."""

    ENV = RABBITMQ_ENV

    def __init__(self, url: str, *, port: int | None = None, workdir: Path | None = None,
                 consumer_timeout_ms: int = 5000, channel_tick_ms: int = 1000) -> None:
        super().__init__(url, port=port, workdir=workdir)
        self.consumer_timeout_ms = consumer_timeout_ms
        self.channel_tick_ms = channel_tick_ms
        self.epmd_port: int | None = None
        self.dist_port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.epmd: subprocess.Popen | None = None
        #: Every process of the node seen while it ran (the beam, its port helpers).
        self.pids: set[int] = set()

    @property
    def nodename(self) -> str:
        return f"aaa-{self.port}@localhost"

    @staticmethod
    def binaries() -> tuple[str, str]:
        """The server start script and ``epmd``; raises ServerUnavailable if missing."""
        script = SERVER_SCRIPT if os.access(SERVER_SCRIPT, os.X_OK) else None
        if script is None and os.geteuid() != 0:
            script = shutil.which("rabbitmq-server")
        epmd = shutil.which("epmd") or next(iter(sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))), None)
        if script is None or epmd is None:
            raise ServerUnavailable("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        return script, epmd

    @classmethod
    def start(cls, *, consumer_timeout_ms: int = 5000, channel_tick_ms: int = 1000) -> RabbitMQServer:
        """Start a new node; raises ServerUnavailable if rabbitmq-server is missing."""
        cls.binaries()
        workdir = Path(tempfile.mkdtemp(prefix="aaa-rabbitmq-"))
        port = free_port()
        server = cls(f"amqp://guest:guest@127.0.0.1:{port}//", port=port, workdir=workdir,
                     consumer_timeout_ms=consumer_timeout_ms, channel_tick_ms=channel_tick_ms)
        server.epmd_port = free_port()
        server.dist_port = free_port()
        return server._launch()

    # -- start -----------------------------------------------------------------
    def _write_config(self) -> dict[str, str]:
        assert self.workdir is not None
        d = self.workdir
        (d / "log").mkdir(exist_ok=True)
        (d / "mnesia").mkdir(exist_ok=True)
        (d / "rabbitmq-env.conf").write_text("# empty: the test sets RABBITMQ_* in the environment\n")
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            f"consumer_timeout = {self.consumer_timeout_ms}\n"
            "loopback_users.guest = true\n"
        )
        (d / "advanced.config").write_text(
            f"[{{rabbit, [{{channel_tick_interval, {self.channel_tick_ms}}}]}}].\n"
        )
        return {
            "HOME": str(d),  # the Erlang cookie goes here, not in /root
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_CRASH_DUMP": str(d / "erl_crash.dump"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_ENABLED_PLUGINS": "",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def _spawn(self) -> None:
        assert self.workdir is not None and self.port is not None
        script, epmd = self.binaries()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.pop("NOTIFY_SOCKET", None)
        env.update(self._write_config())
        log = open(self.workdir / "server.log", "ab")  # noqa: SIM115 - owned by the children
        try:
            self.epmd = subprocess.Popen([epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            _wait_for(lambda: self._listening(self.epmd_port), 10, f"epmd on port {self.epmd_port}")
            self.proc = subprocess.Popen([script], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir, env=env)
        finally:
            log.close()
        _wait_for(self._ready, 120, f"rabbitmq-server on port {self.port}")

    @staticmethod
    def _listening(port: int | None) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def _ready(self) -> bool:
        if self.proc is not None:
            self.pids |= _descendants(self.proc.pid)
            if self.proc.poll() is not None:
                tail = (self.workdir / "server.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"rabbitmq-server exited with {self.proc.returncode}:\n{tail}")
        if not self._listening(self.port):
            return False
        import amqp

        try:
            conn = amqp.Connection(f"127.0.0.1:{self.port}", userid="guest", password="guest",
                                   connect_timeout=2)
            conn.connect()
            conn.close()
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
            return False
        return True

    # -- helpers ---------------------------------------------------------------
    def purge(self, *queues: str) -> None:
        """Empty the named queues (missing queues are fine)."""
        from kombu import Connection

        with Connection(self.url, connect_timeout=5) as conn:
            for name in queues:
                channel = conn.channel()
                with contextlib.suppress(Exception):  # NOT_FOUND closes the channel
                    channel.queue_purge(name)
                with contextlib.suppress(Exception):
                    channel.close()

    def beam_pid(self) -> int | None:
        """The Erlang VM's PID, from the node's pid file."""
        if self.workdir is None:
            return None
        try:
            return int((self.workdir / "rabbitmq.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    # -- stop ------------------------------------------------------------------
    def _halt(self, kill: bool) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            self.pids |= _descendants(proc.pid)
            beam = self.beam_pid()
            if beam:
                self.pids.add(beam)
            if proc.poll() is None:
                if kill:
                    for pid in self.pids:  # the VM first, as a crash: no clean shutdown
                        _kill_pid(pid, signal.SIGKILL, 5)
                # the start script's TERM trap stops the VM and waits for it
                if not _kill_pid(proc.pid, signal.SIGTERM, 60):
                    _kill_pid(proc.pid, signal.SIGKILL, 5)
                with contextlib.suppress(Exception):
                    proc.wait(5)
            for pid in self.pids:  # anything the VM left behind (it should leave nothing)
                if _pid_alive(pid) and not _kill_pid(pid, signal.SIGTERM, 10):
                    _kill_pid(pid, signal.SIGKILL, 5)
            self.pids.clear()
        epmd, self.epmd = self.epmd, None
        if epmd is not None and epmd.poll() is None:
            if not _kill_pid(epmd.pid, signal.SIGTERM, 5):
                _kill_pid(epmd.pid, signal.SIGKILL, 5)
            with contextlib.suppress(Exception):
                epmd.wait(5)
