"""The Celery settings of aaa_celery, by name, and the check of the ``aaa_*`` names an app sets.

:data:`SETTINGS` is the one table of every setting the package reads. ``bind()`` and worker
start refuse an ``aaa_*`` name that is not in it, naming the closest known one, so a
mistyped ``aaa_store_ulr`` cannot leave the guard on the broker's Redis unnoticed. Add a
new setting to the table where you add the code that reads it:
``tests/worker/test_setting_names.py`` finds every ``aaa_*`` name the package reads and fails
for one missing here.

A name is judged as Celery reads it: with ``config_from_object(..., namespace='CELERY')``
(Django's usual layout) Celery reads ``CELERY_AAA_STORE_URL`` (or ``app.conf.aaa_store_url``)
and ignores an unprefixed ``AAA_STORE_URL``, which is then reported too. Messages name a
setting as the app spells it (:func:`spelled`).
"""

from __future__ import annotations

import difflib
from typing import Any

#: Every Celery setting of aaa_celery: name -> what it is (defaults in parentheses).
#: A new setting goes here, in the same change as the code that reads it: bind() and worker
#: start refuse any aaa_* name missing from this table.
SETTINGS: dict[str, str] = {
    "aaa_store_url": "the guard's store, shared by every worker (the broker's Redis server)",
    "aaa_store_options": "keyword options of the store: key_prefix, shards, retention_s, ... ({})",
    "aaa_store_auto_migrate": "a worker that finds an older store schema upgrades it at start, under the "
                              "store's schema lock, instead of refusing to start (False)",
    "aaa_guard": "the app-wide GuardConfig (a dict) of plain GuardedTasks ({})",
    "aaa_secret_key": "a Fernet key (or a list, newest first) that seals secret tool arguments",
    "aaa_register_on_publish": "register a call in the store when it is sent (True)",
    "aaa_recovery_interval_s": "seconds between a worker's recovery sweeps; 0 turns them off (2)",
    "aaa_unclaimed_grace_s": "age at which a registered call that no worker claimed is sent again (300)",
    "aaa_lost_after_s": "age at which a call's message, found in no queue, counts as lost (20)",
    "aaa_lost_check_s": "seconds between the two looks that find a message lost (5)",
    "aaa_recovery_hold_s": "first wait before a call republished by recovery is sent again (10)",
    "aaa_recovery_max_hold_s": "longest such wait (the hold doubles up to it)",
    "aaa_recovery_max_tries": "republishes no worker claimed before the call is given up (5)",
    "aaa_max_message_bytes": "largest message body a worker reads for a guarded task (1 MiB)",
    "aaa_metrics_port": "the worker's Prometheus port (none: no metrics endpoint)",
    "aaa_metrics_addr": "the address the metrics endpoint listens on (127.0.0.1)",
    "aaa_metrics_hostname": "set by the worker: its node name, for metric labels",
    "aaa_task_events": "set by the worker: whether it sends task events (-E)",
    "aaa_tracing": "OpenTelemetry spans for guarded calls (False)",
    "aaa_rabbitmq_consumer_timeout_s": "for `aaa doctor`: the RabbitMQ server's consumer_timeout, seconds",
    "aaa_allow_process_local_store": (
        "let a worker of several processes start on a store held in one process's memory "
        "(memory://): for tests only, the processes do not share it (False)"
    ),
}

#: How alike (difflib's ratio) a name Celery does not read must be to one of ours to be
#: taken for a typo of it: the project's own ``AAA_*`` settings are left alone.
NEAR_MISS = 0.85

#: The namespace Django projects give Celery, spotted on an app configured without one.
UNUSED_PREFIX = "CELERY_"

#: Upper-case ``AAA_*`` names that are not Celery settings: the Django integration's own.
NOT_CELERY_SETTINGS = frozenset({"AAA_CELERY"})


def _match_case(name: str, prefix: str) -> str:
    """``name`` in the case of ``prefix``, as Celery joins a namespace and a setting."""
    return name.upper() if prefix.isupper() else name.lower()


def _prefix(app: Any) -> str | None:
    namespace = getattr(app, "namespace", None)
    return f"{namespace.rstrip('_')}_" if namespace else None


def spelled(app: Any, name: str) -> str:
    """``name`` (``aaa_store_url``, ``worker_prefetch_multiplier``) as the app's configuration
    spells it: ``CELERY_AAA_STORE_URL`` for an app configured with ``namespace='CELERY'``."""
    prefix = _prefix(app)
    return _match_case(prefix + name, prefix) if prefix else name


def assignment(app: Any, name: str) -> str:
    """Where to set ``name``: ``CELERY_AAA_STORE_URL`` in a namespaced configuration (the
    Django settings), else ``app.conf.aaa_store_url``."""
    return spelled(app, name) if _prefix(app) else f"app.conf.{name}"


def _set_names(conf: Any) -> list[str]:
    """Every name set in the app's configuration (its changes and the object it was
    configured from), Celery's defaults aside."""
    names: list[str] = []
    for mapping in getattr(conf, "maps", [])[:-1] or [conf]:
        try:
            names.extend(str(k) for k in mapping.keys())
        except (AttributeError, TypeError):
            continue
    return list(dict.fromkeys(names))


def name_problems(app: Any) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the ``aaa_*`` names set in ``app``'s configuration: a name
    Celery reads that is no setting of aaa_celery is an error; a known name Celery does not
    read in that spelling (``AAA_STORE_URL`` beside ``namespace='CELERY'``) is an error; an
    unread name close to a known one is a warning (it may be the project's own setting)."""
    prefix = _prefix(app)
    errors: list[str] = []
    warns: list[str] = []
    for key in _set_names(app.conf):
        low = key.lower()
        # without a namespace, CELERY_AAA_* is a Django project that forgot namespace='CELERY'
        strip = prefix or (UNUSED_PREFIX if low.startswith(UNUSED_PREFIX.lower() + "aaa_") else None)
        name = low[len(strip):] if strip and low.startswith(strip.lower()) else low
        if not name.startswith("aaa_") or key in NOT_CELERY_SETTINGS:
            continue
        prefixed = prefix is not None and low.startswith(prefix.lower())
        read = key == name or (prefix is not None and key == _match_case(prefix + name, prefix))
        if read:
            if name in SETTINGS:
                continue
            close = difflib.get_close_matches(name, SETTINGS, n=1)
            hint = f"; did you mean {spelled(app, close[0]) if prefixed else close[0]!r}?" if close else ""
            errors.append(f"{key}: not a setting of aaa_celery{hint} (the settings are listed in "
                          "aaa_celery.worker.setting_names.SETTINGS)")
            continue
        if prefix:
            how = (f"this app reads its Celery settings with namespace={prefix.rstrip('_')!r}, so it reads "
                   f"{spelled(app, name)} (or app.conf.{name})")
        elif strip:
            how = (f"this app reads its Celery settings without a namespace, so it reads {name}; configure it "
                   f"with config_from_object(..., namespace={UNUSED_PREFIX.rstrip('_')!r}) to use {key}")
        else:
            how = f"Celery reads lower-case names here ({name})"
        near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=NEAR_MISS)
        if name in SETTINGS:
            rename = "or rename it" if strip and not prefix else "rename it"
            errors.append(f"{key} is set but Celery ignores it: {how}; {rename} {spelled(app, name)}")
        elif near:
            warns.append(f"{key} is not read by Celery ({how}); if it is meant for aaa_celery, did you "
                         f"mean {spelled(app, near[0])}?")
    return errors, warns
