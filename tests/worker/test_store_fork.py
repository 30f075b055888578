"""A pool child forked while another thread of its parent held the store lock.

The recovery sweeper runs in a thread of the worker's main process and may be opening
the app's store (``app_store``, under the module's lock: a slow connect to a store that
is down) at the moment prefork forks a child. The child inherits the lock held, with no
thread left to release it; reproduces on 4156db8: its ``worker_process_init`` handler
(``forget_inherited``) then blocked forever, and the child never served a task.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from celery import Celery

from aaa_celery.worker import stores


def test_a_child_forked_while_a_parent_thread_holds_the_store_lock_still_opens_its_store():
    app = Celery("fork-lock", broker="memory://", set_as_current=False)
    app.conf.aaa_store_url = "memory://"
    holding, release = threading.Event(), threading.Event()

    def sweeper_opening_a_store() -> None:
        with stores._lock:
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=sweeper_opening_a_store, daemon=True)
    thread.start()
    assert holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: what worker_process_init does, then a call's first store use
        try:
            stores.forget_inherited()
            stores.app_store(app)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 20  # the child needs milliseconds; the margin is for a loaded box
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child blocked on the store lock its parent's thread held")
    finally:
        release.set()
        thread.join(10)
