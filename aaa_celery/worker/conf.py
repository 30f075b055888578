"""Reading a Celery app's settings on the hot path, at the cost of a few dict lookups.

``app.conf.get(name)`` tries every spelling of ``name`` (a ``namespace`` prefix, the old
upper-case names) in every one of the configuration's mappings, and raises and catches a
``KeyError`` for each miss: about 8 µs for a setting that is not set, the usual case of
``aaa_tracing`` or ``aaa_store_options``. A guarded delivery reads a few such settings,
so :func:`setting` gives the same answer from the same mappings, read live (a setting
changed at run time is seen at once), with the spellings worked out once per
configuration object.
"""

from __future__ import annotations

from typing import Any

from celery.utils.collections import ConfigurationView

#: Where a configuration object keeps the spellings of the names read through it.
_SPELLINGS = "_aaa_spellings"


def setting(app: Any, name: str, default: Any = None) -> Any:
    """``app.conf.get(name, default)``, cheaply: see the module's docstring."""
    conf = app.conf
    maps = conf.maps if isinstance(conf, ConfigurationView) else None
    if not maps or type(maps[0]) is not dict:
        return conf.get(name, default)  # not loaded yet: Celery's own get loads it
    spellings = conf.__dict__.get(_SPELLINGS)
    if spellings is None:
        spellings = conf.__dict__[_SPELLINGS] = {}
    keys = spellings.get(name)
    if keys is None:
        keys = spellings[name] = tuple(dict.fromkeys(conf._key(k) for k in conf._to_keys(name)))
    for mapping in maps:
        for key in keys:
            if key in mapping:
                return mapping[key]
    return default
