"""The test-only ready file: a worker writes its main PID to a file once it consumes.

:class:`~aaa_celery.testing.WorkerProcess` sets ``AAA_READY_FILE`` for each worker
it starts and runs it through :mod:`aaa_celery.testing.worker`, which calls
:func:`connect_ready_file` before handing over to Celery's own CLI. Nothing here
runs at import: importing :mod:`aaa_celery.testing` connects no signal.
"""

from __future__ import annotations

import os

#: Env var naming the file a worker writes its main PID to once it is ready to consume.
READY_FILE_ENV = "AAA_READY_FILE"

#: The receiver's ``dispatch_uid``: connecting twice keeps one receiver.
DISPATCH_UID = "aaa_celery.testing.ready_file"


def write_ready_file(sender: object = None, **_: object) -> None:
    """``worker_ready`` receiver: write this process's PID to ``$AAA_READY_FILE`` (atomically)."""
    path = os.environ.get(READY_FILE_ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, path)


def connect_ready_file() -> None:
    """Connect :func:`write_ready_file` to Celery's ``worker_ready`` signal (idempotent)."""
    from celery.signals import worker_ready

    worker_ready.connect(write_ready_file, weak=False, dispatch_uid=DISPATCH_UID)
