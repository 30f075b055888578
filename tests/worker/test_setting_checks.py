"""Settings are checked by name (issue 22 item 2), at bind() and at the start of a real
``celery worker``: a mistyped ``aaa_*`` name, an unprefixed ``AAA_*`` beside a Django
project's ``namespace='CELERY'``, and a ``memory://`` store on a worker of several processes.
Error messages name a setting as the app spells it (``CELERY_AAA_STORE_URL``).

On c79799f each of these was silent: ``aaa_store_ulr`` left the guard on the broker's Redis,
an unprefixed ``AAA_STORE_URL`` was ignored, the no-store error said ``app.conf.aaa_store_url``
to a Django project, and a prefork worker of concurrency 2 started on a ``memory://`` store.
"""

from __future__ import annotations

import json
import types
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from aaa_celery import ConfigError
from aaa_celery.testing import WorkerProcess, wait_for
from aaa_celery.tools import ToolHandler, ToolRegistry, tool

from .conftest import ROOT


@tool
def ping(text: str) -> str:
    """Ping."""
    return text


def bind(app: Celery) -> Celery:
    return ToolHandler(ToolRegistry([ping])).bind(app)


JSON = {"task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
        "worker_prefetch_multiplier": 1}


def plain_app(**conf: Any) -> Celery:
    app = Celery("names", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update({**JSON, **conf})
    return app


def django_app(**settings: Any) -> Celery:
    """An app configured as a Django project does: from a settings object, under CELERY_."""
    app = Celery("names_django", set_as_current=False)
    base = {"CELERY_BROKER_URL": "redis://127.0.0.1:1/0", **{f"CELERY_{k.upper()}": v for k, v in JSON.items()}}
    app.config_from_object(types.SimpleNamespace(**{**base, **settings}), namespace="CELERY")
    return app


# -- bind() ---------------------------------------------------------------------------


def test_a_mistyped_aaa_setting_is_refused_at_bind_with_the_closest_name():
    with pytest.raises(ConfigError, match=r"aaa_store_ulr: not a setting of aaa_celery; did you mean 'aaa_store_url'"):
        bind(plain_app(aaa_store_ulr="redis://127.0.0.1:1/5"))
    with pytest.raises(ConfigError, match=r"aaa_recovery_intervall_s.*'aaa_recovery_interval_s'"):
        bind(plain_app(aaa_recovery_intervall_s=1))
    with pytest.raises(ConfigError, match=r"aaa_zzz: not a setting of aaa_celery \("):  # nothing close
        bind(plain_app(aaa_zzz=1))
    bind(plain_app(aaa_store_url="redis://127.0.0.1:1/5", aaa_recovery_interval_s=1, aaa_tracing=False))


def test_a_django_projects_unprefixed_aaa_setting_is_reported_in_the_apps_spelling():
    with pytest.raises(ConfigError, match=r"AAA_STORE_URL is set but Celery ignores it: .*namespace='CELERY'.*"
                                          r"rename it CELERY_AAA_STORE_URL"):
        bind(django_app(AAA_STORE_URL="redis://127.0.0.1:1/5"))
    with pytest.raises(ConfigError, match=r"CELERY_AAA_STORE_ULR: not a setting of aaa_celery; "
                                          r"did you mean 'CELERY_AAA_STORE_URL'"):
        bind(django_app(CELERY_AAA_STORE_ULR="redis://127.0.0.1:1/5"))
    # the Django integration's own AAA_CELERY dict and the project's unrelated AAA_* names are no
    # Celery settings; a name close to one of ours is worth a warning only
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        bind(django_app(CELERY_AAA_STORE_URL="redis://127.0.0.1:1/5", AAA_CELERY={"AUTHORIZE": "x:y"},
                        AAA_PAYMENTS_API="https://example.invalid", AAA_STORE_ULR="x"))
    texts = [str(w.message) for w in seen if "AAA_" in str(w.message)]
    assert len(texts) == 1 and "AAA_STORE_ULR is not read by Celery" in texts[0], texts
    assert "did you mean CELERY_AAA_STORE_URL" in texts[0]


def test_a_django_project_configured_without_its_namespace_is_told_so():
    """CELERY_AAA_STORE_URL in settings read without namespace='CELERY': Celery reads neither
    it nor CELERY_BROKER_URL's new-style twin as aaa_celery's; it was ignored in silence."""
    app = Celery("names_no_namespace", set_as_current=False)
    app.config_from_object(types.SimpleNamespace(CELERY_AAA_STORE_URL="redis://127.0.0.1:1/5", BROKER_URL=
                                                 "redis://127.0.0.1:1/0", CELERY_ACCEPT_CONTENT=["json"]))
    with pytest.raises(ConfigError, match=r"CELERY_AAA_STORE_URL is set but Celery ignores it: .*without a "
                                          r"namespace.*namespace='CELERY'.*or rename it aaa_store_url"):
        bind(app)


def test_errors_name_settings_as_a_namespaced_app_spells_them():
    app = django_app(CELERY_BROKER_URL="amqp://guest@127.0.0.1:1//")
    with pytest.raises(ConfigError) as err:
        bind(app)
    assert "CELERY_AAA_STORE_URL: not set" in str(err.value) and "Set CELERY_AAA_STORE_URL to" in str(err.value)
    assert "app.conf.aaa_store_url" not in str(err.value)
    with pytest.raises(ConfigError, match="Set app.conf.aaa_store_url to"):  # a plain app: as before
        bind(plain_app(broker_url="amqp://guest@127.0.0.1:1//"))
    with pytest.raises(ConfigError, match=r"CELERY_ACCEPT_CONTENT: 'pickle' is accepted"):
        bind(django_app(CELERY_ACCEPT_CONTENT=["json", "pickle"]))
    with pytest.raises(ConfigError, match=r"CELERY_AAA_STORE_OPTIONS: 'key_prefx' .*did you mean 'key_prefix'"):
        bind(django_app(CELERY_AAA_STORE_OPTIONS={"key_prefx": "x"}))
    with pytest.warns(UserWarning, match="CELERY_WORKER_PREFETCH_MULTIPLIER > 1"):
        bind(django_app(CELERY_WORKER_PREFETCH_MULTIPLIER=4))


# -- worker start ----------------------------------------------------------------------


def start(tmp_path: Path, app: str, env: dict[str, str], *, pool: str = "prefork", concurrency: int = 1,
          extra_args: tuple[str, ...] = ()) -> WorkerProcess:
    worker = WorkerProcess(app, hostname=f"names-{uuid.uuid4().hex[:6]}@t", pool=pool, concurrency=concurrency,
                           env=env, workdir=tmp_path / uuid.uuid4().hex[:6], cwd=ROOT, extra_args=extra_args)
    return worker.start()


def outcome(worker: WorkerProcess) -> str:
    """'ready' or 'refused', once the worker is one or the other (it is stopped either way)."""
    try:
        wait_for(lambda: not worker.alive or worker.is_ready(), 90, "the worker exits or becomes ready")
        return "ready" if worker.is_ready() else "refused"
    finally:
        worker.stop()


SETTINGS_APP = "tests.worker.settings_app"


@pytest.mark.redis
@pytest.mark.fleet
def test_a_worker_refuses_to_start_with_a_mistyped_setting(redis_url, tmp_path):
    env = {"AAA_SETTINGS_BROKER": redis_url, "AAA_SETTINGS_CONF": json.dumps({"aaa_store_ulr": redis_url})}
    worker = start(tmp_path, SETTINGS_APP, env, pool="solo")
    assert outcome(worker) == "refused", worker.log[-3000:]
    assert worker.proc.returncode != 0
    assert "did you mean 'aaa_store_url'" in worker.log


@pytest.mark.redis
@pytest.mark.fleet
def test_a_django_worker_refuses_an_unprefixed_aaa_setting_naming_the_prefixed_one(redis_url, tmp_path):
    env = {"AAA_PLAIN_BROKER": redis_url, "AAA_PLAIN_UNPREFIXED": "1"}
    worker = start(tmp_path, "tests.django_plain.celery_app", env, pool="solo")
    assert outcome(worker) == "refused", worker.log[-3000:]
    assert "rename it CELERY_AAA_STORE_URL" in worker.log


@pytest.mark.redis
@pytest.mark.fleet
@pytest.mark.parametrize(("pool", "concurrency", "extra", "args", "expected"), [
    ("prefork", 2, {}, (), "refused"),
    ("prefork", 1, {}, ("--autoscale=3,1",), "refused"),  # up to 3 processes
    ("prefork", 2, {"aaa_allow_process_local_store": True}, (), "ready"),  # the tests' explicit opt-in
    ("threads", 4, {}, (), "ready"),  # one process
])
def test_a_memory_store_is_refused_on_a_worker_of_several_processes(redis_url, tmp_path, pool, concurrency,
                                                                    extra, args, expected):
    env = {"AAA_SETTINGS_BROKER": redis_url,
           "AAA_SETTINGS_CONF": json.dumps({"aaa_store_url": "memory://", **extra})}
    worker = start(tmp_path, SETTINGS_APP, env, pool=pool, concurrency=concurrency, extra_args=args)
    assert outcome(worker) == expected, worker.log[-3000:]
    if expected == "refused":
        assert "memory:// is held in one process's memory" in worker.log
        assert "aaa_allow_process_local_store = True" in worker.log


@pytest.mark.redis
@pytest.mark.fleet
def test_a_worker_refuses_to_start_with_a_recovery_setting_that_is_no_number(redis_url, tmp_path):
    """On main before: float('2s') raised a bare ValueError from the recovery bootstep, naming no
    setting."""
    env = {"AAA_SETTINGS_BROKER": redis_url, "AAA_SETTINGS_CONF": json.dumps({"aaa_recovery_interval_s": "2s"})}
    worker = start(tmp_path, SETTINGS_APP, env, pool="solo")
    assert outcome(worker) == "refused", worker.log[-3000:]
    assert "aaa_recovery_interval_s: '2s' is not a number" in worker.log
