"""pytest fixtures for testing your own guarded tools: real workers and faults, or eager.

Opt in with ``pytest -p aaa_celery.testing.pytest_plugin`` (or ``pytest_plugins = [...]``
in a conftest). The package also registers it through the ``pytest11`` entry point under
that same name; loaded either way it only adds the options below and the fixtures, and
nothing runs, starts or connects until a test asks for a fixture. Name your Celery app as
``celery -A`` does, with ``--aaa-app proj.celery`` or ``aaa_app = proj.celery`` in the
ini file (or override the ``aaa_app_module`` fixture).

Fixtures:

* ``aaa_fleet``: ``aaa_fleet(size=2, pool="prefork", concurrency=1)`` starts real ``celery
  worker`` processes of your app on a Redis of the test's own (broker, result backend,
  store and effect ledger), and returns a :class:`GuardedFleet`: ``.app`` (your app in
  this process, pointed at that Redis), ``.store``, and the faults ``kill_holder``,
  ``freeze_holder``, ``duplicate``. Every worker is stopped by PID after the test.
* ``aaa_eager``: your app in eager mode (``task_always_eager``) on a fresh in-memory
  store, for fast unit tests without a worker: the guard still claims, records and
  dedupes each call (see docs/eager-mode.md for what it cannot show).
* ``aaa_check``: ``aaa_check()`` checks the guard's invariants (one result, no overlap,
  at most one run for at_most_once, the keyed effect once, ...) on every guarded call the
  test sent, from the store's audit trail and the effect ledger that your fake of the
  called system writes through :mod:`aaa_celery.testing.effects`; it fails the test with
  the violations.
* ``aaa_redis_url`` (session): ``--aaa-redis-url`` or ``AAA_TEST_REDIS_URL``, else a
  throwaway ``redis-server`` on a free loopback port (skipped when none is installed).

The workers get ``CELERY_BROKER_URL``, ``CELERY_RESULT_BACKEND`` (Celery reads both over
what the app sets), ``AAA_STORE_URL`` and ``AAA_TEST_LEDGER_URL`` set to that Redis: leave
``aaa_store_url`` unset in the app (the store is then the broker's Redis) or read it from
``AAA_STORE_URL``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from . import effects
from .checker import Call, Violation, check_history
from .faults import Frozen, duplicate_delivery, freeze, kill_child
from .fleet import Fleet, WorkerProcess, wait_for
from .redis_server import RedisUnavailable, ThrowawayRedis

REDIS_ENV = "AAA_TEST_REDIS_URL"
STARTED = "aaa.tool.started"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aaa_celery", "aaa_celery: guarded tools under test")
    group.addoption("--aaa-app", dest="aaa_app", default=None,
                    help="your Celery app, as celery -A takes it (proj.celery, proj:app)")
    group.addoption("--aaa-redis-url", dest="aaa_redis_url", default=None,
                    help=f"a Redis the tests may flush (default: ${REDIS_ENV}, else a throwaway redis-server)")
    parser.addini("aaa_app", "your Celery app, as celery -A takes it (proj.celery, proj:app)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    """Keep the call phase's report on the items that use a fleet (its logs go with a failure)."""
    outcome = yield
    if call.when == "call" and "aaa_fleet" in getattr(item, "fixturenames", ()):
        item.stash[_CALL_REPORT] = outcome.get_result()


_CALL_REPORT = pytest.StashKey[Any]()


# -- the calls a test sent ----------------------------------------------------------------


