"""Fixtures of the MCP tests: a real fleet (two ``celery worker`` processes on Redis) and
the guarded MCP server over streamable HTTP (uvicorn in a thread of the test process)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from aaa_celery.testing import Fleet

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


@pytest.fixture(scope="module")
def mcp_env(redis_server: Any) -> Iterator[dict[str, str]]:
    url = redis_server.url.rsplit("/", 1)[0] + "/9"  # a db of our own
    redis.Redis.from_url(url).flushdb()
    env = {"AAA_MCP_REDIS": url}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def fleet(mcp_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet("tests.contrib.mcp.mcp_app", size=2, concurrency=2, env=mcp_env, cwd=str(ROOT),
               workdir=tmp_path_factory.mktemp("mcp-fleet")) as f:
        yield f
