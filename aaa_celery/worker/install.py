"""Wire the guard into a Celery app: settings checks, the recovery bootstep, signals."""

from __future__ import annotations

import os
import warnings

from celery import Celery
from celery.signals import worker_process_init, worker_ready

from ..errors import ConfigError
from .recovery import RecoveryStep
from .stores import forget_inherited, store_url


def check_settings(app: Celery) -> None:
    """Refuse settings that break the guarantees; warn about ones that weaken them."""
    accepted = set(app.conf.accept_content or []) | {app.conf.task_serializer, app.conf.result_serializer}
    risky = sorted(c for c in accepted if c and ("pickle" in str(c) or "yaml" in str(c)))
    if risky:
        raise ConfigError(
            f"accept_content/task_serializer: {risky} is accepted, which runs code from any "
            "message; aaa_celery needs JSON: set accept_content=['json'], task_serializer='json', "
            "result_serializer='json'"
        )
    store_url(app)  # fails now, not at 3 a.m., if there is no store
    if (app.conf.worker_prefetch_multiplier or 4) > 1:
        warnings.warn(
            "worker_prefetch_multiplier > 1 with long guarded tasks lets one worker hold "
            "messages it cannot start; set worker_prefetch_multiplier=1 for long tools",
            stacklevel=3,
        )


def install(app: Celery) -> Celery:
    """Add the recovery bootstep to ``app``'s workers (idempotent) and check its settings."""
    check_settings(app)
    if RecoveryStep not in app.steps["worker"]:
        app.steps["worker"].add(RecoveryStep)
    return app


@worker_process_init.connect(weak=False)
def _reopen_after_fork(**_: object) -> None:
    forget_inherited()


#: Env var naming a file that a worker writes its main PID to once it is ready to
#: consume (``aaa_celery.testing`` uses it to know a worker is up without polling it).
READY_FILE_ENV = "AAA_READY_FILE"


@worker_ready.connect(weak=False)
def _write_ready_file(sender: object = None, **_: object) -> None:
    path = os.environ.get(READY_FILE_ENV)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, path)
