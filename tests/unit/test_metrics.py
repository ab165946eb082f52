"""`langgraph_batch.metrics` and the `_observe` seam: names, labels, counts.

A real `Scheduler` over a fake backend feeds the metrics; the registry is a
fresh `CollectorRegistry` per test (the default one is never touched here).
The scrape of a live fan_out against the emulator is in
tests/integration/test_observability.py.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from langgraph_batch import metrics
from langgraph_batch._observe import sinks
from langgraph_batch.errors import BackendBadRequestError, BackendServerError
from langgraph_batch.scheduler import BatchPolicy, RetryPolicy, Scheduler
from tests.fakes.backends import GatedBackend, InstantBackend, request


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    reg = CollectorRegistry()
    metrics.enable(reg)
    yield reg
    metrics.disable(reg)


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


def test_enable_is_idempotent_and_disable_unregisters() -> None:
    reg = CollectorRegistry()
    assert metrics.enable(reg) is reg
    assert metrics.enable(reg) is reg  # a second enable registers nothing twice
    assert sinks.active()
    text = generate_latest(reg).decode()
    for name in (
        "lgb_scheduler_dispatched_total",
        "lgb_scheduler_queue_wait_seconds",
        "lgb_fan_out_siblings_started_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text
    metrics.disable(reg)
    metrics.disable(reg)  # no-op
    assert not sinks.active()
    assert "lgb_" not in generate_latest(reg).decode()
    metrics.enable(reg)  # and again after disable
    metrics.disable(reg)


async def test_calls_are_counted_with_tokens_and_latencies(registry: CollectorRegistry) -> None:
    async with Scheduler(InstantBackend(), policy=BatchPolicy(inflight_limit=4)) as s:
        for i in range(3):
            await s.submit(request(f"r{i}"))
        name = s.name
        # Read at scrape time, while the scheduler lives.
        assert _value(registry, "lgb_scheduler_queued", scheduler=name) == 0
        assert _value(registry, "lgb_scheduler_in_flight", scheduler=name) == 0
        assert _value(registry, "lgb_scheduler_inflight_limit", scheduler=name) >= 1
    assert _value(registry, "lgb_scheduler_dispatched_total", scheduler=name) == 3
    assert _value(registry, "lgb_scheduler_completed_total", scheduler=name) == 3
    tokens = {
        kind: _value(registry, "lgb_scheduler_tokens_total", scheduler=name, kind=kind)
        for kind in ("prompt", "completion", "cached")
    }
    assert tokens == {"prompt": 9, "completion": 6, "cached": 3}
    for hist in ("lgb_scheduler_queue_wait_seconds", "lgb_scheduler_request_duration_seconds"):
        assert _value(registry, f"{hist}_count", scheduler=name) == 3
        assert _value(registry, f"{hist}_sum", scheduler=name) >= 0


async def test_retries_and_failures_by_error_type(registry: CollectorRegistry) -> None:
    backend = GatedBackend(open_gate=True)
    backend.failures["retried"] = [BackendServerError("503")]
    backend.failures["refused"] = [BackendBadRequestError("400")]
    policy = BatchPolicy(
        inflight_limit=2, retry=RetryPolicy(initial_interval=0.0, max_interval=0.0)
    )
    async with Scheduler(backend, policy=policy) as s:
        await s.submit(request("retried"))
        with pytest.raises(BackendBadRequestError):
            await s.submit(request("refused"))
        name = s.name
    assert (
        _value(
            registry, "lgb_scheduler_retries_total", scheduler=name, error_type="BackendServerError"
        )
        == 1
    )
    assert (
        _value(
            registry,
            "lgb_scheduler_failures_total",
            scheduler=name,
            error_type="BackendBadRequestError",
        )
        == 1
    )
    assert _value(registry, "lgb_scheduler_completed_total", scheduler=name) == 1
    assert _value(registry, "lgb_scheduler_dispatched_total", scheduler=name) == 3


def test_sibling_and_batch_events(registry: CollectorRegistry) -> None:
    for event in ("started", "started", "finished", "failed", "unknown"):
        sinks.sibling("review", event)
    sinks.batch("s1", 8)
    assert _value(registry, "lgb_fan_out_siblings_started_total", node="review") == 2
    assert _value(registry, "lgb_fan_out_siblings_finished_total", node="review") == 1
    assert _value(registry, "lgb_fan_out_siblings_failed_total", node="review") == 1
    assert _value(registry, "lgb_scheduler_batch_size_count", scheduler="s1") == 1
    assert _value(registry, "lgb_scheduler_batch_size_sum", scheduler="s1") == 8


def test_scheduler_label_never_carries_user_info(registry: CollectorRegistry) -> None:
    sinks.dispatch("vllm://alice:s3cret@10.0.0.5:8000|key=ab12")
    text = generate_latest(registry).decode()
    assert "s3cret" not in text
    assert "alice" not in text
    assert (
        _value(
            registry, "lgb_scheduler_dispatched_total", scheduler="vllm://10.0.0.5:8000|key=ab12"
        )
        == 1
    )


def test_a_failing_sink_is_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    class Broken:
        def on_dispatch(self, scheduler: str) -> None:
            calls.append(scheduler)
            raise RuntimeError("sink bug")

    sink = Broken()
    sinks.subscribe(sink)
    sinks.subscribe(sink)  # idempotent
    with caplog.at_level(logging.WARNING, logger="langgraph_batch._observe.sinks"):
        sinks.dispatch("s")  # must not raise
        sinks.dispatch("s")  # dropped after the first failure
    assert calls == ["s"]
    assert "Broken" in caplog.text
    assert "unsubscribed" in caplog.text
    assert not sinks.active()


def test_nothing_is_observed_when_no_sink_listens() -> None:
    assert not sinks.active()

    class Counting:
        n = 0

        def on_call(self, call: sinks.CallRecord) -> None:
            Counting.n += 1

    # Without subscribers the calls are no-ops (and build no record).
    sinks.call("s", 0.0, 0.0, None)
    sink = Counting()
    sinks.subscribe(sink)
    sinks.call("s", 0.0, 0.0, None)
    sinks.unsubscribe(sink)
    sinks.call("s", 0.0, 0.0, None)
    assert Counting.n == 1


NO_OTEL = """
import sys
sys.modules["opentelemetry"] = None
import asyncio
from langgraph_batch._observe import tracing
from langgraph_batch.scheduler import Scheduler
from tests.fakes.backends import InstantBackend, request

