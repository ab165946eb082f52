"""Observability against the emulator process: Prometheus scraped during a fan_out,
OpenTelemetry spans (SDK in-memory exporter), progress in `astream_events`."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from langgraph_batch import metrics
from langgraph_batch._observe import tracing
from langgraph_batch._observe.progress import FAN_OUT_EVENT
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import BackendConnectionError
from tests.integration.test_fan_out_200 import KEYS, MODEL, Probe, build, docs, parent_graph

pytestmark = [
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": False})


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_prometheus_endpoint_scraped_during_and_after_a_fan_out(
    emulator_url: str,
) -> None:
    registry = CollectorRegistry()
    server, _ = metrics.serve(0, registry=registry)
    port = server.server_port
    n = 60
    try:
        box: list[Probe] = []
        agent, llm = build(emulator_url, box)
        scheduler = llm.get_scheduler()
        box.append(Probe(scheduler))
        before = await asyncio.to_thread(_scrape, port)
        run = asyncio.create_task(
            parent_graph(agent, scheduler=scheduler).ainvoke({"docs": docs(n)})
        )
        during: list[dict[Any, float]] = []
        while not run.done():
            during.append(await asyncio.to_thread(_scrape, port))
            await asyncio.sleep(0.05)
        out = await run
        after = await asyncio.to_thread(_scrape, port)
    finally:
        await asyncio.to_thread(server.shutdown)
        metrics.disable(registry)
    assert len(out["reviews"]) == n
    name = scheduler.name
    # Mid-run: a scrape saw siblings started but not all finished, and requests on the wire.
    mid = [
        s for s in during if 0 < _value(s, "lgb_fan_out_siblings_finished_total", node="review") < n
    ]
    assert mid, "no scrape landed mid-run"
    assert any(_value(s, "lgb_scheduler_in_flight", scheduler=name) > 0 for s in during)
    assert all(_value(s, "lgb_scheduler_inflight_limit", scheduler=name) >= 1 for s in mid)
    # After: the counts are what the run did.
    assert _value(after, "lgb_fan_out_siblings_started_total", node="review") == n
    assert _value(after, "lgb_fan_out_siblings_finished_total", node="review") == n
    assert _value(after, "lgb_fan_out_siblings_failed_total", node="review") == 0
    completed = _value(after, "lgb_scheduler_completed_total", scheduler=name)
    assert completed == 2 * n  # a tool turn and an answer per sibling
    assert _value(after, "lgb_scheduler_dispatched_total", scheduler=name) >= completed
    assert _value(after, "lgb_scheduler_queue_wait_seconds_count", scheduler=name) == completed
    assert (
        _value(after, "lgb_scheduler_request_duration_seconds_count", scheduler=name) == completed
    )
    prompt = _value(after, "lgb_scheduler_tokens_total", scheduler=name, kind="prompt")
    assert prompt == scheduler.stats().prompt_tokens > 0
    assert _value(after, "lgb_scheduler_queued", scheduler=name) == 0
    requested = _value(after, "lgb_tool_calls_requested_total", tool="lookup") - _value(
        before, "lgb_tool_calls_requested_total", tool="lookup"
    )
    executed = _value(after, "lgb_tool_calls_executed_total", tool="lookup") - _value(
        before, "lgb_tool_calls_executed_total", tool="lookup"
    )
    assert (requested, executed) == (n, KEYS)


spans_provider = TracerProvider()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = spans_provider
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # OpenTelemetry's global provider can be set only once per process: give the
    # library this one for the module instead.
    previous = tracing.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.set_tracer_provider(previous)
        provider.shutdown()


async def test_opentelemetry_spans_follow_genai_conventions_and_nest(
    emulator_url: str, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    n = 6
    box: list[Probe] = []
    agent, llm = build(emulator_url, box)
    scheduler = llm.get_scheduler()
    box.append(Probe(scheduler))
    items = [f"review doc #{i} key=k{i % 2}" for i in range(n)]
    # The app's own span, from the same provider: the calls' spans nest under it.
    with spans_provider.get_tracer("app").start_as_current_span("app run") as root:
        out = await parent_graph(agent, scheduler=scheduler).ainvoke({"docs": items})
    assert len(out["reviews"]) == n
    finished = spans.get_finished_spans()
    chats = [s for s in finished if s.name == f"chat {MODEL}"]
    assert len(chats) == 2 * n
    trace_id = root.get_span_context().trace_id
    for span in chats:
        attrs = span.attributes or {}
        assert span.kind == trace.SpanKind.CLIENT
        assert span.context.trace_id == trace_id  # nested under the app's span
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "vllm"
        assert attrs["gen_ai.request.model"] == MODEL
        assert attrs["gen_ai.request.max_tokens"] == 256
        assert attrs["gen_ai.usage.input_tokens"] > 0
        assert attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["gen_ai.response.finish_reasons"] in (("stop",), ("tool_calls",), ("length",))
        assert attrs["lgb.queue_wait_s"] >= 0
        assert attrs["lgb.backend_latency_s"] > 0
        assert attrs["lgb.scheduler"] == scheduler.name
    assert sorted({s.attributes["lgb.sibling.index"] for s in chats}) == list(range(n))  # type: ignore[index]
    assert sorted(s.attributes["lgb.sibling.turn"] for s in chats) == [0] * n + [1] * n  # type: ignore[index]
    tools = [s for s in finished if s.name == "execute_tool lookup"]
    assert 1 <= len(tools) <= 2  # two keys; a later caller may reuse a kept result
    for span in tools:
        attrs = span.attributes or {}
        assert attrs["gen_ai.tool.name"] == "lookup"
        assert attrs["lgb.coalesce.followers"] >= 0
        assert span.context.trace_id == trace_id


async def test_a_failed_call_span_has_error_status(spans: InMemorySpanExporter) -> None:
    spans.clear()
    llm = BatchedChatModel(model="m", base_url="vllm://127.0.0.1:9", max_retries=0)
    with pytest.raises(BackendConnectionError):
        await llm.ainvoke("hi")
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "BackendConnectionError"


async def test_progress_reaches_astream_events_once_and_queue_wait_in_metadata(
    emulator_url: str,
) -> None:
    n = 4
    box: list[Probe] = []
    # langchain's create_agent: the prebuilt create_react_agent runs a sync
    # prompt step whose callbacks block the loop under astream_events.
    agent, llm = build(emulator_url, box, create_agent=True)
    scheduler = llm.get_scheduler()
    box.append(Probe(scheduler))
    graph = parent_graph(agent, scheduler=scheduler)
    progress: list[dict[str, Any]] = []
    waits: list[float] = []
    async for event in graph.astream_events({"docs": docs(n)}, version="v2"):
        if event["event"] == "on_custom_event" and event["name"] == FAN_OUT_EVENT:
            progress.append(event["data"])
        elif event["event"] == "on_chat_model_end":
            waits.append(event["data"]["output"].response_metadata["queue_wait_s"])
    kinds = [e["event"] for e in progress]
    assert kinds[0] == "started"
    assert kinds[-1] == "done"
    assert kinds.count("sibling_started") == kinds.count("sibling_finished") == n
    assert progress[-1]["done"] == n
    assert len(waits) == 2 * n
    assert all(w >= 0 for w in waits)
    # stream_mode="custom" still gets each event once (not a second copy).
    custom = [
        data
        async for data in graph.astream({"docs": docs(n)}, stream_mode="custom")
        if isinstance(data, dict) and data.get("type") == FAN_OUT_EVENT
    ]
    assert [e["event"] for e in custom] == kinds
    # And a plain call carries its queue wait too.
    message = await llm.ainvoke([HumanMessage("review doc #0 key=k0")])
    assert message.response_metadata["queue_wait_s"] >= 0


class _Collect(BaseCallbackHandler):
    """A sync callback handler, as a tracer or a logging handler would be."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == FAN_OUT_EVENT:
            self.events.append(data["event"])


async def test_a_sync_graph_delivers_progress_to_callback_handlers(emulator_url: str) -> None:
    n = 3
    box: list[Probe] = []
    agent, llm = build(emulator_url, box, create_agent=True)
    box.append(Probe(llm.get_scheduler()))
    graph = parent_graph(agent)
    handler = _Collect()
    # graph.invoke: the fan_out node runs in a thread, its siblings on the background loop.
    out = await asyncio.to_thread(graph.invoke, {"docs": docs(n)}, {"callbacks": [handler]})
    assert len(out["reviews"]) == n
    assert handler.events[0] == "started"
    assert handler.events[-1] == "done"
    assert handler.events.count("sibling_finished") == n
