"""The backend contract: what the scheduler sends to an inference server.

A backend turns one `ChatRequest` into one `ChatResponse` over HTTP. It
owns its `httpx.AsyncClient` and nothing else: slots, priority, retries and
batching decisions belong to the scheduler. Backends translate every
transport failure into the `langgraph_batch.errors` tree.

The wire format is OpenAI's chat completions: `messages` are OpenAI message
dicts, tools are OpenAI tool dicts. `ChatRequest.params` holds every other
body field (temperature, max_tokens, stop, tools, tool_choice,
response_format, ...) exactly as it goes on the wire.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from langgraph_batch._redact import safe_url
from langgraph_batch.errors import BackendError

__all__ = (
    "Backend",
    "BackendCapabilities",
    "ChatChunk",
    "ChatRequest",
    "ChatResponse",
    "EngineMetrics",
    "ModelInfo",
    "ToolCall",
    "ToolCallChunk",
    "Usage",
)

_DC_KWARGS: dict[str, bool] = {"frozen": True, "slots": True, "kw_only": True}


@dataclass(**_DC_KWARGS)
class ChatRequest:
    """One chat completion call as the scheduler sees it.

    Example:
        ```python
        ChatRequest(
            model="llama",
            messages=[{"role": "user", "content": "hi"}],
            params={"max_tokens": 16, "temperature": 0.0},
            request_id="lgb-sib3-t1-8f2a",
        )
        ```
    """

    model: str
    """The model name sent on the wire."""
    messages: Sequence[Mapping[str, Any]]
    """OpenAI-format message dicts."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Every other body field, as sent (tools, tool_choice, max_tokens, stop, ...)."""
    stream: bool = False
    """Use SSE; the backend calls `on_chunk` per delta."""
    request_id: str = ""
    """Sent as `request_id` / `X-Request-Id` where the server supports it."""
    priority: int = 0
    """Our priority, LOWER runs sooner (vLLM's convention). Backends map it."""
    timeout: float | None = None
    """Read timeout for this call, seconds (None: the backend's default)."""
    stream_chunk_timeout: float | None = None
    """Streaming only: the longest wait between two stream events, seconds
    (None or 0: no limit); `StreamChunkTimeoutError` when it passes."""
    batchable: bool = False
    """True when this request may be merged with others into one HTTP call
    (no tools, no streaming, single turn); set by the caller, used by the
    scheduler only if the backend supports `complete_batch`."""
    route_key: str | None = None
    """Which replica should serve it: an `EndpointPool` sends equal keys to one
    replica, so a conversation finds its cached prefix. Set where the request is
    built (`"sibling:<id>"` inside a fan_out sibling; `Scheduler.submit` fills
    it from its `sibling`; `"task:<hash>"` for a model node inside a subgraph
    that a LangGraph task runs, from its `execution_info`); None routes by the
    conversation's opening messages.
    A router in front of replicas gets the same identity as an opaque session
    key in a header (`SessionConfig`)."""
    turn: int | None = None
    """LLM calls the caller (sibling or conversation) completed before this one
    (None: unknown). Sent only as an engine hint (`SessionConfig.engine_hints`)."""
    retention_s: float | None = None
    """Seconds the caller's KV should be kept after this call: the predicted wait
    of the tool it will likely call next, learned from the run
    (`SiblingInfo.retention_hint`; None: unknown). Sent only as an engine hint
    (`SessionConfig.engine_hints`, vllm-router's `kv_retention_ttl_seconds`)."""
    program: str | None = None
    """The program the caller belongs to: its fan_out run (`SiblingInfo.run_id`, else
    its `group`); None outside a fan_out. Sent only where a server takes a parent
    session (`DynamoBackend`'s `X-Dynamo-Parent-Session-ID`, as an opaque key)."""
    final: bool = False
    """True when this is known to be the caller's last LLM call: a fan_out sibling that
    has called tools and now calls the model with none bound (or `tool_choice="none"`),
    so no tool wait follows. Sent only where a server takes it
    (`DynamoBackend`'s `X-Dynamo-Session-Final`)."""


def sibling_route_key(sibling_id: object) -> str:
    """The `route_key` of every request of one sibling."""
    return f"sibling:{sibling_id}"


