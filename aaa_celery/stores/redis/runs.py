"""Run records in the Redis store (see :mod:`..runs`), Redis Cluster safe.

A run's key is ``<tenant>:<run id>`` (:func:`~aaa_celery.stores.runs.run_key`). Its keys
and its shard's indexes carry one hash tag: the run's shard is ``crc32(key) % shards`` and
its tag ``{<prefix>:r<shard>}``, so each script touches one hash slot. Keys, with ``<t>``
the shard's ``<prefix>:{<prefix>:r<shard>}``:

- ``<t>:run:<key>``: the record (JSON); ``...:events`` (a list, event ``seq`` n at
  index n-1), ``...:turns`` (a hash, turn -> answer), ``...:decisions`` (a hash,
  ``<call_id> <digest>`` -> decision), ``...:lease`` (the holder, with a TTL);
- ``<t>:runs`` and ``<t>:runs:<tenant as JSON>``: the shard's runs by start time
  (sorted sets), ``<t>:active``: the shard's runs still going (a set);
- ``<t'>:named:<run_id>``: the keys of every tenant's run with that run id (in the
  shard of the run id, so written apart from the run's own keys).

A finished run's keys expire after the store's ``retention_s``; index entries of
expired runs are dropped when a read or ``purge_runs`` meets them. Listing merges
the shards' indexes, newest first, a page at a time.
"""

from __future__ import annotations

import heapq
import itertools
import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from ..base import wrap_errors
from ..runs import FINISHED, RunJournal, RunRecord, RunRecords, dumps, tenant_key
from .client import ERRORS

_PAGE = 200


