"""Ledgers: what tool bodies really did, recorded outside the guard's store.

Two kinds, both in Redis so that every worker process writes to the same place:

* :class:`Ledger` is the simple one for your own tests: a tool appends
  ``ledger.record("start", ctx=ctx)`` and the test reads :meth:`Ledger.entries`.
* :class:`EffectLedger` is the chaos harness's effect ledger, which
  :func:`~aaa_celery.testing.check_history` reads. A workload tool writes, for
  every body execution:

  * ``start``: the body began (call id, attempt/fence from ``ctx``, pid, host, time);
  * ``tick``: the body is still running (written every few tenths of a second), so
    a checker sees when an execution was really executing, including ones the
    guard fenced, a crash cut short, or a ``SIGSTOP`` froze;
  * ``effect``: an attempt to apply the call's external effect under its
    idempotency key; the effect table has a uniqueness constraint on the key
    (Redis ``HSETNX``), so ``applied`` is True for exactly one try per key;
  * ``end``: the body returned ``value`` (written just before it returns).

  Every execution carries an ``exec`` id (a fresh UUID), so two runs of the same
  attempt, or plain-Celery runs without attempt numbers, stay apart.

:class:`EffectLedger` keeps this in Redis (one list of JSON entries, one hash for
the effect table); :class:`MemoryEffectLedger` keeps it in a Python list, for
crafted histories in tests. Both share :class:`BaseEffectLedger`.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any

START, TICK, EFFECT, END = "start", "tick", "effect", "end"

# Every entry (and effect row) is stamped with the Redis server's clock, not the writing
# worker's: one clock for the whole fleet, so a worker whose clock is skewed (the chaos
# harness's clock_skew fault) cannot make two runs look as if they overlapped. The client
# sends the JSON without its closing brace and without "at"; the script appends
# ``,"at":<TIME>}``.
_NOW_LUA = """
local t = redis.call('TIME')
local at = ',"at":' .. t[1] .. '.' .. string.format('%06d', tonumber(t[2])) .. '}'
"""

# KEYS[1] a list; ARGV[1] an entry without "at" and its closing brace.
_PUSH_LUA = _NOW_LUA + """
return redis.call('RPUSH', KEYS[1], ARGV[1] .. at)
"""

# KEYS[1] effect table (hash), KEYS[2] entries (list); ARGV: key, row, entry if applied,
# entry if not (each without "at" and its closing brace). Returns 1 when this try applied the effect.
_APPLY_LUA = _NOW_LUA + """
local applied = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2] .. at)
redis.call('RPUSH', KEYS[2], (applied == 1 and ARGV[3] or ARGV[4]) .. at)
return applied
"""


def _unstamped(entry: dict[str, Any]) -> str:
    """``entry`` as compact JSON without ``at`` and without its closing brace (see _NOW_LUA)."""
    text = json.dumps({k: v for k, v in entry.items() if k != "at"}, separators=(",", ":"))
    return text[:-1]


def _push_stamped(client: Any, key: str, entry: dict[str, Any]) -> None:
    client.eval(_PUSH_LUA, 1, key, _unstamped(entry))


def new_exec_id() -> str:
    return uuid.uuid4().hex[:12]


class BaseEffectLedger:
    """The ledger's interface: append entries, read them back, apply keyed effects."""

    def append(self, entry: dict[str, Any]) -> None:
        raise NotImplementedError

    def entries(self) -> list[dict[str, Any]]:
        """Every entry, in the order written."""
        raise NotImplementedError

    def _setnx(self, key: str, value: str) -> bool:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def now(self) -> float:
        """The ledger's clock (epoch seconds), which stamps its entries."""
        return time.time()

    def close(self) -> None:  # noqa: B027 - optional
        pass

    # -- what a tool body writes --------------------------------------------
    def record(self, kind: str, call_id: str, exec_id: str, *, attempt: int | None = None,
               fence: int | None = None, **fields: Any) -> dict[str, Any]:
        entry = self._entry(kind, call_id, exec_id, attempt=attempt, fence=fence, **fields)
        self.append(entry)
        return entry

    def _entry(self, kind: str, call_id: str, exec_id: str, *, attempt: int | None = None,
               fence: int | None = None, **fields: Any) -> dict[str, Any]:
        return {
            "kind": kind,
            "call_id": call_id,
            "exec": exec_id,
            "attempt": attempt,
            "fence": fence,
            "pid": os.getpid(),
            "host": fields.pop("host", None) or socket.gethostname(),
            "at": time.time(),
            **fields,
        }

    def apply_effect(self, key: str, call_id: str, exec_id: str, *, attempt: int | None = None,
                     fence: int | None = None, **fields: Any) -> bool:
        """Apply the effect under ``key`` once: True if this try applied it, False if a
        previous try already had (a duplicate prevented by the uniqueness constraint)."""
        row = json.dumps({"call_id": call_id, "exec": exec_id, "attempt": attempt, "at": time.time()})
        entry = self._entry(EFFECT, call_id, exec_id, attempt=attempt, fence=fence, key=key, **fields)
        return self._apply(key, row, {**entry, "applied": True}, {**entry, "applied": False})

    def _apply(self, key: str, row: str, if_applied: dict[str, Any], if_not: dict[str, Any]) -> bool:
        """Apply the effect and record the try. A ledger whose body can be interrupted
        between the two (a cancelled attempt) must do both at once; see EffectLedger."""
        applied = self._setnx(key, row)
        self.append(if_applied if applied else if_not)
        return applied


