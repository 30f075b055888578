"""The Redis store (Redis or Redis Cluster).

Laid out by job: :mod:`.client` (driver errors, connections lent to threads, the
scripts' sources), :mod:`.store` (:class:`RedisStore`: calls, recovery, budgets and
operators' verbs, one Lua script per operation), :mod:`.runs` (run records), and
``lua/``, one script per operation with a KEYS/ARGV header.
"""

from __future__ import annotations

from .client import SOCKET_TIMEOUT_S
from .store import RedisStore

__all__ = ["SOCKET_TIMEOUT_S", "RedisStore"]
