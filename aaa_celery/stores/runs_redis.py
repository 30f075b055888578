"""Run records in the Redis store (see :mod:`.runs`), Redis Cluster safe.

A run's keys and its shard's indexes carry one hash tag: the run's shard is
``crc32(run_id) % shards`` and its tag ``{<prefix>:r<shard>}``, so each script
touches one hash slot. Keys, with ``<t>`` the shard's ``<prefix>:{<prefix>:r<shard>}``:

- ``<t>:run:<run_id>``: the record (JSON); ``...:events`` (a list, event ``seq`` n at
  index n-1), ``...:turns`` (a hash, turn -> answer), ``...:decisions`` (a hash,
  ``<call_id> <digest>`` -> decision), ``...:lease`` (the holder, with a TTL);
- ``<t>:runs`` and ``<t>:runs:<tenant as JSON>``: the shard's runs by start time
  (sorted sets), ``<t>:active``: the shard's runs still going (a set).

A finished run's keys expire after the store's ``retention_s``; index entries of
expired runs are dropped when a read or ``purge_runs`` meets them. Listing merges
the shards' indexes, newest first, a page at a time.
"""

from __future__ import annotations

import heapq
import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from .base import wrap_errors
from .runs import FINISHED, RunRecord, RunRecords, dumps, tenant_key

_PAGE = 200


class _Newest:
    """A sort key that puts the newest ``(started_at, run_id)`` first."""

    __slots__ = ("entry",)

    def __init__(self, entry: tuple[float, str]) -> None:
        self.entry = entry

    def __lt__(self, other: _Newest) -> bool:
        return self.entry > other.entry