class SentCalls:
    """The guarded calls sent in this process during one test (signals connected for the
    test only): call id -> (task name, args, kwargs)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: dict[str, tuple[str, list[Any], dict[str, Any]]] = {}

    def _guarded(self, name: str | None) -> bool:
        task = self.app.tasks.get(name) if name else None
        return getattr(task, "guard_config", None) is not None

    def on_publish(self, sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
        headers = headers or {}
        name, call_id = headers.get("task"), headers.get("id")
        if call_id and self._guarded(name) and call_id not in self.sent:
            args, kwargs = (list(body[0]), dict(body[1])) if isinstance(body, list | tuple) and len(body) >= 2 else ([], {})
            self.sent[call_id] = (name, args, kwargs)

    def on_prerun(self, sender: Any = None, task_id: str | None = None, args: Any = None, kwargs: Any = None,
                  **_: Any) -> None:
        name = str(getattr(sender, "name", ""))
        if task_id and getattr(getattr(sender, "request", None), "is_eager", False) and self._guarded(name):
            self.sent.setdefault(task_id, (name, list(args or ()), dict(kwargs or {})))

    def calls(self) -> list[Call]:
        out = []
        for call_id, (name, _, _) in self.sent.items():
            config = self.app.tasks[name].guard_config
            out.append(Call(call_id, delivery=config.delivery.value, max_attempts=config.max_attempts,
                            on_lost_lease=config.on_lost_lease.value, task=name))
        return out


@pytest.fixture
def aaa_sent(aaa_app: Any) -> Iterator[SentCalls]:
    """The guarded calls this test sent (to workers, or run eagerly)."""
    from celery.signals import before_task_publish, task_prerun

    sent = SentCalls(aaa_app)
    uid = f"aaa-sent-{id(sent)}"
    before_task_publish.connect(sent.on_publish, weak=False, dispatch_uid=uid)
    task_prerun.connect(sent.on_prerun, weak=False, dispatch_uid=uid)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(dispatch_uid=uid)
        task_prerun.disconnect(dispatch_uid=uid)


def check_calls(store: Any, sent: SentCalls, keyed: bool | None = None) -> list[Violation]:
    """The invariant violations of the calls in ``sent``, from ``store`` and this process's
    effect ledger. A call counts as keyed (its effect must be applied once if it completed)
    when ``keyed`` says so, else when the ledger saw it try its effect."""
    entries = effects.entries()
    tried = {e["call_id"] for e in entries if e["kind"] == "effect"}
    calls = [Call(c.call_id, c.delivery, c.max_attempts, c.call_id in tried if keyed is None else keyed,
                  c.on_lost_lease, c.task) for c in sent.calls()]
    if not calls:
        return []
    config = sent.app.tasks[calls[0].task].guard_config  # the stalled-attempt windows of its guard
    return check_history(store, entries, calls, heartbeat_s=config.heartbeat_period_s, lease_ttl_s=config.lease_ttl_s)


# -- apps, Redis ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def aaa_app_module(pytestconfig: pytest.Config) -> str:
    """Your Celery app as ``celery -A`` takes it: ``--aaa-app``, else the ``aaa_app`` ini value."""
    name = pytestconfig.getoption("aaa_app") or pytestconfig.getini("aaa_app")
    if not name:
        raise pytest.UsageError("aaa_celery's fixtures need your Celery app: pass --aaa-app proj.celery, set "
                                "aaa_app = proj.celery in the ini file, or override the aaa_app_module fixture")
    return str(name)


@pytest.fixture(scope="session")
def aaa_app(aaa_app_module: str) -> Any:
    """Your Celery app object, imported in the test process."""
    from celery.app.utils import find_app

    return find_app(aaa_app_module)


@pytest.fixture(scope="session")
def aaa_redis_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """A Redis for the fleet: yours (``--aaa-redis-url``, ``$AAA_TEST_REDIS_URL``; it is
    flushed before each test), else a throwaway ``redis-server`` for the session."""
    url = pytestconfig.getoption("aaa_redis_url") or os.environ.get(REDIS_ENV)
    if url:
        yield url
        return
    try:
        server = ThrowawayRedis()
    except RedisUnavailable as e:
        pytest.skip(str(e))
    try:
        yield server.url
    finally:
        server.stop()


def _flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


# -- eager mode -----------------------------------------------------------------------------


class Eager:
    """Your app in eager mode on a fresh in-memory store: ``.app``, ``.store``, ``.check()``."""

    def __init__(self, app: Any, store: Any, sent: SentCalls) -> None:
        self.app, self.store, self.sent = app, store, sent

    def violations(self, keyed: bool | None = None) -> list[Violation]:
        return check_calls(self.store, self.sent, keyed)


@pytest.fixture
def aaa_eager(aaa_app: Any, aaa_sent: SentCalls, monkeypatch: pytest.MonkeyPatch) -> Iterator[Eager]:
    from ..worker.stores import app_store

    conf = aaa_app.conf
    saved = {k: conf.get(k) for k in ("task_always_eager", "aaa_store_url")}
    monkeypatch.delenv(effects.LEDGER_ENV, raising=False)
    conf.update(task_always_eager=True, aaa_store_url=f"memory://aaa-test-{uuid.uuid4().hex}")
    effects.clear()
    try:
        yield Eager(aaa_app, app_store(aaa_app), aaa_sent)
    finally:
        conf.update(saved)


# -- a fleet of real workers ------------------------------------------------------------------


class GuardedFleet(Fleet):
    """:class:`~aaa_celery.testing.Fleet` of your app on the test's Redis, with faults aimed
    at a call's holder (read from the store's attempt records, never guessed)."""

    app: Any
    store: Any
    sent: SentCalls

    def attempts(self, call_id: str) -> list[Any]:
        """The call's attempt records (``aaa.tool.started`` events), oldest first."""
        return [e for e in self.store.events(call_id) if e.type == STARTED]

    def wait_started(self, call: Any, attempt: int = 1, timeout_s: float = 30.0) -> Any:
        """Wait until attempt ``attempt`` of ``call`` (an ``AsyncResult`` or an id) has started."""
        call_id = getattr(call, "id", call)
        return wait_for(lambda: next((e for e in self.attempts(call_id) if e.attempt >= attempt), None),
                        timeout_s, f"attempt {attempt} of {call_id}")

    def holder(self, call: Any) -> tuple[WorkerProcess, int]:
        """The worker and the process (pool child, or the worker itself) of the call's newest attempt."""
        self.wait_started(call)
        last = self.attempts(getattr(call, "id", call))[-1]
        pid = int(str(last.data.get("worker", "")).split("/")[1])
        return self.worker_of(pid), pid

    def kill_holder(self, call: Any, *, whole_worker: bool = True) -> WorkerProcess:
        """``kill -9`` the worker running the call (``whole_worker=False``: only its pool child)."""
        worker, pid = self.holder(call)
        if whole_worker or pid == worker.pid:
            worker.kill()
        else:
            kill_child(worker, pid)
        return worker

    def freeze_holder(self, call: Any) -> Frozen:
        """``SIGSTOP`` the worker running the call (and its pool); ``.thaw()`` it later (the
        fleet thaws it when it stops)."""
        return freeze(self.holder(call)[0])

    def duplicate(self, call: Any) -> Any:
        """Send the call's message again under its id (a broker redelivery, a client retry)."""
        call_id = getattr(call, "id", call)
        name, args, kwargs = self.sent.sent[call_id]
        return duplicate_delivery(self.app, call_id, name, args, kwargs)

    def violations(self, keyed: bool | None = None) -> list[Violation]:
        return check_calls(self.store, self.sent, keyed)


