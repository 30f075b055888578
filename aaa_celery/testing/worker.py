"""``python -m aaa_celery.testing.worker -A proj worker ...``: the ``celery`` command plus the ready file.

The arguments are exactly those of ``celery``. This launcher connects the
test-only ``worker_ready`` receiver of :mod:`aaa_celery.testing.ready` in this
process and then runs Celery's own CLI with the same ``argv``, so the process is a
real ``celery worker`` that also writes ``$AAA_READY_FILE`` once it consumes.
:class:`~aaa_celery.testing.WorkerProcess` starts its workers this way. Nothing
imports this module; it only runs as ``__main__``.

Under libfaketime with a real monotonic clock (:func:`~aaa_celery.testing.faults.skewed_clock`),
``time.sleep`` fails with ``EINVAL`` (libfaketime 0.9.10 refuses the absolute monotonic
``clock_nanosleep`` that CPython sleeps with); the launcher then sleeps on a timed wait
instead, which libfaketime leaves alone.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


def main() -> None:
    if os.environ.get("FAKETIME") and os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":
        time.sleep = _sleep  # type: ignore[assignment]  # floats only, as every caller passes
    # As ``python -m celery`` does: patch for eventlet/gevent before anything else loads.
    if "multi" not in sys.argv:
        from celery import maybe_patch_concurrency

        maybe_patch_concurrency()
    from aaa_celery.testing.ready import connect_ready_file

    connect_ready_file()
    from celery.bin.celery import main as celery_main

    sys.exit(celery_main())


if __name__ == "__main__":
    main()
