"""Where the broker holds a call's message: kombu's Redis transport, read in one script.

A call that was registered but never claimed is either waiting (in a queue, or taken
by a worker that has not started it yet) or lost (the broker dropped it, or a worker
popped it and died before kombu recorded it as unacked). Only a lost one needs a copy.
Over the Redis transport both places are plain keys: each queue is a list (one more per
priority step, ``<queue><sep><step>``) and the messages that workers took and have not
acked are in the ``unacked`` hash (with ``acks_late``, until the task ends). One Lua
script (``lua/find_messages.lua``) reads them at one instant, so the sweeper tells a
queued message from a lost one without racing the broker. The transport's
``global_keyprefix``, ``sep``, ``priority_steps``, ``unacked_key`` and ``unacked_index_key``
options are honoured. :meth:`RedisBrokerProbe.taken_before` lists the messages workers
took long ago and never acked, for the calls the store never heard of.
Other brokers (RabbitMQ) cannot be read like this: see ``docs/recovery.md``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any, cast

#: A message of the task waits in a queue.
QUEUED = 2
#: A worker took it and has not acked it (it runs, waits for its ``eta``, or is prefetched).
TAKEN = 1
#: The broker has it nowhere.
ABSENT = 0
#: A queue was too long to read whole, and the message was not in the part read.
UNKNOWN = -1

#: kombu's Redis transport defaults (``kombu.transport.redis.Channel``).
_SEP = "\x06\x16"
_PRIORITY_STEPS = (0, 3, 6, 9)
_UNACKED = "unacked"
#: The most messages the script reads from one list, its oldest (a longer backlog: the
#: calls not found there are UNKNOWN). Each look costs the broker about a millisecond per
#: few hundred messages read.
SCAN_LIMIT = 5_000

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _first_url(url: Any) -> str:
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    return str(url or "").split(";")[0].strip()


class RedisBrokerProbe:
    """Finds tasks' messages in a Redis broker (see the module doc).

    Args:
        url: the broker URL (``redis://``, ``rediss://`` or ``unix://``).
        transport_options: the app's ``broker_transport_options``.
        scan_limit: the most messages read from one queue list per probe.
    """

    def __init__(self, url: str, transport_options: dict[str, Any] | None = None,
                 scan_limit: int = SCAN_LIMIT) -> None:
        import redis

        options = transport_options or {}
        self.prefix = str(options.get("global_keyprefix") or "")
        self.sep = str(options.get("sep") or _SEP)
        self.steps = tuple(options.get("priority_steps") or _PRIORITY_STEPS)
        self.unacked = str(options.get("unacked_key") or _UNACKED)
        self.unacked_index = str(options.get("unacked_index_key") or self.unacked + "_index")
        self.scan_limit = scan_limit
        self._client = redis.Redis.from_url(url, decode_responses=True)
        script = resources.files(__package__).joinpath("lua", "find_messages.lua").read_text("utf-8")
        self._script = self._client.register_script(script)

    @classmethod
    def for_app(cls, app: Any) -> RedisBrokerProbe | None:
        """A probe of ``app``'s broker, or None when the broker is not a Redis server."""
        url = _first_url(app.conf.broker_url)
        if not url.startswith(_REDIS_SCHEMES):
            return None
        return cls(url, dict(app.conf.broker_transport_options or {}))

    def queue_keys(self, queue: str) -> list[str]:
        """The lists of a queue: one per priority step (step 0 is the queue's own name)."""
        names = [queue if not step else f"{queue}{self.sep}{step}" for step in self.steps]
        return [self.prefix + name for name in dict.fromkeys(names)]

    def find(self, task_ids: Sequence[str], queues: Iterable[str]) -> dict[str, int]:
        """Where each task's message is: :data:`QUEUED`, :data:`TAKEN`, :data:`ABSENT` or
        :data:`UNKNOWN`. Raises redis-py's errors when the broker cannot be read."""
        if not task_ids:
            return {}
        keys = [self.prefix + self.unacked]
        for queue in dict.fromkeys(queues):
            keys.extend(self.queue_keys(queue))
        found = self._script(keys=keys, args=[self.scan_limit, *task_ids])
        return {task_id: int(where) for task_id, where in zip(task_ids, found)}

    def taken_before(self, when: float, limit: int = 1000) -> list[tuple[dict[str, Any], str, str]]:
        """Messages that workers took before ``when`` (kombu's ``unacked_index`` score, the
        taking worker's ``time.time()``) and have not acked: (message, exchange, routing
        key) each, oldest first, at most ``limit``."""
        # (redis-py types the reply with every shape it may have; with decode_responses, str)
        tags = cast(list[str], self._client.zrangebyscore(self.prefix + self.unacked_index, "-inf", when,
                                                          start=0, num=limit))
        if not tags:
            return []
        taken = []
        for raw in self._client.hmget(self.prefix + self.unacked, tags):
            try:
                message, exchange, routing_key = json.loads(raw) if raw else (None, "", "")
            except (TypeError, ValueError):
                continue
            if isinstance(message, dict):
                taken.append((message, exchange or "", routing_key or ""))
        return taken

    def close(self) -> None:
        self._client.close()