class FleetStarter:
    """What ``aaa_fleet`` gives: call it to start a :class:`GuardedFleet`; ``.store`` is the
    store of every fleet it starts."""

    def __init__(self, module: str, app: Any, store: Any, sent: SentCalls, env: dict[str, str],
                 workdir: Path) -> None:
        self.module, self.app, self.store, self.sent, self.env, self.workdir = module, app, store, sent, env, workdir
        self.started: list[GuardedFleet] = []

    def __call__(self, size: int = 2, **options: Any) -> GuardedFleet:
        """Start ``size`` workers (``pool``, ``concurrency``, ``queues``, ``extra_args`` ... as
        :class:`~aaa_celery.testing.WorkerProcess` takes them) and wait until each is ready."""
        n = len(self.started)
        fleet = GuardedFleet(self.module, size=size, env={**self.env, **options.pop("env", {})}, cwd=Path.cwd(),
                             prefix=f"w{n}-", workdir=self.workdir / f"aaa-fleet-{n}", **options)
        fleet.app, fleet.store, fleet.sent = self.app, self.store, self.sent
        self.started.append(fleet)
        fleet.start()
        return fleet

    def stop(self) -> None:
        for fleet in self.started:
            fleet.stop()


@pytest.fixture
def aaa_fleet(aaa_app_module: str, aaa_app: Any, aaa_redis_url: str, aaa_sent: SentCalls, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[FleetStarter]:
    from ..stores import open_store

    _flush(aaa_redis_url)
    env = {"CELERY_BROKER_URL": aaa_redis_url, "CELERY_RESULT_BACKEND": aaa_redis_url,
           "AAA_STORE_URL": aaa_redis_url, effects.LEDGER_ENV: aaa_redis_url}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _reconnect(aaa_app)
    effects.clear()
    starter = FleetStarter(aaa_app_module, aaa_app, open_store(aaa_redis_url), aaa_sent, env, tmp_path)
    try:
        yield starter
    finally:
        report = request.node.stash.get(_CALL_REPORT, None)
        if report is not None and report.failed:  # the workers' logs, beside the failure
            for fleet in starter.started:
                print(fleet.logs())
        starter.stop()
        with contextlib.suppress(Exception):
            starter.store.close()
        _reconnect(aaa_app)


def _reconnect(app: Any) -> None:
    """Drop the app's broker pool and result backend of this thread, so that they are made
    again from the settings now in force (the test's Redis, or back to yours)."""
    app.close()
    with contextlib.suppress(AttributeError):
        del app._local.backend


# -- the checker --------------------------------------------------------------------------------


@pytest.fixture
def aaa_check(request: pytest.FixtureRequest) -> Any:
    """``aaa_check(keyed=None)``: fail the test with every invariant violation of the guarded
    calls it sent (on the fleet if the test uses ``aaa_fleet``, else eagerly). ``keyed=True``
    demands that every completed call applied its keyed effect."""

    def check(keyed: bool | None = None) -> None:
        if "aaa_fleet" in request.fixturenames:
            starter: FleetStarter = request.getfixturevalue("aaa_fleet")
            found = check_calls(starter.store, starter.sent, keyed)
        else:
            found = request.getfixturevalue("aaa_eager").violations(keyed)
        if found:
            raise AssertionError("guard invariants violated:\n" + "\n".join(f"  {v}" for v in found))

    return check
