"""Lease and attempt-log backends, selected by URL with :func:`open_store`."""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from ..errors import ConfigError
from .base import Store

#: URL scheme -> "module:Class", imported only when used so drivers stay optional.
BACKENDS: dict[str, str] = {
    "memory": "aaa_celery.stores.memory:MemoryStore",
    "redis": "aaa_celery.stores.redis:RedisStore",
    "rediss": "aaa_celery.stores.redis:RedisStore",
    # Redis Cluster, from one seed node: same store, a RedisCluster client.
    "redis+cluster": "aaa_celery.stores.redis:RedisStore",
    "rediss+cluster": "aaa_celery.stores.redis:RedisStore",
    "postgresql": "aaa_celery.stores.sql.postgres:PostgresStore",
    "postgresql+psycopg": "aaa_celery.stores.sql.postgres:PostgresStore",
    "sqlite": "aaa_celery.stores.sql.sqlite:SQLiteStore",
}


def backend_for(url: str) -> type[Store]:
    """The store class for ``url``'s scheme, with a "did you mean" error for a typo."""
    scheme = url.partition("://")[0].lower() if "://" in url else url.partition(":")[0].lower()
    target = BACKENDS.get(scheme)
    if target is None:
        close = difflib.get_close_matches(scheme, BACKENDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(f"{s}://" for s in BACKENDS)
        raise ConfigError(f"store url: unknown scheme {scheme!r} in {url!r}{hint} Known: {known}")
    module, _, cls = target.partition(":")
    backend: type[Store] = getattr(importlib.import_module(module), cls)
    return backend


def open_store(url: str, **options: Any) -> Store:
    """Open the store at ``url``: ``memory://``, ``redis://…``, ``redis+cluster://…``
    (Redis Cluster, one seed node), ``postgresql+psycopg://…``, or ``sqlite:///path``."""
    store_cls: Any = backend_for(url)
    return store_cls(url, **options)  # type: ignore[no-any-return]


__all__ = ["BACKENDS", "Store", "backend_for", "open_store"]
