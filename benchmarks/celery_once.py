"""celery-once with its default settings: kill -9 of the worker running a ``QueueOnce`` task,
then how long the task's lock refuses every new call of its key.

celery-once is not a dependency of aaa_celery: pass the interpreter of a virtualenv that has it
(``python -m venv /tmp/once && /tmp/once/bin/pip install celery_once==3.0.1 'celery[redis]'``)::

    python benchmarks/celery_once.py --python /tmp/once/bin/python          # about 30 s

It starts its own ``redis-server`` (broker, result backend and celery-once's lock store) and one
``celery worker -P prefork -c 1`` of a ``QueueOnce`` task that sleeps 60 s, sends the task, and
``kill -9``s the worker (its pool child dies with it) once the body runs. It then starts a new
worker and sends the same call every second for ``--watch`` seconds, and prints what each send
got (``AlreadyQueued``, or sent) and the lock key's remaining TTL. The guard's figure for the
same fault is measured by ``tests/worker/test_concurrency_fleet.py`` (docs/concurrency.md).
Results: ``benchmarks/results/<--out>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aaa_celery.testing.faults import kill9, stop_process  # noqa: E402
from aaa_celery.testing.redis_server import ThrowawayRedis  # noqa: E402

APP = '''
import os, time
import redis
from celery import Celery
from celery_once import QueueOnce

URL = os.environ["ONCE_BENCH_URL"]
app = Celery("once_app", broker=URL, backend=URL)
# celery-once's documented configuration, default_timeout left at its default (3600 s)
app.conf.ONCE = {"backend": "celery_once.backends.Redis", "settings": {"url": URL}}
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                worker_prefetch_multiplier=1, task_acks_late=True, broker_connection_retry_on_startup=True)


@app.task(base=QueueOnce)
def sync(shop):
    redis.Redis.from_url(URL).rpush("once:ran", f"{shop} {os.getpid()} {time.time()}")
    time.sleep(60)
'''

SEND = '''
import sys
from celery_once import AlreadyQueued
from once_app import sync
try:
    sync.delay(7)
    print("sent")
except AlreadyQueued as e:
    print(f"AlreadyQueued (countdown {e.countdown:.0f} s)")
'''


def start_worker(python: str, workdir: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([python, "-m", "celery", "-A", "once_app", "worker", "-P", "prefork", "-c", "1",
                             "-n", f"{name}@once", "--without-gossip", "--without-mingle", "-l", "info"],
                            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while b" ready." not in (workdir / f"{name}.log").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((workdir / f"{name}.log").read_text(errors="replace")[-3000:])
        time.sleep(0.1)
    return proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="an interpreter with celery_once and celery[redis] installed")
    p.add_argument("--watch", type=float, default=20.0, help="seconds to keep sending after the kill (default 20)")
    p.add_argument("--out", default="celery_once", help="results/<out>.json")
    args = p.parse_args()

    server = ThrowawayRedis()
    workdir = Path(tempfile.mkdtemp(prefix="aaa-once-"))
    (workdir / "once_app.py").write_text(APP)
    env = {**os.environ, "ONCE_BENCH_URL": server.url, "PYTHONPATH": str(workdir)}
    client = redis.Redis.from_url(server.url, decode_responses=True)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        workers.append(start_worker(args.python, workdir, env, "w1"))

        def send() -> str:
            return subprocess.run([args.python, "-c", SEND], cwd=workdir, env=env, capture_output=True,
                                  text=True, check=True).stdout.strip()

        print("first send:", send())
        deadline = time.monotonic() + 30
        while not client.lrange("once:ran", 0, -1):
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.1)
        kill9(workers[0].pid)
        killed_at = time.time()
        workers.append(start_worker(args.python, workdir, env, "w2"))
        lock = next(iter(client.scan_iter("qo_*")), None)
        samples = []
        while time.time() - killed_at < args.watch:
            got = send()
            ttl = client.pttl(lock) / 1000 if lock else None
            samples.append({"after_kill_s": round(time.time() - killed_at, 2), "send": got, "lock_ttl_s": ttl})
            print(f"{samples[-1]['after_kill_s']:6.1f} s after kill -9: {got}; lock TTL {ttl} s")
            time.sleep(1.0)
        runs = client.lrange("once:ran", 0, -1)
        refused = sum(1 for s in samples if s["send"].startswith("AlreadyQueued"))
        left = samples[-1]["lock_ttl_s"] if samples else None
        summary = {"sends": len(samples), "refused": refused, "bodies_run": len(runs), "lock": lock,
                   "lock_ttl_left_s": left, "watched_s": args.watch,
                   "stuck_for_s": None if left is None else round(samples[-1]["after_kill_s"] + left)}
        print(json.dumps(summary, indent=2))
        out = Path(__file__).parent / "results" / f"{args.out}.json"
        out.write_text(json.dumps({"command": " ".join(sys.argv), "at": time.strftime("%Y-%m-%d"),
                                   "summary": summary, "samples": samples}, indent=2) + "\n")
        return 0
    finally:
        for proc in workers:
            stop_process(proc)
        client.close()
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
