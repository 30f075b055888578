"""A real Redis Cluster for tests: three primaries, no replicas, on loopback.

Each node is a ``redis-server`` with ``cluster-enabled yes`` on a free loopback port
(its cluster bus on another free port, ``cluster-port``), with its data and
``nodes.conf`` in its own temp directory. ``redis-cli --cluster create`` spreads the
16384 slots over the three; the cluster is ready when every node reports
``cluster_state:ok``. Nodes are stopped by the PIDs this module started, never by
name. Set ``AAA_TEST_REDIS_CLUSTER_URL`` (``redis+cluster://host:port``) to use a
cluster you already run instead (its data is flushed by the tests).

    cluster = RedisClusterServer.start()
    cluster.url                         # redis+cluster://127.0.0.1:P1
    cluster.nodes                       # [(host, port), ...] of the primaries we started
    cluster.stop()
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from .servers import RedisServer, ServerUnavailable, _Server, _wait_for, free_port

REDIS_CLUSTER_ENV = "AAA_TEST_REDIS_CLUSTER_URL"


class RedisClusterServer(_Server):
    """Three ``redis-server`` cluster nodes (primaries only) and the cluster they form."""

    ENV = REDIS_CLUSTER_ENV
    NODES = 3

    def __init__(self, url: str, *, port: int | None = None, workdir: Path | None = None) -> None:
        super().__init__(url, port=port, workdir=workdir)
        #: One RedisServer-like node per primary: (client port, bus port, process).
        self._nodes: list[tuple[int, int, subprocess.Popen | None]] = []

    @property
    def nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port, _, _ in self._nodes]

    @staticmethod
    def cli() -> str:
        found = shutil.which("redis-cli")
        if found is None:
            raise ServerUnavailable("redis-cli is not installed (apt-get install redis-tools)")
        return found

    @classmethod
    def start(cls) -> RedisClusterServer:
        """Start three nodes and create the cluster; raises ServerUnavailable if
        redis-server or redis-cli is missing."""
        RedisServer.binary()
        cls.cli()
        workdir = Path(tempfile.mkdtemp(prefix="aaa-redis-cluster-"))
        ports: list[int] = []
        while len(ports) < 2 * cls.NODES:
            port = free_port()
            if port not in ports:
                ports.append(port)
        server = cls(f"redis+cluster://127.0.0.1:{ports[0]}", port=ports[0], workdir=workdir)
        server._nodes = [(ports[i], ports[cls.NODES + i], None) for i in range(cls.NODES)]
        return server._launch()

    def _spawn(self) -> None:
        assert self.workdir is not None
        for i, (port, bus, _) in enumerate(self._nodes):
            node_dir = self.workdir / str(port)
            node_dir.mkdir(exist_ok=True)
            log = open(node_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the child
            args = [
                RedisServer.binary(), "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-port", str(bus),
                "--cluster-config-file", str(node_dir / "nodes.conf"),
                "--cluster-node-timeout", "5000",
                "--dir", str(node_dir), "--save", "", "--daemonize", "no",
                "--appendonly", "yes", "--appendfsync", "everysec",
            ]
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            log.close()
            self._nodes[i] = (port, bus, proc)
        for port, _, _ in self._nodes:
            _wait_for(lambda p=port: self._cli_ok(p, "PING", want="PONG"), 10,
                      f"redis cluster node on port {port}")
        if not (self.workdir / "created").exists():
            self._create()
        for port, _, _ in self._nodes:
            _wait_for(lambda p=port: self._cli_ok(p, "CLUSTER", "INFO", want="cluster_state:ok"),
                      30, f"cluster_state:ok on port {port}")

    def _create(self) -> None:
        assert self.workdir is not None
        addresses = [f"127.0.0.1:{port}" for port, _, _ in self._nodes]
        done = subprocess.run(
            [self.cli(), "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed ({done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        (self.workdir / "created").touch()

    def _cli_ok(self, port: int, *command: str, want: str) -> bool:
        for _, _, proc in self._nodes:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"a redis cluster node exited with {proc.returncode}; "
                                   f"logs in {self.workdir}")
        try:
            done = subprocess.run([self.cli(), "-h", "127.0.0.1", "-p", str(port), *command],
                                  capture_output=True, text=True, timeout=5,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0 and want in done.stdout

    def _halt(self, kill: bool) -> None:
        for i, (port, bus, proc) in enumerate(self._nodes):
            self._nodes[i] = (port, bus, None)
            if proc is None or proc.poll() is not None:
                continue
            if kill:
                proc.kill()
            else:
                proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