class RedisRuns(RunRecords):
    """The run-record operations of :class:`~aaa_celery.stores.redis.RedisStore`."""

    key_prefix: str
    shards: int
    retention_s: int
    kind: str
    _scripts: dict[str, Any]
    _redis: Any

    def _run_tag(self, shard: int) -> str:
        return f"{self.key_prefix}:{{{self.key_prefix}:r{shard}}}"

    def _run_shard(self, run_id: str) -> int:
        return zlib.crc32(run_id.encode("utf-8")) % self.shards

    def _run_key(self, run_id: str, part: str = "") -> str:
        base = f"{self._run_tag(self._run_shard(run_id))}:run:{run_id}"
        return f"{base}:{part}" if part else base

    def _run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        from .redis import _ERRORS, _lua

        with wrap_errors(self.kind, *_ERRORS):
            client = self._redis
            script = self._scripts.get(name)
            if script is None:
                script = self._scripts[name] = client.register_script(_lua(name))
            return script(keys=keys, args=args, client=client)

    def _pipe(self, fill: Any) -> list[Any]:
        from .redis import _ERRORS

        with wrap_errors(self.kind, *_ERRORS):
            pipe = self._redis.pipeline(transaction=False)
            fill(pipe)
            return pipe.execute()  # type: ignore[no-any-return]

    def _read_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        def fill(pipe: Any) -> None:
            for run_id in run_ids:
                pipe.get(self._run_key(run_id))
                pipe.llen(self._run_key(run_id, "events"))
                pipe.get(self._run_key(run_id, "lease"))

        replies = self._pipe(fill) if run_ids else []
        out: list[RunRecord | None] = []
        for n in range(len(run_ids)):
            raw, count, holder = replies[3 * n: 3 * n + 3]
            out.append(RunRecord.from_json(raw, events=int(count), holder=holder) if raw else None)
        return out

    def put_run(self, record: RunRecord) -> None:
        tag = self._run_tag(self._run_shard(record.run_id))
        keys = [self._run_key(record.run_id), f"{tag}:runs:{tenant_key(record.tenant)}", f"{tag}:runs",
                f"{tag}:active", *(self._run_key(record.run_id, p) for p in ("events", "turns", "decisions"))]
        self._run_script("run_put", keys, [record.run_id, record.to_json(), repr(record.started_at),
                                           "1" if record.active else "0", self.retention_s])

    def get_run(self, run_id: str) -> RunRecord | None:
        return self._read_runs([run_id])[0]

    def _shard_page(self, key: str, before: tuple[float, str] | None) -> Iterator[tuple[float, str]]:
        """A shard index's entries older than ``before``, newest first, a page at a time."""
        top, offset = ("+inf" if before is None else repr(before[0])), 0
        while True:
            page = self._pipe(lambda pipe: pipe.zrevrangebyscore(key, top, "-inf", start=offset, num=_PAGE,
                                                                   withscores=True))[0]
            for run_id, score in page:
                if before is None or (score, run_id) < tuple(before):
                    yield score, run_id
            if len(page) < _PAGE:
                return
            offset += len(page)

    def list_runs(self, *, tenant: str | None = None, all_tenants: bool = False, active: bool = False,
                  limit: int = 50, before: tuple[float, str] | None = None) -> list[RunRecord]:
        if active:  # the active sets are small: read them whole
            ids = [i for found in self._pipe(lambda pipe: [pipe.smembers(f"{self._run_tag(n)}:active")
                                                             for n in range(self.shards)]) for i in found]
            records = [r for r in self._read_runs(ids) if r is not None and r.active
                       and (all_tenants or r.tenant == tenant)
                       and (before is None or (r.started_at, r.run_id) < tuple(before))]
            records.sort(key=lambda r: (r.started_at, r.run_id), reverse=True)
            return records[:limit]
        index = "runs" if all_tenants else f"runs:{tenant_key(tenant)}"
        merged = heapq.merge(*(self._shard_page(f"{self._run_tag(n)}:{index}", before) for n in range(self.shards)),
                             key=_Newest)
        out: list[RunRecord] = []
        while len(out) < limit:
            batch = [entry for _, entry in zip(range(limit - len(out)), merged, strict=False)]
            if not batch:
                break
            for (_, run_id), record in zip(batch, self._read_runs([i for _, i in batch]), strict=True):
                if record is not None:
                    out.append(record)
        return out

    def append_run_events(self, run_id: str, events: Sequence[dict[str, Any]]) -> None:
        if events:
            args = [x for e in events for x in (e["seq"], dumps(e))]
            self._run_script("run_append", [self._run_key(run_id, "events"), self._run_key(run_id)], args)

    def run_events(self, run_id: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        end = -1 if limit is None else max(0, after) + limit - 1
        if limit == 0:
            return []
        raw = self._pipe(lambda pipe: pipe.lrange(self._run_key(run_id, "events"), max(0, after), end))[0]
        return [json.loads(e) for e in raw]

    def record_turn(self, run_id: str, turn: int, response: dict[str, Any]) -> dict[str, Any]:
        key = self._run_key(run_id, "turns")

        def fill(pipe: Any) -> None:
            pipe.hsetnx(key, str(turn), dumps(response))
            pipe.hget(key, str(turn))
            pipe.ttl(self._run_key(run_id))

        _, raw, ttl = self._pipe(fill)
        if ttl and ttl > 0:
            self._pipe(lambda pipe: pipe.expire(key, ttl))
        return json.loads(raw)  # type: ignore[no-any-return]

    def recorded_turn(self, run_id: str, turn: int) -> dict[str, Any] | None:
        raw = self._pipe(lambda pipe: pipe.hget(self._run_key(run_id, "turns"), str(turn)))[0]
        return json.loads(raw) if raw else None

    def decide_approval(self, run_id: str, call_id: str, digest: str, decision: dict[str, Any]) -> bool:
        keys = [self._run_key(run_id, "decisions"), self._run_key(run_id)]
        return bool(self._run_script("run_decide", keys, [f"{call_id} {digest}", dumps(decision)]))

    def approval_decision(self, run_id: str, call_id: str, digest: str) -> dict[str, Any] | None:
        raw = self._pipe(lambda pipe: pipe.hget(self._run_key(run_id, "decisions"), f"{call_id} {digest}"))[0]
        return json.loads(raw) if raw else None

    def lease_run(self, run_id: str, holder: str, ttl_s: float) -> bool:
        keys = [self._run_key(run_id, "lease"), self._run_key(run_id)]
        return bool(self._run_script("run_lease", keys, [holder, max(1, round(ttl_s * 1000))]))

    def release_run(self, run_id: str, holder: str) -> None:
        self._run_script("run_release", [self._run_key(run_id, "lease")], [holder])

    def _drop(self, run_id: str, tenant: str | None) -> None:
        tag = self._run_tag(self._run_shard(run_id))

        def fill(pipe: Any) -> None:
            for part in ("", "events", "turns", "decisions", "lease"):
                pipe.delete(self._run_key(run_id, part))
            pipe.zrem(f"{tag}:runs", run_id)
            pipe.zrem(f"{tag}:runs:{tenant_key(tenant)}", run_id)
            pipe.srem(f"{tag}:active", run_id)

        self._pipe(fill)

    def forget_run(self, run_id: str) -> None:
        record = self.get_run(run_id)
        self._drop(run_id, record.tenant if record is not None else None)

    def purge_runs(self, before: float) -> int:
        purged = 0
        for shard in range(self.shards):
            key = f"{self._run_tag(shard)}:runs"
            ids = self._pipe(lambda pipe, key=key: pipe.zrangebyscore(key, "-inf", repr(before)))[0]
            for start in range(0, len(ids), _PAGE):
                page = ids[start:start + _PAGE]
                for run_id, record in zip(page, self._read_runs(page), strict=True):
                    if record is None:  # its keys expired with the retention: drop its index entries
                        self._pipe(lambda pipe, run_id=run_id, key=key: pipe.zrem(key, run_id))
                    elif record.status in FINISHED and record.updated_at < before:
                        self._drop(run_id, record.tenant)
                        purged += 1
        return purged
