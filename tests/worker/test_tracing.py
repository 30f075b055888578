"""Attempt spans (aaa_tracing) under Celery's own ``run/<task>`` span, from
opentelemetry-instrumentation-celery, caught by the SDK's in-memory span exporter."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.instrumentation.celery")

from celery import Celery  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.instrumentation.celery import CeleryInstrumentor  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from aaa_celery import GuardConfig, GuardedTask, OutcomeUnknown, ToolContext  # noqa: E402
from aaa_celery.lifecycle import CallSpec  # noqa: E402
from aaa_celery.stores.memory import MemoryStore  # noqa: E402
from aaa_celery.worker.stores import use_store  # noqa: E402

EXPORTER = InMemorySpanExporter()


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def provider():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)  # once per process; our spans use the global provider
    CeleryInstrumentor().instrument(tracer_provider=provider)
    yield provider
    CeleryInstrumentor().uninstrument()


@pytest.fixture
def app(provider):
    app = Celery("traced", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(aaa_store_url="memory://", aaa_tracing=True, task_serializer="json",
                    result_serializer="json", accept_content=["json"])
    clock = Clock()
    store = MemoryStore(clock=clock)
    use_store(app, store)

    @app.task(base=GuardedTask, name="traced.add", shared=False, guard={"lease_ttl_s": 5})
    def add(x: int, ctx: ToolContext) -> int:
        with trace.get_tracer("user").start_as_current_span("inside the tool"):
            return x + ctx.attempt

    @app.task(base=GuardedTask, name="traced.pay", shared=False, delivery="at_most_once", guard={"lease_ttl_s": 5})
    def pay(x: int) -> int:
        return x

    app.aaa_clock, app.aaa_store = clock, store  # type: ignore[attr-defined]
    EXPORTER.clear()
    return app


def spans(name: str):
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def test_an_attempt_span_sits_under_celerys_run_span_with_the_call(app):
    assert app.tasks["traced.add"].apply(args=(1,), task_id="call-1").get() == 2
    (run,) = spans("run/traced.add")
    (attempt,) = spans("aaa.attempt traced.add")
    (inner,) = spans("inside the tool")
    assert attempt.parent.span_id == run.context.span_id
    assert inner.parent.span_id == attempt.context.span_id  # current while the body runs
    assert dict(attempt.attributes) == {"aaa.call_id": "call-1", "aaa.tool": "traced.add", "aaa.attempt": 1,
                                        "aaa.delivery": "at_least_once", "aaa.outcome": "completed"}


def test_a_takeover_is_attempt_2_and_a_lost_at_most_once_call_is_refused(app):
    # attempt 1 of each call lost its worker (its lease lapsed)
    for name in ("traced.add", "traced.pay"):
        app.aaa_store.begin(CallSpec(f"lost-{name}", name), "dead/1/1", GuardConfig(lease_ttl_s=5))
    app.aaa_clock.t += 10

    assert app.tasks["traced.add"].apply(args=(1,), task_id="lost-traced.add").get() == 3
    (attempt,) = spans("aaa.attempt traced.add")
    assert attempt.attributes["aaa.attempt"] == 2 and attempt.attributes["aaa.outcome"] == "completed"

    with pytest.raises(OutcomeUnknown):
        app.tasks["traced.pay"].apply(args=(1,), task_id="lost-traced.pay").get()
    (refused,) = spans("aaa.attempt traced.pay")
    assert refused.attributes["aaa.outcome"] == "refused" and refused.attributes["aaa.error"] == "OutcomeUnknown"
    assert refused.attributes["aaa.delivery"] == "at_most_once"
    assert refused.status.status_code == trace.StatusCode.ERROR


def test_without_the_setting_there_is_no_attempt_span(app):
    app.conf.aaa_tracing = False
    app.tasks["traced.add"].apply(args=(1,), task_id="call-3").get()
    assert spans("run/traced.add") and not spans("aaa.attempt traced.add")
