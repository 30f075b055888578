"""Takeover: how long after a kill -9 of the holder does the call move on?

Two ``celery worker -P prefork -c 1`` processes (prefetch 1) on one Redis (broker,
backend and store), with the broker's ``visibility_timeout`` at its default (3600 s).
Each repeat sends a call that sleeps on attempt 1, waits for it to start, waits a
random 0.5 s .. ``heartbeat_s`` + 0.5 s (so the kill lands anywhere in a heartbeat
period), then ``kill -9`` s the holder's main process (its pool child dies with it,
PDEATHSIG) and starts a replacement worker at once. Measured: the time from the kill
to the next step of the call:

* guarded (``at_least_once``): the ``aaa.tool.started`` event of attempt 2 in the store;
* guarded (``at_most_once``, ``--at-most-once``): the ``OutcomeUnknown`` result recorded;
* plain Celery (acks_late, reject_on_worker_lost) with ``visibility_timeout`` 60 and
  kombu's default restore sweep: the redelivered copy starting (capped at
  ``--plain-timeout``). With the default 3600 s, that is up to 3600 s + one sweep
  period (~100 s) by design; it is stated, not measured.

    python benchmarks/takeover.py                 # TTL 5/15/30 x 10 repeats, plain x 3
    python benchmarks/takeover.py --quick         # < 30 s: TTL 2 x 2 repeats, no plain
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import Worker, parser, children, redis_server, table, wait_until, write_json  # noqa: E402

DEFAULT_VISIBILITY_S = 3600  # kombu's Redis transport default
SWEEP_PERIOD_S = 100  # unacked_restore_interval (10 s) x unacked_restore_throttle (10), celery-facts §1


class Fleet:
    """Two single-slot workers; the killed one is replaced at once."""

    def __init__(self, env: dict[str, str], logdir: Path, tag: str) -> None:
        self.env, self.logdir, self.tag = env, logdir, tag
        self.n = 0
        self.workers = [self._new() for _ in range(2)]

    def _new(self) -> Worker:
        self.n += 1
        return Worker(self.env, "prefork", 1, queues="bench", name=f"{self.tag}{self.n}",
                      log=self.logdir / f"{self.tag}.log")

    def holder(self, pid: int) -> Worker | None:
        for w in self.workers:
            if pid == w.pid or pid in children(w.pid):
                return w
        return None

    def kill_and_replace(self, w: Worker) -> float:
        t = time.time()
        w.kill()
        self.workers.remove(w)
        self.workers.append(self._new())
        return t

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


def starts(r: Any, task_id: str) -> list[tuple[float, int, int]]:
    out = []
    for raw in r.lrange(f"bench:starts:{task_id}", 0, -1):
        t, pid, _, attempt = raw.decode().split("|")
        out.append((float(t), int(pid), int(attempt)))
    return out


def run_mode(mode: str, ttl: float | None, repeats: int, args: argparse.Namespace, logdir: Path,
             srv: Any) -> dict[str, Any]:
    """One scenario on the shared server (flushed first): the app's connections stay valid."""
    import redis

    from aaa_celery.stores.redis import RedisStore

    with ExitStack() as stack:
        redis.Redis.from_url(srv.url).flushall()
        env = {"BENCH_BROKER": srv.url, "BENCH_BACKEND": srv.url, "BENCH_STORE": srv.url,
               "BENCH_STARTS": srv.url, "BENCH_QUEUE": "bench", "BENCH_PREFETCH": "1"}
        if mode == "plain":
            env["BENCH_VISIBILITY"] = str(args.plain_visibility)
        else:
            env["BENCH_LEASE_TTL"] = str(ttl)
        os.environ.update(env)
        from benchmarks import bench_app

        app = bench_app.app
        app.conf.update(broker_url=srv.url, result_backend=srv.url, aaa_store_url=srv.url)
        app._aaa_store = None
        r = redis.Redis.from_url(srv.url)
        store = RedisStore(srv.url)
        fleet = Fleet(env, logdir, f"{mode}-{ttl}-")
        stack.callback(fleet.stop)
        task = {"plain": bench_app.sleep_plain, "guarded": bench_app.sleep_guarded,
                "at_most_once": bench_app.sleep_at_most_once}[mode]
        heartbeat = (ttl or 3) / 3
        cap = args.plain_timeout if mode == "plain" else (ttl or 0) + 60
        rng = random.Random(7)
        samples: list[float | None] = []
        for i in range(repeats):
            task_id = f"{mode}-{ttl}-{i}-{time.monotonic_ns()}"
            t_sent = time.time()
            task.apply_async((3600.0,), task_id=task_id)
            started = wait_until(lambda: bool(starts(r, task_id)) if mode != "at_most_once" else
                                 bool(store.events(task_id)), 60, 0.02)
            assert started, f"{mode}: call {task_id} never started (worker logs in {logdir})"
            if mode == "at_most_once":
                pid = int(store.events(task_id)[0].data["worker"].split("/")[1])
            else:
                pid = starts(r, task_id)[0][1]
            time.sleep(0.5 + rng.random() * heartbeat)
            w = fleet.holder(pid)
            assert w is not None, f"no worker of ours runs pid {pid}"
            t_kill = fleet.kill_and_replace(w)
            if mode == "plain":
                done = wait_until(lambda: len(starts(r, task_id)) >= 2, cap, 0.05)
                t_next = starts(r, task_id)[1][0] if done else None
            elif mode == "guarded":
                def second() -> float | None:
                    for e in store.events(task_id):
                        if e.type == "aaa.tool.started" and e.attempt == 2:
                            return e.at
                    return None
                done = wait_until(lambda: second() is not None, cap, 0.05)
                t_next = second()
            else:
                def unknown() -> float | None:
                    for e in store.events(task_id):
                        if e.type == "aaa.tool.failed" and e.data.get("error") == "OutcomeUnknown":
                            return e.at
                    return None
                done = wait_until(lambda: unknown() is not None, cap, 0.05)
                t_next = unknown()
            dt = (t_next - t_kill) if t_next is not None else None
            samples.append(dt)
            shown = f"{dt:.2f} s" if dt is not None else f"> {cap:.0f} s (capped)"
            print(f"  {mode:12} ttl={ttl} repeat {i}: killed {t_kill - t_sent:.1f} s after send, next step {shown}",
                  flush=True)
        store.close()
    return summarize(mode, ttl, samples, cap)


