"""Commands per Redis store operation, from the server's ``INFO commandstats``.

Each path is run ``--calls`` times on a fresh throwaway ``redis-server``, with
``CONFIG RESETSTAT`` before it; the counts are the server's, so they hold on a loaded
machine. ``EVALSHA`` is the round trips (one per script run), the rest the
``redis.call``s its scripts made.

    python -m benchmarks.redis_calls [--calls 200]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from aaa_celery.config import GuardConfig
from aaa_celery.lifecycle import CallSpec, Claimed, Outcome
from aaa_celery.stores.redis import RedisStore
from aaa_celery.testing.redis_server import ThrowawayRedis


#: Commands of the measurement and of a connection's first use, not of an operation.
_SETUP = ("config|resetstat", "info", "hello", "script|load", "client|setinfo")


def _stats(client: Any) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in client.info("commandstats").items()
            if name.startswith("cmdstat_") and name.removeprefix("cmdstat_") not in _SETUP}


def _measure(store: RedisStore, calls: int, prepare: Callable[[int], Any], run: Callable[[int, Any], Any]
             ) -> dict[str, float]:
    client = store._redis
    ready = [prepare(n) for n in range(calls)]
    client.config_resetstat()
    for n in range(calls):
        run(n, ready[n])
    stats = _stats(client)
    per = {name: count / calls for name, count in sorted(stats.items())}
    per["commands (without EVALSHA)"] = sum(c for name, c in stats.items() if name != "evalsha") / calls
    return per


def paths(store: RedisStore, calls: int) -> dict[str, dict[str, float]]:
    config = GuardConfig()
    spec = lambda n, tag: CallSpec(f"{tag}-{n}", "tool", f"key-{tag}-{n}",  # noqa: E731
                                   {"message": {"task": "t", "args": [n]}})
    out: dict[str, dict[str, float]] = {}

    def registered(tag: str) -> Callable[[int], CallSpec]:
        def prepare(n: int) -> CallSpec:
            store.register(spec(n, tag))
            return spec(n, tag)
        return prepare

    out["register"] = _measure(store, calls, lambda n: spec(n, "reg"), lambda n, s: store.register(s))
    out["begin, fresh registered call"] = _measure(
        store, calls, registered("fresh"), lambda n, s: store.begin(s, "w1", config))

    def claimed(tag: str) -> Callable[[int], Any]:
        def prepare(n: int) -> Any:
            s = registered(tag)(n)
            begun = store.begin(s, "w1", config, token=f"tok-{tag}-{n}")
            assert isinstance(begun, Claimed)
            return s, begun.lease
        return prepare

    out["finish, completed call"] = _measure(
        store, calls, claimed("done"), lambda n, sl: store.finish(sl[1], Outcome.success({"n": n}), config))
    out["begin, the token of the last claim again, its reply received (no runner path)"] = _measure(
        store, calls, claimed("again"), lambda n, sl: store.begin(sl[0], "w1", config, token=f"tok-again-{n}"))
    out["begin, redelivered while running (busy)"] = _measure(
        store, calls, claimed("busy"), lambda n, sl: store.begin(sl[0], "w2", config))

    def finished(n: int) -> Any:
        s, lease = claimed("fin")(n)
        store.finish(lease, Outcome.success(n), config)
        return s
    out["begin, redelivered after its result"] = _measure(
        store, calls, finished, lambda n, s: store.begin(s, "w2", config))

    def lapsed(tag: str) -> Callable[[int], CallSpec]:
        def prepare(n: int) -> CallSpec:
            s, lease = claimed(tag)(n)
            store.release(lease)  # the attempt counts as lost, as a lapsed lease
            return s
        return prepare
    out["begin, redelivered after a lost attempt"] = _measure(
        store, calls, lapsed("lost"), lambda n, s: store.begin(s, "w2", config))
    out["claim_recovery, first republish"] = _measure(
        store, calls, lapsed("rec"), lambda n, s: store.claim_recovery(s.call_id, "w3", 1.0, 60.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    server = ThrowawayRedis()
    try:
        store = RedisStore(server.url)
        try:
            found = paths(store, args.calls)
        finally:
            store.close()
    finally:
        server.stop()
    if args.json:
        print(json.dumps(found, indent=2))
        return
    for path, per in found.items():
        detail = ", ".join(f"{name} {count:g}" for name, count in per.items() if not name.startswith("commands"))
        print(f"{path}: {per['evalsha']:g} round trip(s), {per['commands (without EVALSHA)']:g} commands ({detail})")


if __name__ == "__main__":
    main()
