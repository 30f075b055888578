"""``celery aaa ...`` never prints a traceback for store trouble or a bad argument: one
line naming what failed, and a non-zero exit. Every command, against a Redis store whose
server is down, a PostgreSQL store whose server is down, and a store URL that cannot be
opened; then bad arguments against a live store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from . import cli_app
from .test_cli import APP

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = [
    ["calls", "--since", "1h"],
    ["calls"],
    ["calls", "--state", "unknown", "--json"],
    ["show", "some-call"],
    ["show", "some-call", "--json"],
    ["resolve", "some-call", "--as", "completed", "--note", "seen in the PSP", "--value", '{"ok": true}'],
    ["resolve", "some-call", "--as", "failed", "--note", "not in the PSP"],
    ["purge", "--older-than", "7d", "--yes"],
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def invoke(*args: str):
    from celery.bin.celery import celery

    return CliRunner().invoke(celery, ["-A", APP, "aaa", *args])


@pytest.fixture
def store_at() -> Iterator[object]:
    """Point the CLI's app at a store URL for one test; the old one comes back after."""
    app = cli_app.app
    old = app.conf.get("aaa_store_url")

    def point(url: str) -> None:
        app.conf.aaa_store_url = url
        if hasattr(app, "_aaa_store"):
            del app._aaa_store

    yield point
    point(old)


def assert_one_line_failure(result, *words: str) -> str:
    output = result.output
    assert "Traceback" not in output, output
    assert result.exit_code != 0, output
    # a Python exception escaping the command is a traceback in a terminal
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    for word in words:
        assert word in lines[0], output
    return lines[0]


DOWN = {
    "redis down": (lambda: f"redis://127.0.0.1:{free_port()}/0", "redis store"),
    "postgresql down": (lambda: f"postgresql+psycopg://aaa@127.0.0.1:{free_port()}/aaa?connect_timeout=2",
                        "postgresql store"),
    "bad port": (lambda: "redis://127.0.0.1:99999/0", "Port out of range"),
}


@pytest.mark.parametrize("kind", list(DOWN))
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_store_that_cannot_be_reached_is_one_line_and_a_failed_exit(store_at, kind, command):
    url, named = DOWN[kind]
    store_at(url())
    line = assert_one_line_failure(invoke(*command), named)
    assert line.startswith("Error: ")


@pytest.mark.parametrize("kind", list(DOWN))
def test_doctor_with_the_store_down_fails_without_a_traceback(store_at, kind):
    url, _ = DOWN[kind]
    store_at(url())
    result = invoke("doctor", "--ping-timeout", "0.2")
    assert "Traceback" not in result.output and result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.splitlines()
    if kind != "bad port":  # (doctor's own checks are issue 22 item 3: here only "no traceback")
        assert any(line.startswith("FAIL store reachable") for line in lines), result.output


@pytest.mark.redis
@pytest.mark.parametrize("command, named", [
    (["calls", "--since", "soon"], "--since"),
    (["purge", "--older-than", "a week", "--yes"], "--older-than"),
    (["show", "call\x00with a NUL"], "call id"),
    (["show", "x" * 5000], "call id"),
    (["resolve", "call\nid", "--as", "completed", "--note", "n"], "call id"),
    (["resolve", "some-call", "--as", "completed", "--note", "n", "--value", "{not json"], "--value"),
], ids=["since", "older-than", "nul-id", "long-id", "newline-id", "value"])
def test_a_bad_argument_is_named_on_one_error_line(store_at, redis_url, command, named):
    store_at(redis_url)
    result = invoke(*command)
    output = result.output
    assert "Traceback" not in output and result.exit_code != 0, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and named in errors[0], output


def test_the_installed_command_prints_no_traceback_with_the_store_down():
    """In a new process, through the ``celery`` command: the brief's ``calls --since 1h``."""
    env = {**os.environ, "AAA_CLI_BROKER": f"redis://127.0.0.1:{free_port()}/0", "PYTHONPATH": str(ROOT)}
    env.pop("AAA_CLI_STORE", None)
    done = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "aaa", "calls", "--since", "1h"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "redis store unavailable" in done.stderr, done.stderr