def summarize(mode: str, ttl: float | None, samples: list[float | None], cap: float) -> dict[str, Any]:
    """Median and max over every repeat, a capped one counting as longer than any measured."""
    ranked = sorted(float("inf") if s is None else s for s in samples)
    median = statistics.median(ranked) if ranked else None
    return {
        "mode": mode, "lease_ttl_s": ttl, "repeats": len(samples), "samples_s": samples,
        "median_s": None if median is None or median == float("inf") else median,
        "max_s": None if not ranked or ranked[-1] == float("inf") else ranked[-1],
        "capped": sum(s is None for s in samples), "cap_s": cap,
        "target_s": (ttl + 3) if ttl else None,
    }


def report(rows: list[dict[str, Any]], visibility: float) -> str:
    out = []
    for x in rows:
        if x["mode"] == "plain":
            what = f"plain Celery, visibility_timeout {visibility:g} s, kombu default sweeps"
        else:
            what = {"guarded": "guarded, attempt 2 started", "at_most_once": "guarded at_most_once, OutcomeUnknown"}[x["mode"]]
        med = x["median_s"] if x["median_s"] is not None else float("nan")
        mx = x["max_s"] if x["max_s"] is not None else f"> {x['cap_s']:.0f} (capped)"
        cap = f"{x['capped']} of {x['repeats']} > {x['cap_s']:.0f} s" if x["capped"] else ""
        target = x["target_s"]
        verdict = ("met" if med <= target else "MISSED") if target else ""
        out.append([what, x["lease_ttl_s"] or "-", x["repeats"], med, mx, cap,
                    f"<= {target:g} s: {verdict}" if target else ""])
    out.append([f"plain Celery, visibility_timeout {DEFAULT_VISIBILITY_S} s (default)", "-", "-",
                "not measured", f"up to {DEFAULT_VISIBILITY_S + SWEEP_PERIOD_S:,} s", "by design", ""])
    return table(["scenario", "lease_ttl_s", "repeats", "median s (kill → next step)", "max s", "capped", "target"],
                 out, "Takeover after kill -9 of the holder (broker visibility_timeout at its default 3600 s "
                 "for the guarded rows)")


QUICK = "TTL 2 x 2, no plain"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "takeover", QUICK)
    ap.add_argument("--ttls", default="5,15,30", help="lease_ttl_s values (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=10, help="kills per TTL (default %(default)s)")
    ap.add_argument("--at-most-once", action="store_true", help="also measure OutcomeUnknown at the first TTL")
    ap.add_argument("--plain", action=argparse.BooleanOptionalAction, default=True,
                    help="measure plain Celery too (default on)")
    ap.add_argument("--guarded", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the guard (default on)")
    ap.add_argument("--plain-repeats", type=int, default=3, help="kills for plain Celery (default %(default)s)")
    ap.add_argument("--plain-visibility", type=float, default=60, help="visibility_timeout for plain (default 60)")
    ap.add_argument("--plain-timeout", type=float, default=240, help="give up on a plain redelivery after (s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.ttls, args.repeats, args.plain, args.at_most_once = "2", 2, False, False
    ttls = [float(t) for t in args.ttls.split(",") if t]
    logdir = Path(tempfile.mkdtemp(prefix="aaa-bench-takeover-"))
    rows = []
    with redis_server() as srv:
        if args.guarded:
            for ttl in ttls:
                rows.append(run_mode("guarded", ttl, args.repeats, args, logdir, srv))
            if args.at_most_once:
                rows.append(run_mode("at_most_once", ttls[0], args.repeats, args, logdir, srv))
        if args.plain:
            rows.append(run_mode("plain", None, args.plain_repeats, args, logdir, srv))
    text = report(rows, args.plain_visibility)
    print()
    print(text)
    path = write_json(args.out, {"config": vars(args), "rows": rows, "table": text,
                                 "default_visibility": {"visibility_timeout_s": DEFAULT_VISIBILITY_S,
                                                        "worst_case_s": DEFAULT_VISIBILITY_S + SWEEP_PERIOD_S},
                                 "worker_logs": str(logdir)})
    print(f"\nwrote {path}; worker logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
