"""Check a Celery app's settings against what the guard's guarantees need."""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
import warnings
from typing import Any

from ..errors import ConfigError
from ..stores import backend_for
from .conf import setting
from .setting_names import assignment, name_problems, spelled
from .stores import store_options, store_url

#: Serializer names (kombu's registry names, lower case) whose decoders build arbitrary
#: objects, and so run code carried by a message.
CODE_RUNNING_NAMES = frozenset({"pickle", "yaml", "dill", "cloudpickle", "jsonpickle", "marshal"})
#: Content types of those serializers (and any other type naming pickle or YAML).
CODE_RUNNING_TYPES = frozenset({"application/x-python-serialize", "application/x-yaml", "application/yaml",
                                "text/yaml", "text/x-yaml", "application/x-pickle", "application/python-pickle"})
#: Top-level modules whose loaders build arbitrary objects: a decoder from one is refused.
CODE_RUNNING_MODULES = frozenset({"pickle", "_pickle", "dill", "cloudpickle", "jsonpickle", "marshal", "yaml",
                                  "shelve", "copyreg"})
MSGPACK_TYPE = "application/x-msgpack"

#: The settings that name a serializer (one name) or the content a process decodes (a list).
SERIALIZER_SETTINGS = ("task_serializer", "result_serializer", "event_serializer")
ACCEPT_SETTINGS = ("accept_content", "result_accept_content")


def _registry() -> Any:
    from kombu.serialization import registry  # type: ignore[attr-defined]  # kombu has it; celery-types does not

    return registry


def _function(decoder: Any) -> Any:
    while isinstance(decoder, functools.partial):
        decoder = decoder.func
    return decoder


def code_running(value: Any, registry: Any = None) -> str | None:
    """Why the serializer or content type ``value`` (a kombu name such as ``pickle``, or a
    content type such as ``application/x-python-serialize``) can run code from a
    message, or None if it cannot. Read by name and by content type, through kombu's
    registry both ways, so an alias of a dangerous codec is caught too."""
    registry = registry or _registry()
    text = str(value).strip()
    ctype = text if "/" in text else registry.name_to_type.get(text)
    names = {text.lower(), str(registry.type_to_name.get(text) or "").lower(),
             str(registry.type_to_name.get(ctype) or "").lower()}
    types = {t.lower() for t in (text, ctype) if t and "/" in t}
    for name in sorted(n for n in names if n in CODE_RUNNING_NAMES):
        return f"the {name} serializer builds arbitrary objects"
    for t in sorted(types):
        if t in CODE_RUNNING_TYPES or any(w in t for w in ("pickle", "python-serialize", "yaml")):
            return f"{t} builds arbitrary objects"
    decoder = registry._decoders.get(ctype) if ctype else None
    if decoder is None:
        return None
    fn = _function(decoder)
    module = str(getattr(fn, "__module__", None) or "")
    if module.split(".")[0] in CODE_RUNNING_MODULES:
        return f"its decoder {module}.{getattr(fn, '__qualname__', fn)!s} builds arbitrary objects"
    if ctype and ctype.lower() == MSGPACK_TYPE:
        own = module == "kombu.serialization" and str(getattr(fn, "__qualname__", "")).startswith("register_msgpack.")
        if decoder is not fn or not own:
            return ("msgpack is registered with a decoder other than kombu's own, whose extension "
                    "hooks (ext_hook, object_hook) can build arbitrary objects")
    return None


def serializer_problems(conf: Any, registry: Any = None, app: Any = None) -> list[str]:
    """Every setting of ``conf`` that lets a process decode content able to run code (named
    as ``app`` spells it, when given)."""
    problems = []
    for setting in ACCEPT_SETTINGS:
        values = conf.get(setting)
        if values is None:
            continue  # Celery's default: ['json'], or accept_content for results
        if isinstance(values, str):
            values = [values]
        name = spelled(app, setting) if app is not None else setting
        for value in values:
            why = code_running(value, registry)
            if why:
                problems.append(f"{name}: {value!r} is accepted, and {why}, so any message can run "
                                f"code in the worker; set {name}=['json']")
    for setting in SERIALIZER_SETTINGS:
        name = spelled(app, setting) if app is not None else setting
        value = conf.get(setting)
        why = code_running(value, registry) if value else None
        if why:
            problems.append(f"{name}: {value!r} runs code when read back ({why}); set {name}='json'")
    return problems


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning that
    points at the user's line (``bind(app)``, ``install(app)``), not at ours."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - the caller of the function that warns
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("aaa_celery."):
        frame, level = frame.f_back, level + 1
    return level


