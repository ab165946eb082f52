"""OpenTelemetry spans for scheduled LLM calls and coalesced tool executions.

With `opentelemetry-api` importable (extra `otel`), every call through a
`Scheduler` is a CLIENT span named `chat {model}` carrying the GenAI semantic
conventions (`gen_ai.operation.name`, `gen_ai.provider.name`,
`gen_ai.request.model`, `gen_ai.request.max_tokens`, `gen_ai.response.id`,
`gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens`,
`gen_ai.usage.output_tokens`, `error.type`) and the scheduler's own figures
under `lgb.*`: `lgb.queue_wait_s` (submit to slot), `lgb.backend_latency_s`
(slot to answer, retries included), `lgb.scheduler`, `lgb.sibling.index`,
`lgb.sibling.turn`. The span starts in the caller's context, so it nests
under whatever span the caller (a LangGraph node, your code) has open.

Each coalesced tool execution is an INTERNAL span `execute_tool {name}`
(`gen_ai.operation.name="execute_tool"`, `gen_ai.tool.name`,
`gen_ai.tool.call.id`) with `lgb.coalesce.followers`: the identical calls that
shared it.

Without opentelemetry-api, or with the API but no tracer provider configured
(no SDK set up), no span is made and a call pays one check (see `recording`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_batch._context import SiblingInfo
    from langgraph_batch.backends.base import ChatRequest, ChatResponse

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import (
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
except ImportError:  # optional: no tracing without it
    _trace = None  # type: ignore[assignment]

__all__ = (
    "ENABLED",
    "CallSpan",
    "call_span",
    "recording",
    "set_tracer_provider",
    "tool_span",
)

ENABLED = _trace is not None
"""Whether opentelemetry-api is importable (spans are made)."""

_TRACER_NAME = "langgraph_batch"
_PROVIDERS = {"VLLMBackend": "vllm", "SGLangBackend": "sglang"}
_REQUEST_PARAMS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
}


_provider: Any = None
_cached: tuple[Any, Any] = (None, None)
"""(provider, its tracer): `get_tracer` is not free, the provider rarely changes."""


def set_tracer_provider(provider: Any) -> Any:
    """Use `provider` instead of OpenTelemetry's global one (None: the global again).

    For tests and apps that keep a provider of their own; returns the previous one.
    """
    global _provider
    previous, _provider = _provider, provider
    return previous


def _tracer() -> Any:
    """The tracer to use, or None while no SDK is configured (the API alone records nothing)."""
    global _cached
    if _trace is None:
        return None
    provider = _provider if _provider is not None else _trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        return None
    cached_provider, tracer = _cached
    if cached_provider is not provider:
        tracer = provider.get_tracer(_TRACER_NAME)
        _cached = (provider, tracer)
    return tracer


def recording() -> bool:
    """Whether spans are made now: opentelemetry-api importable and a provider configured.

    With only the API installed (often a transitive dependency) and no SDK
    set up, calls skip the span machinery entirely: ~1 µs, not ~70.
    """
    return _tracer() is not None


def provider_of(backend: object) -> str:
    """`gen_ai.provider.name` for a backend: vllm, sglang, else openai (its API)."""
    return _PROVIDERS.get(type(backend).__name__, "openai")


class CallSpan:
    """The span of one scheduled call; `ok` or `failed` ends what `call_span` opened."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def ok(self, response: ChatResponse, backend_latency: float) -> None:
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute("gen_ai.response.model", response.model)
        if response.id:
            span.set_attribute("gen_ai.response.id", response.id)
        if response.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", (response.finish_reason,))
        usage = response.usage
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            if usage.cached_tokens is not None:
                span.set_attribute("lgb.usage.cached_tokens", usage.cached_tokens)
        if response.queue_wait_s is not None:
            span.set_attribute("lgb.queue_wait_s", response.queue_wait_s)
        span.set_attribute("lgb.backend_latency_s", backend_latency)

    def failed(self, exc: BaseException) -> None:
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


@contextlib.contextmanager
def call_span(
    scheduler: str,
    provider: str,
    request: ChatRequest,
    sibling: SiblingInfo | None,
) -> Iterator[CallSpan | None]:
    """Open the span of one scheduled call (None when tracing is unavailable)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": request.model,
        "lgb.scheduler": scheduler,
    }
    _request_attributes(request.params, attributes)
    if request.request_id:
        attributes["lgb.request_id"] = request.request_id
    if sibling is not None:
        attributes["lgb.sibling.index"] = sibling.index
        attributes["lgb.sibling.turn"] = sibling.turn
    with tracer.start_as_current_span(
        f"chat {request.model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield CallSpan(span)


def _request_attributes(params: Mapping[str, Any], out: dict[str, Any]) -> None:
    for param, attribute in _REQUEST_PARAMS.items():
        value = params.get(param)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[attribute] = value


@contextlib.contextmanager
def tool_span(name: str, call_id: str | None) -> Iterator[Any]:
    """Open the span of one coalesced tool execution (None when tracing is unavailable)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    with tracer.start_as_current_span(
        f"execute_tool {name}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span