class EffectLedger(BaseEffectLedger):
    """A ledger in Redis: ``<prefix>:entries`` (a list) and ``<prefix>:effects`` (a hash)."""

    def __init__(self, url: str, prefix: str = "aaa:chaos:ledger") -> None:
        import redis

        self.url, self.prefix = url, prefix
        self._pid = os.getpid()
        self._redis = redis.Redis.from_url(url, decode_responses=True)

    def _client(self) -> Any:
        if self._pid != os.getpid():  # forked: never share the parent's sockets
            import redis

            self._pid = os.getpid()
            self._redis = redis.Redis.from_url(self.url, decode_responses=True)
        return self._redis

    def append(self, entry: dict[str, Any]) -> None:
        """Append ``entry``, its ``at`` replaced by the Redis server's clock."""
        _push_stamped(self._client(), f"{self.prefix}:entries", entry)

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self._client().lrange(f"{self.prefix}:entries", 0, -1)]

    def _setnx(self, key: str, value: str) -> bool:
        return bool(self._client().hsetnx(f"{self.prefix}:effects", key, value))

    def _apply(self, key: str, row: str, if_applied: dict[str, Any], if_not: dict[str, Any]) -> bool:
        # One script: a body cancelled between applying the effect and recording the
        # try would otherwise leave an applied effect that the entries never mention.
        keys = [f"{self.prefix}:effects", f"{self.prefix}:entries"]
        # every "at" on the Redis server's clock, like append's
        row = _unstamped(json.loads(row))
        dumps = [_unstamped(e) for e in (if_applied, if_not)]
        return bool(self._client().eval(_APPLY_LUA, 2, *keys, key, row, *dumps))

    def now(self) -> float:
        """The Redis server's clock (``TIME``), which stamps every entry."""
        seconds, micros = self._client().time()
        return float(seconds) + float(micros) / 1e6

    def clear(self) -> None:
        self._client().delete(f"{self.prefix}:entries", f"{self.prefix}:effects")

    def close(self) -> None:
        self._redis.close()


class MemoryEffectLedger(BaseEffectLedger):
    """A ledger in a list, for one process and for crafted histories.

    ``unique=False`` drops the effect table's uniqueness constraint (every try
    applies), which is how a checker test builds an I6 violation.
    """

    def __init__(self, entries: list[dict[str, Any]] | None = None, *, unique: bool = True) -> None:
        self._entries: list[dict[str, Any]] = list(entries or [])
        self._effects: dict[str, dict[str, Any]] = {}
        self.unique = unique

    def append(self, entry: dict[str, Any]) -> None:
        self._entries.append(dict(entry))

    def entries(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self._entries]

    def _setnx(self, key: str, value: str) -> bool:
        if self.unique and key in self._effects:
            return False
        self._effects.setdefault(key, json.loads(value))
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._effects.clear()


# -- the simple ledger for your own tests ----------------------------------------------


class Ledger:
    """An external effect log: a Redis list of JSON entries that tools append to.

    A tool calls ``ledger.record("start", ctx=ctx)`` where its effect begins (and
    again at later points); the test reads :meth:`entries`. Because the list lives
    outside the guard's store, it shows what really ran, including body runs that
    the guard fenced or a crash cut short.
    """

    def __init__(self, url: str, key: str = "aaa:test:ledger") -> None:
        import redis

        self.url, self.key = url, key
        self._redis = redis.Redis.from_url(url, decode_responses=True)

    def record(self, event: str, *, task_id: str | None = None, ctx: Any = None, **fields: Any) -> dict[str, Any]:
        """Append ``{"event", "task_id", "attempt", "pid", "at", ...}`` and return it. The
        stored ``at`` is the Redis server's clock (one clock for every worker); the returned
        entry has this process's."""
        meta = getattr(ctx, "meta", None) or {}
        entry = {
            "event": event,
            "task_id": task_id or meta.get("task_id"),
            "attempt": getattr(ctx, "attempt", None),
            "hostname": meta.get("hostname"),
            "pid": os.getpid(),
            "at": time.time(),
            **fields,
        }
        _push_stamped(self._redis, self.key, entry)  # "at" on the Redis server's clock
        return entry

    def entries(self, task_id: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        """Entries in order, optionally only one call's and one kind."""
        out = [json.loads(raw) for raw in self._redis.lrange(self.key, 0, -1)]
        return [e for e in out if (task_id is None or e["task_id"] == task_id)
                and (event is None or e["event"] == event)]

    def clear(self) -> None:
        self._redis.delete(self.key)

    def close(self) -> None:
        self._redis.close()