def check_settings(app: Any) -> None:
    """Refuse settings that break the guarantees; warn about ones that weaken them."""
    problems = serializer_problems(app.conf, app=app)
    if problems:
        raise ConfigError(
            "aaa_celery refuses serializers that can run code carried by a message "
            "(pickle, yaml, msgpack with extension hooks), by name and by content type:\n  "
            + "\n  ".join(problems)
        )
    check_setting_names(app)
    url = store_url(app)  # fails now, not at 3 a.m., if there is no store
    check_store_options(url, store_options(app), spelled(app, "aaa_store_options"))
    if (app.conf.worker_prefetch_multiplier or 4) > 1:
        name = spelled(app, "worker_prefetch_multiplier")
        warnings.warn(
            f"{name} > 1 with long guarded tasks lets one worker hold "
            f"messages it cannot start; set {name}=1 for long tools",
            stacklevel=_callers_level(),
        )


def check_setting_names(app: Any) -> None:
    """Refuse an ``aaa_*`` setting that is not one (a typo), or that Celery does not read as
    spelled; warn about an unread name close to one (see :mod:`.setting_names`)."""
    errors, warns = name_problems(app)
    if errors:
        raise ConfigError("aaa_celery: settings that do nothing as written:\n  " + "\n  ".join(errors))
    for text in warns:
        warnings.warn(text, stacklevel=_callers_level())


#: The opt-in for a store held in one process's memory on a worker of several processes.
ALLOW_PROCESS_LOCAL = "aaa_allow_process_local_store"


def process_local(url: str) -> bool:
    """Whether the store at ``url`` lives in one process's memory (no other process sees it)."""
    return url.startswith("memory:") or url in ("sqlite://", "sqlite:///:memory:")


def check_worker_processes(app: Any, pool_cls: Any, concurrency: Any, autoscale: Any = None) -> None:
    """Refuse, at worker start, a process-local store on a worker whose calls run in more
    than one process (a prefork pool of concurrency > 1, or autoscaling above 1): each
    process would have a store of its own, so two of them could run one call at once."""
    url = store_url(app)
    if not process_local(url) or setting(app, ALLOW_PROCESS_LOCAL):
        return
    from celery.concurrency.prefork import TaskPool

    if not (isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool)):
        return  # solo, threads, eventlet, gevent: one process
    if isinstance(autoscale, str):
        autoscale = [int(n) for n in autoscale.split(",") if n.strip()]
    processes = max([int(concurrency or 1), *(int(n) for n in (autoscale or ())[:1])])
    if processes > 1:
        raise ConfigError(
            f"{spelled(app, 'aaa_store_url')}: {url} is held in one process's memory, and this worker "
            f"runs calls in {processes} prefork processes that cannot share it, so the guard could not keep "
            f"one call from running twice. Use a redis://, postgresql+psycopg:// or sqlite:/// store shared by "
            f"every process, or run the worker with -c 1 (or -P threads / -P solo); for a test that knows "
            f"this, set {assignment(app, ALLOW_PROCESS_LOCAL)} = True."
        )


def check_store_options(url: str, options: dict[str, Any], name: str = "aaa_store_options") -> None:
    """Refuse ``aaa_store_options`` that the URL's store does not take, naming them."""
    if not options:
        return
    params = inspect.signature(backend_for(url).__init__).parameters
    known = sorted(n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
    # A store with **kw (Redis) passes the rest on to its driver: only a near miss of
    # one of its own options is sure to be a typo there.
    rest = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for option in sorted(set(options) - set(known)):
        close = difflib.get_close_matches(option, known, n=1)
        if close or not rest:
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{name}: {option!r} is not an option of the {url.split(':')[0]} store{hint} "
                f"It takes {known}."
            )
