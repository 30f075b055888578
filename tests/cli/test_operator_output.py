"""What the command line prints for an operator reads as meant (issue 42, item 6).

Red on 03c27cd: ``aaa calls`` showed a holder as ``host/pid/<thread ident>``; with nothing to
list it printed only the header; ``aaa show`` gave a lost attempt's end without saying it is
when the loss was found; ``bind(app)``'s prefetch warning pointed at
``aaa_celery/tools/handler.py``, not at the user's line.
"""

from __future__ import annotations

import uuid
import warnings

import pytest
from celery import Celery

from aaa_celery.config import GuardConfig
from aaa_celery.stores import open_store

from ..stores.conftest import lose_lease
from . import cli_app
from .test_cli import cli, spec

pytestmark = pytest.mark.redis


@pytest.fixture
def store_url(redis_url: str) -> str:
    cli_app.app.conf.aaa_store_url = redis_url
    if hasattr(cli_app.app, "_aaa_store"):
        del cli_app.app._aaa_store
    return redis_url


def test_calls_shows_the_holder_as_host_and_pid(store_url):
    store = open_store(store_url)
    call = f"held-{uuid.uuid4().hex[:8]}"
    store.begin(spec(call, "report"), "w2@vm/30913/140319666613120", GuardConfig(lease_ttl_s=60))
    output = cli("calls", "--state", "running").output
    line = next(row for row in output.splitlines() if row.startswith(call))
    assert "w2@vm pid 30913" in line and "140319666613120" not in line, output
    store.close()


def test_calls_with_nothing_to_list_says_so(store_url):
    result = cli("calls", "--tool", "no-such-tool")
    assert result.exit_code == 0
    assert result.output.strip() == "no calls match --tool no-such-tool in the redis store", result.output


def test_show_says_a_lost_attempts_end_is_when_the_loss_was_found(store_url):
    store = open_store(store_url)
    call = f"lost-{uuid.uuid4().hex[:8]}"
    first = store.begin(spec(call, "report"), "hostA/111/1", GuardConfig(lease_ttl_s=0.3))
    lose_lease(store, first.lease)
    store.begin(spec(call, "report"), "hostB/222/1", GuardConfig(lease_ttl_s=60))
    output = cli("show", call).output
    assert "lost (taken over by attempt 2)" in output, output
    assert "a lost attempt's end is when the store found its lease lapsed" in output, output
    store.close()


def test_the_prefetch_warning_points_at_the_users_bind_line(redis_url):
    from aaa_celery.tools import ToolHandler, ToolRegistry, tool

    @tool
    def ping() -> str:
        return "pong"

    app = Celery("prefetch_warning", broker=redis_url, set_as_current=False)
    app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                    worker_prefetch_multiplier=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ToolHandler(ToolRegistry([ping])).bind(app)
    found = [w for w in caught if "worker_prefetch_multiplier" in str(w.message)]
    assert found and found[0].filename == __file__, [(w.filename, w.lineno) for w in found]
