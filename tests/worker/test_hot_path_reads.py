"""The hot path's cheap reads give the answers of the slow ones they replace.

``worker.conf.setting`` stands for ``app.conf.get`` on every guarded delivery, and
``protocol.check_id`` skips its per-character check for ASCII printable ids: both must
agree with what they replace, for every spelling of a setting and every ASCII character.
"""

from __future__ import annotations

import pytest
from celery import Celery

from aaa_celery.errors import InvalidId
from aaa_celery.protocol import check_call_id
from aaa_celery.worker.conf import setting


class _Namespaced:
    AAA_STORE_URL = "redis://from-namespace/0"
    AAA_TRACING = True
    AAA_BROKER_URL = "redis://broker/0"


NAMES = ["aaa_store_url", "aaa_tracing", "aaa_store_options", "aaa_task_events", "broker_url",
         "task_serializer", "CELERY_TASK_SERIALIZER", "BROKER_URL", "store_url", "tracing"]


def _apps() -> list[Celery]:
    plain = Celery("plain", broker="memory://", set_as_current=False)
    plain.conf.update(aaa_store_url="redis://plain/0", aaa_task_events=False)
    namespaced = Celery("ns", set_as_current=False)
    namespaced.config_from_object(_Namespaced, namespace="AAA")
    pending = Celery("pending", set_as_current=False)  # its conf not loaded before the first read
    pending.conf.aaa_tracing = 1
    return [plain, namespaced, pending]


@pytest.mark.parametrize("app", _apps(), ids=["plain", "namespaced", "pending"])
def test_setting_answers_as_conf_get(app):
    for name in NAMES:
        assert setting(app, name) == app.conf.get(name), name
        assert setting(app, name, "dflt") == app.conf.get(name, "dflt"), name


def test_setting_sees_a_change_made_at_run_time():
    app = _apps()[0]
    assert setting(app, "aaa_tracing") is None
    app.conf.aaa_tracing = True
    assert setting(app, "aaa_tracing") is True
    app.conf.aaa_tracing = False
    assert setting(app, "aaa_tracing") is False


@pytest.mark.parametrize("code", range(128))
def test_every_ascii_character_is_judged_as_before(code):
    """The fast path refuses exactly the characters the per-character check refused (Cc)."""
    value = f"call{chr(code)}1"
    if code < 32 or code == 127:
        with pytest.raises(InvalidId, match="control or format"):
            check_call_id(value)
    else:
        assert check_call_id(value) == value
