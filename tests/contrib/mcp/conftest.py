"""Fixtures of the MCP tests: a real fleet (two ``celery worker`` processes on Redis), shared by
the package's modules, a stub remote MCP server, and an HTTP server helper (uvicorn in a thread)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from aaa_celery.testing import Fleet
from aaa_celery.testing.faults import stop_process

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """An ASGI app served by uvicorn in a daemon thread, on a free loopback port."""

    def __init__(self, asgi: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> HttpServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("the MCP server did not start in 30 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class Stub:
    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log, self.url = port, log, f"http://127.0.0.1:{port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> Stub:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.contrib.mcp.stub_server", str(self.port),
                                      str(self.log)], cwd=ROOT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                assert time.monotonic() < deadline, "the stub MCP server did not start"
                time.sleep(0.1)

    def requests(self, tool: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [r for r in lines if r["tool"] == tool]

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@pytest.fixture(scope="package")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    """A stub remote MCP server (stub_server.py), in its own process."""
    s = Stub(free_port(), tmp_path_factory.mktemp("stub") / "requests.jsonl").start()
    yield s
    s.stop()


@pytest.fixture(scope="package")
def mcp_env(redis_server: Any, stub: Stub) -> Iterator[dict[str, str]]:
    url = redis_server.url.rsplit("/", 1)[0] + "/9"  # a db of our own
    redis.Redis.from_url(url).flushdb()
    env = {"AAA_MCP_REDIS": url, "AAA_MCP_STUB_URL": stub.url}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="package")
def fleet(mcp_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet("tests.contrib.mcp.mcp_app", size=2, concurrency=2, env=mcp_env, cwd=str(ROOT),
               workdir=tmp_path_factory.mktemp("mcp-fleet")) as f:
        yield f
