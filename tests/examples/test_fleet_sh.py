"""``examples/fleet.sh`` started, used and stopped: a tool call through its two worker pools
into its PostgreSQL store, the CLI on that store, Flower, the Flask app and the metrics;
then Ctrl-C (SIGINT) stops every process it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ..conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "fleet.sh"
APP_DIR = ROOT / "examples" / "flask_app"
pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.fleet]


def fleet_env(run: Path) -> dict[str, str]:
    env = {}
    for line in (run / "env").read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip('"')
    return env


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read().decode()


class Browser:
    """An API client of the Flask app: a session cookie and its CSRF token."""

    def __init__(self, base: str) -> None:
        import http.cookiejar

        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.token = self.get("/aaa/csrf")["csrf_token"]

    def get(self, path: str) -> dict:
        with self.opener.open(self.base + path, timeout=10) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "X-CSRFToken": self.token})
        with self.opener.open(request, timeout=10) as r:
            return r.status, json.loads(r.read())


def wait(check, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return value


def test_fleet_sh_starts_serves_a_tool_call_and_stops_everything_on_ctrl_c(tmp_path):
    for binary in ("redis-server", "initdb", "pg_ctl"):
        if shutil.which(binary) is None:
            unavailable(f"{binary} is not installed")
    run = tmp_path / "fleet"
    env = {**os.environ, "AAA_FLEET_DIR": str(run), "PYTHON": sys.executable}
    with open(tmp_path / "fleet.out", "wb") as out:
        proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (run / "ready").exists():
            assert proc.poll() is None, (tmp_path / "fleet.out").read_text()
            assert time.monotonic() < deadline, (tmp_path / "fleet.out").read_text()
            time.sleep(0.2)
        fleet = fleet_env(run)
        assert fleet["AAA_STORE_URL"].startswith("postgresql+psycopg://")
        client_env = {**os.environ, **fleet, "PYTHONPATH": f"{APP_DIR}:{ROOT}"}

        # A tool call through the fleet's pools, into its PostgreSQL store.
        send = ("import json; from worker import app; "
                "r = app.tasks['aaa.tool.lookup_order'].delay(arguments={'order_id': 'A-100'}); "
                "print(json.dumps({'id': r.id, 'value': r.get(timeout=60)}))")
        done = subprocess.run([sys.executable, "-c", send], cwd=APP_DIR, env=client_env, capture_output=True,
                              text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        call = json.loads(done.stdout.strip().splitlines()[-1])
        assert call["value"]["order_id"] == "A-100"

        # The operator's view of it.
        shown = subprocess.run([sys.executable, "-m", "celery", "-A", "worker", "aaa", "show", call["id"], "--json"],
                               cwd=APP_DIR, env=client_env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        story = json.loads(shown.stdout)
        assert story["state"] == "completed" and story["attempts"][0]["worker"].startswith("pool-")

        # The agent example through the fleet: a run started on the Flask app looks the order up
        # on a pool, waits for a person, and refunds once approved.
        web = Browser(fleet["AAA_FLEET_FLASK"])
        status, started_run = web.post("/aaa/runs", {"task": "refund order A-100", "tenant": "acme"})
        assert status == 201
        run_id = started_run["run_id"]
        [pending] = wait(lambda: web.get("/aaa/approvals")["approvals"])
        assert pending["tool"] == "refund" and pending["run_id"] == run_id
        status, _ = web.post(f"/aaa/runs/{run_id}/approvals/{pending['call_id']}",
                             {"decision": "approve", "digest": pending["digest"]})
        assert status == 200
        finished = wait(lambda: (x := web.get(f"/aaa/runs/{run_id}/events"))["result"] and x)
        assert finished["status"] == "completed"
        assert "refunded 30 EUR on A-100" in finished["result"]["value"]["text"]
        calls = {c["name"]: c for c in web.get(f"/aaa/runs/{run_id}/attempts")["calls"]}
        assert [e["type"] for e in calls["refund"]["trail"]] == ["aaa.tool.started", "aaa.tool.completed"]
        assert calls["refund"]["trail"][0]["data"]["worker"].startswith("pool-")

        # The web pages and the metrics.
        assert get(f"{fleet['AAA_FLEET_FLASK']}/aaa/")[0] == 200
        assert get(f"{fleet['AAA_FLEET_FLOWER']}/")[0] == 200
        scraped = "".join(get(url)[1] for url in fleet["AAA_FLEET_METRICS"].split())
        assert 'aaa_task_attempts_started_total{hostname="pool-' in scraped
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    pids = {line.split()[0]: int(line.split()[1]) for line in (run / "pids").read_text().splitlines()}
    assert {"redis", "postgres", "pool-a", "pool-b", "flower", "flask"} <= set(pids)
    deadline = time.monotonic() + 15
    while [n for n, p in pids.items() if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [n for n, p in pids.items() if alive(p)], (tmp_path / "fleet.out").read_text()
