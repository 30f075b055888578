"""Where a guarded call's worker CPU goes: ``GuardedTask.__call__`` in a loop, no broker.

Runs N calls of a trivial guarded task (and of the same task plain) in this process
against a real ``redis-server`` store, each under a pushed Celery request as the worker
would run it, registered first as ``apply_async`` would. Prints the client CPU per call
(this process), the store server's CPU per call (``INFO cpu``), round trips per call
(``INFO commandstats``), and with ``--profile`` the top of a cProfile of the guarded loop.

With ``--stub`` the store answers ``begin`` with a claim and ``finish`` with "accepted"
without any I/O: what is left is the guard's own Python around the body (adapter, runner,
watchdog, events), the figure to watch for regressions on the hot path (21 µs over plain
after issue 10's hot-path pass; 23 µs at 000857b, 41-49 µs before that pass).

    python benchmarks/profile_call.py                # 7 blocks of 1000 calls each way
    python benchmarks/profile_call.py --profile      # + cProfile, sorted by own time
    python benchmarks/profile_call.py --stub         # the guard's Python only, no store I/O
    python benchmarks/profile_call.py --profile --cpu-clock   # cProfile on CPU time, not wall time
    python benchmarks/profile_call.py --publish      # apply_async's register, alone and registered_together

With ``--publish`` it publishes N guarded calls (to a ``memory://`` broker, so every socket
read is the store's) one register each, then inside ``registered_together``, and prints the
store socket reads and the publisher's CPU per call.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import commandstats, delta, redis_server, server_cpu  # noqa: E402


def register(task: Any, n: int, tag: str) -> list[str]:
    """Register n calls as ``apply_async`` would at publish time; returns their ids."""
    from aaa_celery.worker.stores import app_store

    store = app_store(task.app)
    ids = [f"{tag}-{i}" for i in range(n)]
    for i, call_id in enumerate(ids):
        store.register(task.call_spec(call_id, [i], {}, "bench", {}))
    return ids


def loop(task: Any, ids: list[str]) -> float:
    """Run the calls as a worker would, each under a pushed request; returns CPU seconds."""
    t0 = time.process_time()
    for i, call_id in enumerate(ids):
        task.push_request(id=call_id, hostname="prof@localhost", delivery_info={"routing_key": "bench"},
                          called_directly=False, args=[i], kwargs={})
        try:
            assert task(i) == i
        finally:
            task.pop_request()
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000, help="calls per block (default %(default)s)")
    ap.add_argument("--reps", type=int, default=7, help="interleaved plain/guarded blocks (default %(default)s)")
    ap.add_argument("--profile", action="store_true", help="cProfile the guarded loop")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--stub", action="store_true", help="a store without I/O: the guard's own Python only")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="profile on this process's CPU time (blocking waits do not count)")
    ap.add_argument("--publish", action="store_true", help="the publish side: register per call vs batched")
    args = ap.parse_args(argv)
    if args.stub:
        return stub_main(args)
    if args.publish:
        return publish_main(args)
    import redis

    with redis_server() as srv:
        os.environ.update(BENCH_BROKER="memory://", BENCH_STORE=srv.url)
        from benchmarks import bench_app

        app = bench_app.app
        store = redis.Redis.from_url(srv.url)
        guarded, plain = app.tasks["bench.guarded"], app.tasks["bench.plain"]
        loop(guarded, register(guarded, 200, "warm"))  # scripts loaded, imports done
        n, reps = args.calls, args.reps
        plain_us, guarded_us, server_us, evalsha, commands = [], [], [], [], []
        for r in range(reps):  # interleaved blocks: the medians shrug off a noisy neighbour
            plain_us.append(loop(plain, [f"plain{r}-{i}" for i in range(n)]) / n * 1e6)
            ids = register(guarded, n, f"guarded{r}")
            before, cpu_before = commandstats(store), server_cpu(store)
            guarded_us.append(loop(guarded, ids) / n * 1e6)
            server_us.append((server_cpu(store) - cpu_before) / n * 1e6)
            stats = delta(commandstats(store), before)
            evalsha.append(stats.get("evalsha", 0) / n)
            commands.append(sum(v for k, v in stats.items() if k != "info") / n)
        med = statistics.median
        print(f"plain   client CPU {med(plain_us):6.1f} µs/call (min {min(plain_us):.1f})")
        print(f"guarded client CPU {med(guarded_us):6.1f} µs/call (min {min(guarded_us):.1f}); "
              f"store server CPU {med(server_us):.1f} µs/call (min {min(server_us):.1f}); "
              f"EVALSHA/call {med(evalsha):.2f}; redis commands/call {med(commands):.1f}")
        if args.profile:
            ids = register(guarded, n, "profiled")
            prof = cProfile.Profile(time.process_time) if args.cpu_clock else cProfile.Profile()
            prof.enable()
            loop(guarded, ids)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)
    return 0


def stub_main(args: argparse.Namespace) -> int:
    """``--stub``: the same loops, with a store that claims and accepts without any I/O."""
    os.environ.update(BENCH_BROKER="memory://", BENCH_STORE="memory://")
    from aaa_celery.lifecycle import Accepted, Claimed, Lease
    from aaa_celery.stores.memory import MemoryStore
    from aaa_celery.worker.stores import use_store
    from benchmarks import bench_app

    class Stub(MemoryStore):
        def begin(self, call: Any, worker: str, config: Any, token: str | None = None) -> Any:
            return Claimed(Lease(call.call_id, 1, worker, token or "stub", config.lease_ttl_s))

        def finish(self, lease: Any, outcome: Any, config: Any) -> Any:
            return Accepted(outcome)

    app = bench_app.app
    use_store(app, Stub())
    guarded, plain = app.tasks["bench.guarded"], app.tasks["bench.plain"]
    loop(guarded, [f"warm-{i}" for i in range(200)])
    n, plain_us, guarded_us = args.calls, [], []
    for r in range(args.reps):
        plain_us.append(loop(plain, [f"plain{r}-{i}" for i in range(n)]) / n * 1e6)
        guarded_us.append(loop(guarded, [f"guarded{r}-{i}" for i in range(n)]) / n * 1e6)
    med = statistics.median
    print(f"plain   client CPU {med(plain_us):6.1f} µs/call (min {min(plain_us):.1f})")
    print(f"guarded client CPU {med(guarded_us):6.1f} µs/call (min {min(guarded_us):.1f}), stub store: "
          f"{med(guarded_us) - med(plain_us):.1f} µs over plain")
    if args.profile:
        prof = cProfile.Profile(time.process_time) if args.cpu_clock else cProfile.Profile()
        prof.enable()
        loop(guarded, [f"profiled-{i}" for i in range(n)])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


def publish_main(args: argparse.Namespace) -> int:
    """``--publish``: apply_async of N guarded calls, registered one by one, then together."""
    import contextlib
    import socket

    with redis_server() as srv:
        os.environ.update(BENCH_BROKER="memory://", BENCH_STORE=srv.url)
        from aaa_celery.worker import registered_together
        from benchmarks import bench_app

        task = bench_app.app.tasks["bench.guarded"]
        task.apply_async((0,), task_id="warm")  # scripts loaded, imports done
        reads, recv_into = [0], socket.socket.recv_into

        def counted(sock: socket.socket, *a: Any, **kw: Any) -> int:
            reads[0] += 1
            return recv_into(sock, *a, **kw)

        for r in range(args.reps):
            for together in (False, True):
                reads[0], n = 0, args.calls
                socket.socket.recv_into = counted  # type: ignore[method-assign]
                t0 = time.process_time()
                try:
                    with registered_together() if together else contextlib.nullcontext():
                        for i in range(n):
                            task.apply_async((i,), task_id=f"{r}-{together}-{i}")
                finally:
                    socket.socket.recv_into = recv_into  # type: ignore[method-assign]
                cpu = time.process_time() - t0
                print(f"round {r} {'registered_together' if together else 'one register each':19}: "
                      f"store socket reads {reads[0] / n:.3f} per publish, publisher CPU {cpu / n * 1e3:.3f} ms/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
