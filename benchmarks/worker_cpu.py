"""Worker CPU per call on a durable PostgreSQL store, split by process, with py-spy if asked.

One ``celery worker -P prefork -c 2`` on ``benchmarks.bench_app`` drains N calls of one
variant (``guarded`` or ``plain``) published beforehand; prints the CPU per call of the
worker's main process and of its pool children (``/proc``), the PostgreSQL server's CPU
and its transactions per call. ``--spy`` records each process with ``py-spy record -f raw``
into ``/tmp/aaa-worker-cpu/`` (collapsed stacks: sum them per frame to read a profile).

    python benchmarks/worker_cpu.py 1000 guarded
    python benchmarks/worker_cpu.py 1000 plain
    python benchmarks/worker_cpu.py 2000 guarded --spy
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from contextlib import ExitStack
from benchmarks._common import CLK_TCK, DurablePostgres, Worker, _stat, children, redis_server, wait_until  # noqa: E402
from benchmarks import overhead as ov  # noqa: E402

OUT = Path('/tmp/aaa-worker-cpu')

def own_cpu(pid):
    st = _stat(pid)
    return (int(st[11]) + int(st[12])) / CLK_TCK

def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    variant = sys.argv[2] if len(sys.argv) > 2 else "guarded"
    spy = "--spy" in sys.argv
    import redis

    OUT.mkdir(exist_ok=True)
    with ExitStack() as stack:
        broker_srv = stack.enter_context(redis_server(appendonly=False))
        pg = DurablePostgres.start(); stack.callback(pg.stop)
        env = {"BENCH_BROKER": broker_srv.url, "BENCH_BACKEND": broker_srv.url[:-1] + "1",
               "BENCH_STORE": pg.url, "BENCH_QUEUE": ov.QUEUE}
        os.environ.update(env)
        from benchmarks import bench_app
        app = bench_app.app
        broker = redis.Redis.from_url(env["BENCH_BROKER"]); results = redis.Redis.from_url(env["BENCH_BACKEND"])
        stats = ov.PostgresStats(pg)
        w = Worker(env, "prefork", 2, queues=ov.QUEUE, name="prof", log=OUT / "worker.log")
        stack.callback(w.stop)
        ov.one_round(app, w, variant, 200, "warm", broker, results, stats, 60)
        results.flushdb()
        ov.publish(app, variant, n, "run")
        kids = children(w.pid)
        before = {p: own_cpu(p) for p in [w.pid, *kids]}
        pgcpu0 = stats.info("cpu")["used_cpu_user"]; x0 = ov.commandstats(stats)["xact"]
        procs = []
        if spy:
            for p in [w.pid, *kids]:
                procs.append(subprocess.Popen(["/work/venv/bin/py-spy", "record", "-p", str(p), "-r", "200", "--nonblocking",
                    "-f", "raw", "-o", str(OUT / f"spy-{variant}-{p}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        broker.rename(ov.STAGING, ov.QUEUE)
        t0 = time.perf_counter()
        assert wait_until(lambda: results.dbsize() >= n, 300, 0.005)
        dt = time.perf_counter() - t0
        after = {p: own_cpu(p) for p in before}
        pgcpu = stats.info("cpu")["used_cpu_user"] - pgcpu0; xacts = ov.commandstats(stats)["xact"] - x0
        for pr in procs:
            pr.send_signal(signal.SIGINT)
        for pr in procs:
            pr.wait(30)
        print(f"{variant}: {n/dt:.0f} calls/s; main CPU {(after[w.pid]-before[w.pid])/n*1e3:.3f} ms/call; "
              f"children CPU {sum(after[p]-before[p] for p in kids)/n*1e3:.3f} ms/call; pg server CPU {pgcpu/n*1e3:.3f} ms/call; xacts/call {xacts/n:.2f}")
if __name__ == "__main__":
    main()
