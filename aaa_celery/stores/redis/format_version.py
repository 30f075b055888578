"""The Redis store's format version: which key layout and payloads a key prefix holds.

The version is kept in the key ``<prefix>:format``. Format ``1`` is the layout of 0.1.0,
which kept no such key: a prefix without the key holds format 1, so a 0.1.0 store, a
prefix a producer wrote before any worker started, and one whose key was flushed or
evicted all read as what they are. ``migrate`` (:func:`upgrade`) writes the key.

Each later format brings its upgrade step in :data:`UPGRADES`: the step from the format
before it, run under the prefix's upgrade lock (``<prefix>:format:lock``), after which
the format key names the new format.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import StoreOutdated, StoreUnavailable
from ..base import StoreVersion, new_token

#: This release's format.
FORMAT = "1"
#: The formats this release knows, oldest first.
FORMATS = ("1",)
#: The format of a prefix without the key: 0.1.0's layout.
UNVERSIONED = "1"
#: The step into a format from the one before it, by the format it starts from, given the
#: client and the key prefix (none yet: format 1 is the first).
UPGRADES: dict[str, tuple[str, Callable[[Any, str], None]]] = {}
#: How long an upgrade may hold the lock before another process may take it over.
LOCK_S = 300.0

#: Delete the lock only if this process still holds it.
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def format_key(prefix: str) -> str:
    return f"{prefix}:format"


def holds_data(client: Any, indexes: Sequence[str]) -> bool:
    """Whether any of the prefix's indexes (every call and run is in one) exists: one
    pipelined round trip (one per node on a cluster)."""
    pipe = client.pipeline(transaction=False)
    for key in indexes:
        pipe.exists(key)
    return any(pipe.execute())


def version(client: Any, prefix: str, indexes: Sequence[str]) -> StoreVersion:
    key = format_key(prefix)
    try:
        current = client.get(key)
    except UnicodeDecodeError:  # (the client decodes replies as UTF-8)
        raise StoreOutdated(
            f"redis store: the key {key!r} holds bytes that are not UTF-8 text, so not a format "
            f"version of aaa_celery (this release knows {', '.join(FORMATS)}): another program wrote it; "
            "point aaa_store_url at the guard's own database or key prefix, or delete the key if the "
            "prefix holds nothing else", current=None, latest=FORMAT) from None
    if current is not None:
        return StoreVersion(current, FORMAT, FORMATS)
    return StoreVersion(UNVERSIONED, FORMAT, FORMATS, empty=not holds_data(client, indexes))


def upgrade(client: Any, prefix: str, indexes: Sequence[str]) -> StoreVersion:
    """Run the upgrade steps from the prefix's format to this release's, under the lock,
    and write the format key."""
    lock, token = f"{format_key(prefix)}:lock", new_token()
    deadline = time.monotonic() + LOCK_S
    while not client.set(lock, token, nx=True, px=round(LOCK_S * 1000)):
        if time.monotonic() > deadline:
            raise StoreUnavailable(f"redis store: another process holds {lock} (an upgrade under way)")
        time.sleep(0.05)
    try:
        found = version(client, prefix, indexes)
        while not found.newer and found.current != FORMAT:
            target, step = UPGRADES[str(found.current)]
            step(client, prefix)
            client.set(format_key(prefix), target)
            found = version(client, prefix, indexes)
        if not found.newer:
            client.set(format_key(prefix), FORMAT, nx=True)
        return version(client, prefix, indexes)
    finally:
        client.eval(_UNLOCK, 1, lock, token)
