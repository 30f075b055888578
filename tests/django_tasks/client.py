"""The web side of the fleet tests, in a process of its own: ``python -m tests.django_tasks.client
'<json list>'`` runs operations through the public django.tasks API, in order, and prints the
JSON list of their answers (an ``"id"`` of ``"$n"`` is the id answered by operation *n*).

- ``{"op": "enqueue", "task": "refund", "args": [...], "run_after_s": 10, "atomic": "commit"}``:
  ``atomic`` enqueues inside ``transaction.atomic()`` that commits, ``rollback`` rolls it back,
  ``kill`` is killed (kill -9) right after the commit, before its ``on_commit`` publish.
- ``{"op": "wait", "task": "refund", "id": "...", "timeout": 90}``: ``get_result`` until finished.
- ``{"op": "get", ...}``: ``get_result`` once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_tasks.settings")
django.setup()

from django.db import transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from tests.django_tasks.shop import tasks  # noqa: E402


def shown(result: Any) -> dict[str, Any]:
    out = {"id": result.id, "status": str(result.status), "attempts": result.attempts,
           "worker_ids": result.worker_ids, "errors": [[e.exception_class_path, e.traceback] for e in result.errors],
           "enqueued_at": result.enqueued_at and result.enqueued_at.timestamp(),
           "run_after": result.task.run_after and result.task.run_after.timestamp(),
           "started_at": result.started_at and result.started_at.timestamp(),
           "finished_at": result.finished_at and result.finished_at.timestamp(),
           "last_attempted_at": result.last_attempted_at and result.last_attempted_at.timestamp()}
    if str(result.status) == "SUCCESSFUL":
        out["return_value"] = result.return_value
    return out


def enqueue(cmd: dict[str, Any]) -> Any:
    task = getattr(tasks, cmd["task"])
    if cmd.get("run_after_s"):
        task = task.using(run_after=timezone.now() + dt.timedelta(seconds=cmd["run_after_s"]))
    if not cmd.get("atomic"):
        return task.enqueue(*cmd.get("args", []))
    try:
        with transaction.atomic():
            if cmd["atomic"] == "kill":  # runs first among the on_commit hooks: before the publish
                transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
            result = task.enqueue(*cmd.get("args", []))
            print(json.dumps({"id": result.id}), flush=True)
            if cmd["atomic"] == "rollback":
                raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    return result


def main(cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["op"] == "enqueue":
        return shown(enqueue(cmd))
    from aaa_celery.contrib.django.tasks._api import TaskResultDoesNotExist

    task = getattr(tasks, cmd["task"])
    deadline = time.monotonic() + cmd.get("timeout", 0)
    while True:
        try:
            result = task.get_result(cmd["id"])
        except TaskResultDoesNotExist:
            return {"id": cmd["id"], "missing": True}
        if cmd["op"] == "get" or result.is_finished or time.monotonic() > deadline:
            return shown(result)
        time.sleep(0.25)


if __name__ == "__main__":
    answers: list[dict[str, Any]] = []
    for cmd in json.loads(sys.argv[1]):
        if str(cmd.get("id", "")).startswith("$"):
            cmd["id"] = answers[int(cmd["id"][1:])]["id"]
        answers.append(main(cmd))
    print(json.dumps(answers), flush=True)