def _content_text(message: Any) -> str:
    content = message.get("content") if hasattr(message, "get") else None
    if isinstance(content, str):
        return content
    return json.dumps(content, sort_keys=True, default=str)


def conversation_key(request: ChatRequest) -> str:
    """A hash of the request's model, first system message and first user message.

    Every later turn of a conversation repeats these, so the key names the
    conversation (and the cached prefix) without any context variable. The
    one conversation identity: routing keys a replica by it (`affinity_key`)
    and the scheduler's depth_first priority orders equal turns by when it
    last completed. A stable hash (blake2b), not Python's `hash`, which is
    salted per process: two workers of a distributed fan_out name one
    conversation alike. It holds no text, so remembering many keys keeps no
    task's messages alive.

    Args:
        request: the call.

    Returns:
        `"prefix:<hex>"`. (Not the scheduler's `prefix_key`, which hashes the
        shared system + tools prefix for prefix warming.)
    """
    system = user = ""
    for message in request.messages:
        role = message.get("role")
        if role in ("system", "developer") and not system:
            system = _content_text(message)
        elif role == "user":
            user = _content_text(message)
            break
    digest = hashlib.blake2b(
        f"{request.model}\x00{system}\x00{user}".encode(), digest_size=12
    ).hexdigest()
    return f"prefix:{digest}"


@dataclass(**_DC_KWARGS)
class ToolCall:
    """A complete tool call from the model. `arguments` is raw JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(**_DC_KWARGS)
class ToolCallChunk:
    """A streamed fragment of a tool call (OpenAI `delta.tool_calls[i]`)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass(**_DC_KWARGS)
