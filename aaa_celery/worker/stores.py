"""Which store a Celery app uses, opened once per process (after fork)."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any

from celery import Celery

from ..errors import ConfigError, StoreOutdated, StoreUnavailable
from ..stores import Store, open_store
from ..stores.base import StoreVersion, check_version
from .conf import setting
from .setting_names import assignment, spelled

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_opened: dict[tuple[int, str, str], Store] = {}
#: Stores a forked child inherited. Kept referenced, never used or closed: closing
#: (or garbage-collecting) them could end the parent's sessions on shared sockets.
_inherited: list[Store] = []


def store_url(app: Celery) -> str:
    """The app's store URL: ``aaa_store_url``, else the broker's Redis server.

    A non-Redis broker without ``aaa_store_url`` is a configuration error: the
    guard needs a store that every worker shares.
    """
    url = setting(app, "aaa_store_url")
    if url:
        return str(url)
    broker = str(app.conf.broker_url or "")
    if broker.startswith(("redis://", "rediss://")):
        return broker
    raise ConfigError(
        f"{spelled(app, 'aaa_store_url')}: not set, and the broker {broker.split('://')[0] or '(none)'}:// "
        f"is not Redis, so there is no store to default to. Set {assignment(app, 'aaa_store_url')} to a "
        "redis://, postgresql+psycopg:// or sqlite:/// URL shared by every worker."
    )


def store_options(app: Celery) -> dict[str, Any]:
    """The keyword options of the app's store (``aaa_store_options``: ``key_prefix``,
    ``shards``, ``retention_s``, ``idle_session_timeout_s``, ...), passed to
    :func:`~aaa_celery.stores.open_store` in every process that opens it: the pool
    children that run calls and the recovery sweeper alike."""
    options = setting(app, "aaa_store_options") or {}
    if not isinstance(options, dict):
        raise ConfigError(
            f"{spelled(app, 'aaa_store_options')}: expected a dict of store options (key_prefix, shards, ...), "
            f"not {type(options).__name__}"
        )
    return dict(options)


def use_store(app: Celery, store: Store) -> None:
    """Make ``app`` use this store object in this process (the embedded engine, tests)."""
    app._aaa_store = (os.getpid(), store)  # type: ignore[attr-defined]


def app_store(app: Celery) -> Store:
    """The store for ``app`` in this process, opened on first use."""
    pinned: Any = getattr(app, "_aaa_store", None)
    if pinned is not None and pinned[0] == os.getpid():
        return pinned[1]  # type: ignore[no-any-return]
    url = store_url(app)
    options = store_options(app)
    key = (os.getpid(), url, repr(sorted(options.items())) if options else "")
    store = _opened.get(key)  # the usual case, without the lock
    if store is not None:
        return store
    with _lock:
        store = _opened.get(key)
        if store is None:
            store = _opened[key] = open_store(url, **options)
        return store


def migrate_command(app: Celery) -> str:
    """The command that upgrades ``app``'s store, as the operator would type it."""
    main = app.main if app.main and app.main != "__main__" else "proj"
    return f"celery -A {main} aaa migrate"


def check_store_version(app: Celery) -> StoreVersion | None:
    """Refuse to start on a store whose schema is not this release's (an older one names
    ``celery -A proj aaa migrate``), or upgrade an older one at once, under the store's
    schema lock, with ``aaa_store_auto_migrate=True``.

    A store that cannot be reached now is no reason not to start (the worker waits for it,
    as it does for a store that goes away later): that is logged, and None returned."""
    try:
        return check_version(app_store(app), bool(setting(app, "aaa_store_auto_migrate", False)),
                             migrate_command(app))
    except StoreUnavailable as e:
        logger.warning("aaa_celery: the store's schema version was not checked at start: %s", e)
        return None


#: Stores whose schema a producer or engine of this process checked, each with when to try
#: again (0.0: checked, for good; else a monotonic time, after the store could not be reached).
_writer_checked: weakref.WeakKeyDictionary[Store, float] = weakref.WeakKeyDictionary()
#: Seconds before a producer asks again for the schema of a store it could not reach.
WRITER_RECHECK_S = 30.0


def writer_store(app: Celery) -> Store:
    """The store for ``app`` (:func:`app_store`) in a process that writes to it without
    starting a worker: a producer's ``apply_async``, an engine. Its schema is checked once per
    process and store, as a worker checks it at start (:func:`check_store_version`), but never
    migrated: an older store is refused with :class:`~aaa_celery.errors.StoreOutdated` naming
    ``celery -A proj aaa migrate``; a newer one (a later release migrated it: the documented
    rolling order upgrades producers last) is used, with one warning to upgrade this process.
    A store that cannot be reached is not checked now (its own writes say so), and asked
    again after :data:`WRITER_RECHECK_S`."""
    store = app_store(app)
    retry_at = _writer_checked.get(store)
    if retry_at is not None and (retry_at == 0.0 or time.monotonic() < retry_at):
        return store
    try:
        version = store.schema_version()
    except StoreUnavailable as e:
        logger.info("aaa_celery: the store's schema version was not checked: %s", e)
        _writer_checked[store] = time.monotonic() + WRITER_RECHECK_S
        return store
    if version.outdated:
        raise StoreOutdated(
            f"the {store.kind} store is at schema {version.describe()}: upgrade it with "
            f"`{migrate_command(app)}` (docs/upgrading.md) before this process publishes calls or drives runs",
            current=version.current, latest=version.latest)
    if version.newer:
        logger.warning("aaa_celery: the %s store is at schema %s: a later release of aaa_celery migrated it; "
                       "upgrade aaa_celery in this process too (docs/upgrading.md)", store.kind, version.describe())
    _writer_checked[store] = 0.0
    return store


def forget_inherited() -> None:
    """Drop stores opened by a parent process; a forked child opens its own. Call it in
    the child right after the fork (``worker_process_init``), before any other thread."""
    global _lock
    # Another thread of the parent (the recovery sweeper) may have held the lock at the
    # fork; no thread of the child would ever release it.
    _lock = threading.Lock()
    with _lock:
        for key in [k for k in _opened if k[0] != os.getpid()]:
            _inherited.append(_opened.pop(key))
