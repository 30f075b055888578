"""``examples/fleet.sh`` started, used and stopped: a tool call through its two worker pools
into its PostgreSQL store, the CLI on that store, Flower, the Flask app and the metrics;
then SIGTERM stops every process it started.

The script runs as it does on stock Debian and under ``nohup`` or ``&``: PostgreSQL's
``initdb`` off PATH (only in /usr/lib/postgresql/*/bin), and SIGINT ignored (bash cannot
trap a signal it started with ignored, so Ctrl-C's SIGINT never stops a background fleet).
Whatever happens, the teardown kills the script's whole process group and each PID of its
pid file (PostgreSQL detaches into a session of its own)."""

from __future__ import annotations

import contextlib
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
from ..servers import ServerUnavailable, postgres_bin

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


def path_without(*binaries: str) -> str:
    """PATH less the directories that hold any of ``binaries``."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not any(os.access(os.path.join(d, b), os.X_OK) for b in binaries))


def start_fleet(run: Path, out: Path, **env: str) -> subprocess.Popen:
    """fleet.sh as a background job starts it: SIGINT ignored, in a process group of its own."""
    for binary in ("initdb", "pg_ctl"):
        try:
            postgres_bin(binary)
        except ServerUnavailable as e:
            unavailable(str(e))
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed")
    full = {**os.environ, "AAA_FLEET_DIR": str(run), "PYTHON": sys.executable,
            "PATH": path_without("initdb", "pg_ctl"), **env}
    with open(out, "wb") as log:
        return subprocess.Popen(["bash", str(SCRIPT)], env=full, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def fleet_pids(run: Path) -> dict[str, int]:
    path = run / "pids"
    lines = path.read_text().splitlines() if path.exists() else []
    return {line.split()[0]: int(line.split()[1]) for line in lines if len(line.split()) == 2}


def kill_fleet(proc: subprocess.Popen, run: Path) -> None:
    """The teardown: SIGKILL the script's process group and each PID of its pid file, and
    remove root's PostgreSQL directory (what fleet.sh's own stop would have done)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in fleet_pids(run).values():
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if (run / "pg_dir").exists():
        shutil.rmtree((run / "pg_dir").read_text().strip(), ignore_errors=True)


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


def test_fleet_sh_in_the_background_serves_a_tool_call_and_sigterm_stops_everything(tmp_path):
    run = tmp_path / "fleet"
    proc = start_fleet(run, tmp_path / "fleet.out")
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
        proc.send_signal(signal.SIGTERM)  # `kill PID`: what stops a background fleet
        proc.wait(timeout=60)
        pids = fleet_pids(run)
        assert {"redis", "postgres", "pool-a", "pool-b", "flower", "flask"} <= set(pids)
        deadline = time.monotonic() + 15
        while [n for n, p in pids.items() if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [n for n, p in pids.items() if alive(p)], (tmp_path / "fleet.out").read_text()
    finally:
        kill_fleet(proc, run)


def test_fleet_sh_shows_initdb_s_own_error_and_stops_what_it_started(tmp_path):
    run = tmp_path / "fleet"
    env = {}
    if os.geteuid() == 0:  # PostgreSQL runs as postgres, in a directory it cannot reach
        blocked = tmp_path / "blocked"
        blocked.mkdir(mode=0o700)
        env["TMPDIR"] = str(blocked)
    else:  # PostgreSQL's data directory is taken
        (run / "pg" / "data").mkdir(parents=True)
        (run / "pg" / "data" / "something").write_text("")
    proc = start_fleet(run, tmp_path / "fleet.out", **env)
    try:
        proc.wait(timeout=60)
        out = (tmp_path / "fleet.out").read_text()
        assert proc.returncode != 0, out
        assert "fleet.sh: PostgreSQL's initdb failed" in out, out
        assert "initdb: error:" in out, out  # initdb's own words, from the end of initdb.log
        pids = fleet_pids(run)
        assert set(pids) == {"redis"}, out
        assert not alive(pids["redis"]), out
    finally:
        kill_fleet(proc, run)
