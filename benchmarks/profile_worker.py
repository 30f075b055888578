"""Where a real worker's CPU goes: a ``celery worker`` run under ``py-spy record``.

Starts a broker and a store ``redis-server``, then one ``celery worker`` (``-P prefork -c 2``
or ``-P threads -c 8``) launched by ``py-spy record --subprocesses`` (py-spy cannot attach
to a running process on this machine, so it starts the worker). It drains N calls of one
variant (published to a staging list, then ``RENAME``d onto the queue, as ``overhead.py``
does), stops the worker by its PID and prints the worker's CPU per call, the store's
round trips per call, and the functions that held the CPU: py-spy samples only threads
that are running (no ``--idle``), so a function's share of the samples is its share of
the worker's CPU.

    python benchmarks/profile_worker.py --pool prefork --variant guarded --calls 5000
    python benchmarks/profile_worker.py --pool threads --variant plain --calls 5000
    python benchmarks/profile_worker.py --pool threads --variant guarded --calls 5000 --strace
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, children, commandstats, cpu_seconds, delta, redis_server, wait_until  # noqa: E402
from benchmarks.overhead import POOLS, QUEUE, STAGING, VARIANTS, publish, round_trips  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", choices=sorted(POOLS), default="prefork")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="guarded")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default %(default)s)")
    ap.add_argument("--strace", action="store_true",
                    help="count the worker's system calls (strace -f -c) instead of sampling its stacks; "
                         "startup is included, so compare two variants run with the same --calls")
    args = ap.parse_args(argv)
    import redis

    out = Path(tempfile.mkdtemp(prefix="aaa-profile-worker-")) / "raw.txt"
    with redis_server(appendonly=False) as broker_srv, redis_server() as store_srv:
        env = {"BENCH_BROKER": broker_srv.url, "BENCH_BACKEND": broker_srv.url[:-1] + "1",
               "BENCH_STORE": store_srv.url, "BENCH_QUEUE": QUEUE}
        os.environ.update(env)  # before bench_app is imported: it reads them
        from benchmarks import bench_app

        kind, conc = POOLS[args.pool]
        tracer = (["strace", "-f", "-c", "-S", "calls", "-o", str(out)] if args.strace else
                  ["py-spy", "record", "--subprocesses", "--nonblocking", "-r", str(args.rate), "-f", "raw",
                   "-o", str(out), "--"])
        cmd = [*tracer, sys.executable, "-m", "celery", "-A", "benchmarks.bench_app", "worker",
               "-P", kind, "-c", str(conc), "-n", f"prof-{os.getpid()}@localhost", "--without-heartbeat",
               "--without-mingle", "--without-gossip", "-l", "WARNING", "-Q", QUEUE]
        spy = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            broker, results = redis.Redis.from_url(env["BENCH_BROKER"]), redis.Redis.from_url(env["BENCH_BACKEND"])
            store = redis.Redis.from_url(store_srv.url)
            for tag, n in (("warm", 200), ("run", args.calls)):
                results.flushdb()
                before_publish = commandstats(store)
                publish(bench_app.app, args.variant, n, tag)
                assert wait_until(lambda: broker.llen(STAGING) == n, 30), "staging list incomplete"
                worker = children(spy.pid)[0]
                before, cpu = commandstats(store), cpu_seconds(worker)
                published = round_trips(delta(before, before_publish)) / n
                broker.rename(STAGING, QUEUE)
                assert wait_until(lambda: results.dbsize() >= n, 600, 0.01), "drain incomplete"
            cpu = cpu_seconds(worker) - cpu
            drained = round_trips(delta(commandstats(store), before)) / n
        finally:
            for pid in children(spy.pid):  # the worker; py-spy writes its file when it exits
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
    print(f"{args.pool} {args.variant}: worker CPU {cpu / args.calls * 1e3:.3f} ms/call (warm-up excluded); "
          f"store round trips/call {drained:.2f} in the worker + {published:.2f} at publish")
    if args.strace:
        print(f"\nsystem calls of the whole run (startup and warm-up included), per call of the {args.calls}:")
        for line in out.read_text().splitlines()[2:]:
            fields = line.split()
            if len(fields) >= 5 and fields[3].isdigit():
                print(f"  {int(fields[3]) / args.calls:8.2f}  {fields[-1]}")
    else:
        report(out, args.top)
    return 0


def report(path: Path, top: int) -> None:
    """Own and inclusive shares of the samples, per function (whole run: startup included)."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            incl[frame] += n
    print(f"\n{total} samples; own share (top {top}):")
    for frame, n in own.most_common(top):
        print(f"  {n / total:6.1%}  {frame}")
    print(f"\ninclusive share (top {top}):")
    for frame, n in incl.most_common(top):
        print(f"  {n / total:6.1%}  {frame}")


if __name__ == "__main__":
    sys.exit(main())