async def go():
    async with Scheduler(InstantBackend()) as s:
        resp = await s.submit(request("r"))
    print(tracing.ENABLED, resp.content, resp.queue_wait_s is not None)

asyncio.run(go())
"""


def test_without_opentelemetry_calls_work_and_make_no_spans() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_OTEL], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "answer", "to", "r", "True"]


@pytest.fixture
def sdk_provider() -> tuple[Any, Any]:
    # Built outside the event loop: the SDK's resource detection blocks.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_spans_only_once_a_tracer_provider_is_configured(
    sdk_provider: tuple[Any, Any],
) -> None:
    from langgraph_batch._observe import tracing

    provider, exporter = sdk_provider
    # The API alone (no SDK set up) records nothing: calls skip the span machinery.
    assert tracing.ENABLED
    assert not tracing.recording()
    previous = tracing.set_tracer_provider(provider)
    try:
        assert tracing.recording()
        async with Scheduler(InstantBackend()) as s:
            await s.submit(request("r"))
    finally:
        tracing.set_tracer_provider(previous)
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat m"
    attrs = span.attributes or {}
    assert attrs["gen_ai.usage.input_tokens"] == 3
    assert attrs["gen_ai.response.id"] == "chatcmpl-r"
    assert attrs["lgb.scheduler"] == s.name
    assert not tracing.recording()


async def test_gauges_skip_closed_schedulers_and_sum_a_shared_name(
    registry: CollectorRegistry,
) -> None:
    # A closed scheduler of the same name (an earlier asyncio.run) must not hide the live one.
    async with Scheduler(InstantBackend(), policy=BatchPolicy(inflight_limit=5), name="dup"):
        pass
    backend = GatedBackend()
    async with (
        Scheduler(backend, policy=BatchPolicy(inflight_limit=3), name="dup") as a,
        Scheduler(InstantBackend(), policy=BatchPolicy(inflight_limit=4), name="dup"),
    ):
        call = asyncio.ensure_future(a.submit(request("held")))
        await backend.wait_running(1)
        assert _value(registry, "lgb_scheduler_in_flight", scheduler="dup") == 1
        assert _value(registry, "lgb_scheduler_inflight_limit", scheduler="dup") == 7
        backend.gate.set()
        await call
    assert registry.get_sample_value("lgb_scheduler_in_flight", {"scheduler": "dup"}) is None