class Usage:
    """Token counts the server reported."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """Prompt tokens read from the server's cache: `usage.prompt_tokens_details.
    cached_tokens`, Anthropic's `cache_read_input_tokens` (None: not reported)."""
    cache_creation_tokens: int | None = None
    """Prompt tokens written to a hosted prompt cache (Anthropic's
    `cache_creation_input_tokens`; None: not reported)."""
    cache_creation_1h_tokens: int | None = None
    """The part of `cache_creation_tokens` written with the 1-hour TTL (priced 2x
    base input instead of 1.25x; None: not reported)."""
    estimated: bool = False
    """True when the figures are this request's share of a batched call's totals
    (the server reports usage per call; see `backends/_batching.py`)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(**_DC_KWARGS)
class ChatChunk:
    """One streamed delta. The final chunk carries `finish_reason` and/or `usage`."""

    content: str = ""
    tool_call_chunks: tuple[ToolCallChunk, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    id: str | None = None
    model: str | None = None
    logprobs: tuple[Mapping[str, Any], ...] | None = None
    """The `logprobs.content` entries of this delta's tokens (requested with `logprobs`)."""


@dataclass(**_DC_KWARGS)
class ChatResponse:
    """A finished chat completion (aggregated from the stream when streaming)."""

    id: str
    """The server's response id (vLLM: `chatcmpl-<request_id>`)."""
    model: str
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    request_id: str = ""
    """The request id we sent."""
    queue_wait_s: float | None = None
    """Seconds the request waited in the scheduler for a slot (all attempts); set by
    the scheduler, None from a backend called directly."""
    logprobs: tuple[Mapping[str, Any], ...] | None = None
    """`choices[0].logprobs.content` (token, logprob, bytes, top_logprobs), when requested."""


@dataclass(**_DC_KWARGS)
class EngineMetrics:
    """What a server's `/metrics` says about its load (None: not exposed)."""

    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    """0..1."""
    num_preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    kv_capacity_tokens: int | None = None
    """block_size * num_gpu_blocks from `vllm:cache_config_info` (SGLang: max_total_num_tokens)."""
    kv_offload_tokens: int | None = None
    """Capacity of the server's second KV tier in host memory, in tokens (vLLM's
    `--kv-offloading-size`: its `vllm:cache_config_info` label in GiB, over the
    bytes per token that `kv_cache_memory_bytes` / `kv_cache_size_tokens` give);
    None: no tier, or its size in tokens cannot be told."""
    block_size: int | None = None
    prefix_caching: bool | None = None
    cache_hit_rate: float | None = None
    """Prefix-cache hit rate 0..1 (vLLM: hits/queries since start; SGLang: its gauge)."""
    engines: int | None = None
    """How many engines the counts are summed over (the replicas of a pool, the
    data-parallel engines of one vLLM server); None: one. The decode cap is
    learned per engine."""


@dataclass(**_DC_KWARGS)
class ModelInfo:
    """One entry of `/v1/models`."""

    id: str
    max_model_len: int | None = None


@dataclass(**_DC_KWARGS)
class BackendCapabilities:
    """What the scheduler may ask of a backend."""

    priority: bool = False
    """The server honours a per-request priority (and it is configured on)."""
    metrics: bool = False
    """`metrics()` returns engine load figures."""
    batch_completions: bool = False
    """`complete_batch()` sends many prompts in one HTTP call."""
    flavor: Literal["openai", "vllm", "sglang"] = "openai"
    hosted_prompt_cache: bool = False
    """A hosted API's prompt cache that serves a prefix only once a first request
    with it has begun answering (Anthropic, Bedrock): prefix warming pays there."""


class Backend(abc.ABC):
    """An inference server, reached over HTTP.

    Subclasses implement `chat`; everything else has a working default.
    Lifecycle follows `httpx.AsyncClient`: `async with backend:` or
    `await backend.aclose()`.

    Every method raises only `langgraph_batch.errors.BackendError`
    subclasses (and `asyncio.CancelledError`).
    """

    capabilities: BackendCapabilities = BackendCapabilities()
    base_url: str = ""

    @property
    def key(self) -> str:
        """Identifies the endpoint (set) this backend talks to.

        BatchedChatModel instances whose backends have the same key share one
        scheduler.
        """
        shown = safe_url(self.base_url)
        if shown != self.base_url:  # a password in the URL: only its digest is kept
            shown += "#" + hashlib.sha256(self.base_url.encode()).hexdigest()[:16]
        return f"{type(self).__name__}:{shown}"

    @abc.abstractmethod
    async def chat(
        self,
        request: ChatRequest,
        *,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        """Run one chat completion.

        With `request.stream`, the backend reads SSE and calls `on_chunk`
        for every delta as it arrives (synchronously, from the calling task),
        then returns the aggregated response. Cancelling the awaiting task
        closes the HTTP request (the server aborts it).
        """

    async def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """Run several tool-free, non-streaming requests in as few HTTP calls as possible.

        The default runs them one by one; vLLM sends one `/v1/completions`
        list-prompt call. Results come back in input order.

        Raises:
            BackendError: the first request's failure (see `complete_batch_settled`
                for one outcome per request).
        """
        if type(self).complete_batch_settled is Backend.complete_batch_settled:
            return [await self.chat(r) for r in requests]
        outcomes = await self.complete_batch_settled(requests)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]

    async def complete_batch_settled(
        self, requests: Sequence[ChatRequest]
    ) -> list[ChatResponse | BackendError]:
        """Like `complete_batch`, but each request gets its own response or error.

        The scheduler calls this, so that one bad request of a batch fails only
        its own caller. The default calls an overridden `complete_batch` (its
        error then goes to every request), else runs the requests concurrently
        one by one.

        Returns:
            One `ChatResponse` or `BackendError` per request, in input order.
        """
        if type(self).complete_batch is not Backend.complete_batch:
            try:
                return list(await self.complete_batch(requests))
            except BackendError as exc:
                return [exc] * len(requests)
        results = await asyncio.gather(*(self.chat(r) for r in requests), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, BackendError):
                raise result
        return list(results)  # type: ignore[arg-type]

    async def metrics(self) -> EngineMetrics | None:
        """Current engine load, or None when the server exposes none."""
        return None

    async def count_tokens(
        self,
        model: str,
        *,
        prompt: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Tokens the server's own tokenizer counts.

        In `prompt`, or in the chat prompt `messages` (and `tools`) render to,
        generation prompt included.

        Raises:
            NotImplementedError: this backend cannot ask its server (the default).
            BackendError: the server could not be reached or has no tokenizer route.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot count tokens")

    async def health(self) -> bool:
        """True when the server says it is healthy."""
        return True

    async def models(self) -> list[ModelInfo]:
        """The models the server serves (`/v1/models`)."""
        return []

    async def aclose(self) -> None:  # noqa: B027 - a backend without resources needs no close
        """Close the HTTP client. Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