class RedisRuns(RunRecords, RunJournal):
    """The run-record operations of :class:`~aaa_celery.stores.redis.RedisStore`."""

    key_prefix: str
    shards: int
    retention_s: int
    kind: str
    _redis: Any

    def _script(self, name: str) -> Any:
        raise NotImplementedError  # the store's: lua/<name>.lua, registered on first use

    def _run_tag(self, shard: int) -> str:
        return f"{self.key_prefix}:{{{self.key_prefix}:r{shard}}}"

    def shard(self, call_id: str) -> int:
        """The shard of a call, or of a run by its key: a hash that every worker computes alike."""
        return zlib.crc32(call_id.encode("utf-8")) % self.shards

    def _run_key(self, key: str, part: str = "") -> str:
        base = f"{self._run_tag(self.shard(key))}:run:{key}"
        return f"{base}:{part}" if part else base

    def _named(self, run_id: str) -> str:
        """The set of the keys of every tenant's run with this run id (in the shard of the run id)."""
        return f"{self._run_tag(self.shard(run_id))}:named:{run_id}"

    def _run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        with wrap_errors(self.kind, *ERRORS):
            return self._script(name)(keys=keys, args=args, client=self._redis)

    def _pipe(self, fill: Any) -> list[Any]:
        with wrap_errors(self.kind, *ERRORS):
            pipe = self._redis.pipeline(transaction=False)
            fill(pipe)
            return pipe.execute()  # type: ignore[no-any-return]

    def _read_runs(self, keys: Sequence[str]) -> list[RunRecord | None]:
        def fill(pipe: Any) -> None:
            for key in keys:
                pipe.get(self._run_key(key))
                pipe.llen(self._run_key(key, "events"))
                pipe.get(self._run_key(key, "lease"))

        replies = self._pipe(fill) if keys else []
        out: list[RunRecord | None] = []
        for n in range(len(keys)):
            raw, count, holder = replies[3 * n: 3 * n + 3]
            out.append(RunRecord.from_json(raw, events=int(count), holder=holder) if raw else None)
        return out

    def put_run(self, record: RunRecord) -> None:
        key = record.key
        tag = self._run_tag(self.shard(key))
        keys = [self._run_key(key), f"{tag}:runs:{tenant_key(record.tenant)}", f"{tag}:runs",
                f"{tag}:active", *(self._run_key(key, p) for p in ("events", "turns", "decisions"))]
        self._run_script("run_put", keys, [key, record.to_json(), repr(record.started_at),
                                           "1" if record.active else "0", self.retention_s])
        if record.active:  # the lookup by run id alone (another slot: its own command)
            self._pipe(lambda pipe: pipe.sadd(self._named(record.run_id), key))

    def get_run(self, key: str) -> RunRecord | None:
        return self._read_runs([key])[0]

    def find_runs(self, run_id: str) -> list[RunRecord]:
        keys = sorted(self._pipe(lambda pipe: pipe.smembers(self._named(run_id)))[0])
        found = [r for r in self._read_runs(keys) if r is not None and r.run_id == run_id]
        if len(found) < len(keys):  # drop the keys of runs that expired
            gone = set(keys) - {r.key for r in found}
            self._pipe(lambda pipe: pipe.srem(self._named(run_id), *gone))
        return found

    def _newest_first(self, key: str, top: str, bottom: str, page: int) -> Iterator[tuple[float, str]]:
        """The ``(score, member)`` entries of sorted set ``key`` scored from ``top`` down to
        ``bottom``, highest first, read ``page`` at a time."""
        offset = 0
        while True:
            with wrap_errors(self.kind, *ERRORS):
                found = self._redis.zrevrangebyscore(key, top, bottom, start=offset, num=page, withscores=True)
            yield from ((score, member) for member, score in found)
            if len(found) < page:
                return
            offset += len(found)

    def _shard_page(self, key: str, before: tuple[float, str] | None) -> Iterator[tuple[float, str]]:
        """A shard index's entries older than ``before``, newest first."""
        entries = self._newest_first(key, "+inf" if before is None else repr(before[0]), "-inf", _PAGE)
        return (entry for entry in entries if before is None or entry < tuple(before))

    def list_runs(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False,
                  limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]:
        if active:  # the active sets are small: read them whole
            ids = [i for found in self._pipe(lambda pipe: [pipe.smembers(f"{self._run_tag(n)}:active")
                                                             for n in range(self.shards)]) for i in found]
            records = [r for r in self._read_runs(ids) if r is not None and r.active
                       and (all_tenants or r.tenant == tenant)
                       and (before is None or r.cursor < tuple(before))]
            records.sort(key=lambda r: r.cursor, reverse=True)
            return records[:limit]
        index = "runs" if all_tenants else f"runs:{tenant_key(tenant)}"
        # each shard's page is newest (highest (started_at, key)) first
        merged = heapq.merge(*(self._shard_page(f"{self._run_tag(n)}:{index}", before) for n in range(self.shards)),
                             reverse=True)
        out: list[RunRecord] = []
        while len(out) < limit and (batch := list(itertools.islice(merged, limit - len(out)))):
            out += [record for record in self._read_runs([i for _, i in batch]) if record is not None]
        return out

    def append_run_events(self, key: str, events: Sequence[dict[str, Any]]) -> None:
        if events:
            args = [x for e in events for x in (e["seq"], dumps(e))]
            self._run_script("run_append", [self._run_key(key, "events"), self._run_key(key)], args)

    def run_events(self, key: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        end = -1 if limit is None else max(0, after) + limit - 1
        if limit == 0:
            return []
        raw = self._pipe(lambda pipe: pipe.lrange(self._run_key(key, "events"), max(0, after), end))[0]
        return [json.loads(e) for e in raw]

    def record_turn(self, key: str, turn: int, response: dict[str, Any]) -> dict[str, Any]:
        raw = self._run_script("run_turn", [self._run_key(key, "turns"), self._run_key(key)], [turn, dumps(response)])
        recorded: dict[str, Any] = response if raw is None else json.loads(raw)
        return recorded

    def recorded_turn(self, key: str, turn: int) -> dict[str, Any] | None:
        raw = self._pipe(lambda pipe: pipe.hget(self._run_key(key, "turns"), str(turn)))[0]
        return json.loads(raw) if raw else None

    def decide_approval(self, key: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool:
        keys = [self._run_key(key, "decisions"), self._run_key(key)]
        return bool(self._run_script("run_decide", keys, [f"{call_id} {digest}", dumps(decision)]))

    def approval_decision(self, key: str, call_id: str, digest: str) -> dict[str, Any] | None:
        raw = self._pipe(lambda pipe: pipe.hget(self._run_key(key, "decisions"), f"{call_id} {digest}"))[0]
        return json.loads(raw) if raw else None

    def lease_run(self, key: str, holder: str, ttl_s: float) -> bool:
        keys = [self._run_key(key, "lease"), self._run_key(key)]
        return bool(self._run_script("run_lease", keys, [holder, max(1, round(ttl_s * 1000))]))

    def release_run(self, key: str, holder: str) -> None:
        self._run_script("run_release", [self._run_key(key, "lease")], [holder])

    def _drop(self, key: str, record: RunRecord | None) -> None:
        tag = self._run_tag(self.shard(key))

        def fill(pipe: Any) -> None:
            for part in ("", "events", "turns", "decisions", "lease"):
                pipe.delete(self._run_key(key, part))
            pipe.zrem(f"{tag}:runs", key)
            if record is not None:
                pipe.zrem(f"{tag}:runs:{tenant_key(record.tenant)}", key)
            pipe.srem(f"{tag}:active", key)

        self._pipe(fill)
        if record is not None:
            self._pipe(lambda pipe: pipe.srem(self._named(record.run_id), key))

    def forget_run(self, key: str) -> None:
        self._drop(key, self.get_run(key))

    def purge_runs(self, before: float) -> int:
        purged = 0
        for shard in range(self.shards):
            key = f"{self._run_tag(shard)}:runs"
            ids = self._pipe(lambda pipe, key=key: pipe.zrangebyscore(key, "-inf", repr(before)))[0]
            for start in range(0, len(ids), _PAGE):
                page = ids[start:start + _PAGE]
                for run, record in zip(page, self._read_runs(page), strict=True):
                    if record is None:  # its keys expired with the retention: drop its index entries
                        self._pipe(lambda pipe, run=run, key=key: pipe.zrem(key, run))
                    elif record.status in FINISHED and record.updated_at < before:
                        self._drop(run, record)
                        purged += 1
        return purged
