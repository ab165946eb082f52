"""`VLLMBackend`: the OpenAI-compatible backend plus what vLLM adds.

- `request_id` in the body and `X-Request-Id` (vLLM names its response
  `chatcmpl-<request_id>` and logs it).
- `priority` (lower runs sooner, our convention too), sent only with
  `priority_scheduling=True`: vLLM honours it only under
  `--scheduling-policy priority` and ignores it under the default `fcfs`.
- `/metrics` (load, KV usage, KV capacity from `vllm:cache_config_info`).
- the session key in `X-Session-ID` (what `vllm-router --policy consistent_hash`
  routes on) and, with `SessionConfig(engine_hints="agentic_context")`, the
  program metadata vllm-router's program scheduling reads
  (`vllm_xargs.agentic_context`; see `backends/_session.py`).
- `complete_batch_settled`: chat requests go out as one
  `/v1/chat/completions/batch` call (vLLM >= 0.20; chat templating stays the
  server's), raw prompts as one `/v1/completions` list-prompt call. On a
  server without the batch endpoint (404) the backend remembers it and sends
  the requests one by one. Isolation (a bad member fails only its caller) and
  per-member usage are `_batching.py`'s, except that a list of text prompts
  asks for `return_token_ids`: each choice's prompt and answer token ids give
  its exact usage (a list of token-id prompts is exact already).
- **Forced tool calls are strict.** When `tool_choice` forces a call (a named
  tool, `"required"`), each tool that does not state `strict` is sent with
  `"strict": true` (its `parameters` unchanged). vLLM >= 0.32
  (`--tool-strict-level auto`, the default) constrains only the call's
  envelope (`{"name": ..., "arguments": `) for a forced choice, and pins the
  arguments to the tool's schema only for strict tools: without the flag the
  model may write any JSON value (a number, a string) as the arguments. A tool
  marked `strict: false` (`bind_tools(..., strict=False)`) is sent as it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from langgraph_batch._redact import safe_url
from langgraph_batch.backends._batching import (
    MAX_PROMPTS_PER_CALL,
    gather_in_order,
    is_single_choice,
    settle_batch,
    split_usage,
)
from langgraph_batch.backends._errormap import is_route_not_found
from langgraph_batch.backends._prometheus import parse_prometheus
from langgraph_batch.backends._session import affinity_key, agentic_context
from langgraph_batch.backends._sse import parse_usage
from langgraph_batch.backends.base import (
    BackendCapabilities,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    Usage,
)
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend, dumps
from langgraph_batch.errors import BackendError, BackendServerError

__all__ = (
    "MAX_PROMPTS_PER_CALL",
    "VLLMBackend",
    "forces_tool_call",
    "gather_in_order",
    "is_single_choice",
    "parse_vllm_metrics",
    "strict_tools",
)

logger = logging.getLogger(__name__)

_GUIDED = frozenset({"guided_json", "guided_regex", "guided_choice", "guided_grammar"})

_VLLM_METRICS = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:cache_config_info",
    }
)

_MODELS_RETRY_S = 60.0


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None


def _offload_tokens(labels: dict[str, str], block_size: int | None) -> int | None:
    """The second KV tier in tokens from one engine's `vllm:cache_config_info` labels.

    vLLM (>= 0.12) labels every `CacheConfig` field: `kv_offloading_size` is the
    tier's GiB ("None": no tier), sized by `CPUOffloadingSpec` in whole blocks of
    `cpu_bytes_to_use = GiB * 2**30`. The bytes of a token come from
    `kv_cache_memory_bytes` over `kv_cache_size_tokens`, which a server states
    only when started with `--kv-cache-memory-bytes` (as the emulator reports
    its own); otherwise the tier's size in tokens is unknown (None).
    """
    try:
        gib = float(labels["kv_offloading_size"])
    except (KeyError, ValueError):
        return None
    memory = _int_label(labels, "kv_cache_memory_bytes")
    tokens = _int_label(labels, "kv_cache_size_tokens")
    if not gib > 0 or not memory or not tokens or not block_size:
        return None
    block_bytes = memory // tokens * block_size
    if block_bytes < 1:
        return None
    return int(gib * (1 << 30)) // block_bytes * block_size


class VLLMBackend(OpenAICompatibleBackend):
    """A vLLM OpenAI-compatible server (`vllm serve`).

    Example:
        ```python
        backend = VLLMBackend("http://127.0.0.1:8000", priority_scheduling=True)
        ```

    Args:
        base_url: the server, with or without the trailing `/v1`.
        priority_scheduling: the server runs with `--scheduling-policy priority`;
            send each request's `priority` (lower runs sooner).
        **kwargs: `OpenAICompatibleBackend` options (api_key, timeout, ...).
    """

    def __init__(self, base_url: str, *, priority_scheduling: bool = False, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.priority_scheduling = priority_scheduling
        self.capabilities = BackendCapabilities(
            priority=priority_scheduling, metrics=True, batch_completions=True, flavor="vllm"
        )
        self._chat_batch_url = httpx.URL(self.base_url + "/v1/chat/completions/batch")
        self._metrics_url = httpx.URL(self.base_url + "/metrics")
        self._chat_batch_supported: bool | None = None
        self._model_lens: dict[str, int] | None = None
        self._model_lens_retry = 0.0

    def _extend_body(self, body: dict[str, Any], request: ChatRequest) -> None:
        if request.request_id:
            body["request_id"] = request.request_id
        if self.priority_scheduling:
            body["priority"] = request.priority
        if not _GUIDED.isdisjoint(body):
            _translate_guided(body)
        if "tools" in body and forces_tool_call(body.get("tool_choice")):
            body["tools"] = strict_tools(body["tools"], body["tool_choice"])
        if self._session.hints == "agentic_context":
            xargs = body.get("vllm_xargs")
            xargs = dict(xargs) if isinstance(xargs, dict) else {}
            key = self._session.key(request)
            xargs.setdefault("agentic_context", agentic_context(request, key))
            body["vllm_xargs"] = xargs

    def _request_headers(self, request: ChatRequest) -> dict[str, str] | None:
        headers = self._session.headers(request)
        rid = request.request_id
        if rid:
            if headers is None:
                return {"X-Request-Id": rid}
            headers["X-Request-Id"] = rid
        return headers

    # ------------------------------------------------------------------ batching

    async def complete_batch_settled(
        self, requests: Sequence[ChatRequest]
    ) -> list[ChatResponse | BackendError]:
        """Send many non-streaming, tool-free requests in as few HTTP calls as possible.

        Requests that share model, parameters and priority (and, behind a router,
        their session key: `SessionConfig.batching`) go together: chat
        requests as one `/v1/chat/completions/batch` call, raw prompts
        (`params["prompt"]`) as one `/v1/completions` list-prompt call. The rest
        (streaming, tools, n > 1, a prompt that may not fit `max_model_len`, or a
        server without the batch endpoint) run one by one, concurrently. A
        batched call that fails with a 4xx is split: each member is sent alone.
        Each response carries its share of the call's usage
        (`Usage.estimated`, see `backends/_batching.py`).

        Returns:
            One `ChatResponse` or `BackendError` per request, in input order.
        """
        self._check_open()
        limits = None
        if len(requests) > 1:
            limits = await self._max_model_lens()
            await self._resolve_session_batching()
        return await settle_batch(
            requests,
            group_key=self._group_key,
            send_batch=self._send_batch,
            send_one=self.chat,
            max_model_len=limits,
        )

    async def _max_model_lens(self) -> dict[str, int]:
        """`max_model_len` per model from `/v1/models` (once; after a failure, a minute later)."""
        now = asyncio.get_running_loop().time()
        if self._model_lens is None or (not self._model_lens and now >= self._model_lens_retry):
            try:
                self._model_lens = {
                    m.id: m.max_model_len for m in await self.models() if m.max_model_len
                }
            except BackendError as exc:
                logger.debug(
                    "%s: /v1/models failed (%r); no length pre-filter", safe_url(self.base_url), exc
                )
                self._model_lens = {}
                self._model_lens_retry = now + _MODELS_RETRY_S
        return self._model_lens

    def _group_key(self, request: ChatRequest) -> tuple[Any, ...] | None:
        if not is_single_choice(request):
            return None
        params = dict(request.params)
        prompt = params.pop("prompt", None)
        priority = request.priority if self.priority_scheduling else 0
        session = self._session.group_key(request)
        if prompt is not None:
            if isinstance(prompt, str):
                kind = "prompt-text"
            elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
                kind = "prompt-ids"
            else:  # already a list of prompts: send as it is
                return None
            return ("prompt", kind, request.model, dumps(params), priority, session)
        if self._chat_batch_supported is False:
            return None
        return ("chat", request.model, dumps(params), priority, session)

    async def _send_batch(self, key: Any, batch: Sequence[ChatRequest]) -> list[ChatResponse]:
        if key[0] == "prompt":
            return await self._prompt_batch(batch)
        return await self._chat_batch(batch)

    def _batch_request(self, batch: Sequence[ChatRequest]) -> ChatRequest:
        """A stand-in for the shared part of a batch (model, params, id, timeout, session).

        The call carries its first member's session key (one call reaches one replica).
        """
        first = batch[0]
        timeouts = [r.timeout for r in batch]
        return ChatRequest(
            model=first.model,
            messages=(),
            params=first.params,
            request_id=first.request_id,
            priority=first.priority,
            timeout=None if None in timeouts else max(t for t in timeouts if t is not None),
            route_key=affinity_key(first),
            turn=first.turn,
        )

    async def _chat_batch(self, batch: Sequence[ChatRequest]) -> list[ChatResponse]:
        shared = self._batch_request(batch)
        body: dict[str, Any] = {"model": shared.model}
        body.update(batch[0].params)
        body["messages"] = [r.messages for r in batch]
        body.pop("stream", None)
        self._extend_body(body, shared)
        response = await self._send(self._chat_batch_url, dumps(body), shared)
        if response.status_code >= 400:
            if is_route_not_found(response.status_code, response.content):
                if self._chat_batch_supported is None:
                    logger.info(
                        "%s has no /v1/chat/completions/batch (vLLM < 0.20?): "
                        "sending batched chat requests one by one",
                        self.base_url,
                    )
                self._chat_batch_supported = False
                return await gather_in_order([self.chat(r) for r in batch])
            raise await self._error(response, self._chat_batch_url, shared)
        self._chat_batch_supported = True
        data = self._decode(response, self._chat_batch_url, shared)
        return self._split_choices(data, batch, message_key="message")

    async def _prompt_batch(self, batch: Sequence[ChatRequest]) -> list[ChatResponse]:
        shared = self._batch_request(batch)
        body: dict[str, Any] = {"model": shared.model}
        body.update(batch[0].params)
        body["prompt"] = [r.params["prompt"] for r in batch]
        body.pop("stream", None)
        if isinstance(body["prompt"][0], str):
            # Each choice then carries its prompt's and answer's token ids: exact usage
            # per prompt (vLLM >= 0.10.2; the call's usage is one sum over them).
            body.setdefault("return_token_ids", True)
        self._extend_body(body, shared)
        data = await self._post_json(self._completions_url, dumps(body), shared)
        return self._split_choices(data, batch, message_key=None)

    def _split_choices(
        self, data: Any, batch: Sequence[ChatRequest], *, message_key: str | None
    ) -> list[ChatResponse]:
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
            if len(choices) != len(batch):
                raise ValueError(f"{len(choices)} choices for {len(batch)} prompts")
            base_id = data.get("id") or batch[0].request_id
            model = data.get("model") or batch[0].model
            answers = []
            for choice in choices:
                if message_key is None:
                    content = choice.get("text")
                else:
                    content = (choice.get(message_key) or {}).get("content")
                answers.append((content, choice.get("finish_reason")))
            total = parse_usage(data.get("usage"))
            usages = exact_usages(choices, total) or split_usage(total, batch, answers)
            return [
                ChatResponse(
                    id=f"{base_id}_{i}",
                    model=model,
                    content=content,
                    finish_reason=finish,
                    usage=usage,
                    request_id=request.request_id,
                )
                for i, ((content, finish), usage, request) in enumerate(
                    zip(answers, usages, batch, strict=True)
                )
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BackendServerError(
                f"malformed batch completion from {self.base_url}: {exc}",
                url=self.base_url,
            ) from exc

    # ------------------------------------------------------------------ metrics

    async def metrics(self) -> EngineMetrics | None:
        """Load figures from `/metrics` (sums over engines; KV usage is their mean).

        Raises:
            BackendError: the server could not be reached or `/metrics` failed.
        """
        response = await self._get(self._metrics_url)
        if response.status_code >= 400:
            raise await self._error(response, self._metrics_url, None)
        return parse_vllm_metrics(response.text)


def exact_usages(choices: Sequence[Any], total: Usage | None) -> list[Usage | None] | None:
    """Each choice's usage from its token ids (`return_token_ids`), when all carry them.

    Args:
        choices: the call's choices, in member order.
        total: the call's usage; the exact figures must add up to it.

    Returns:
        One exact `Usage` per choice (`cached_tokens` unknown: vLLM reports it
        for the whole call), or None when some choice lacks the ids or they do
        not add up to the call's usage (then the usage is split instead).
    """
    usages: list[Usage | None] = []
    for choice in choices:
        prompt, answer = choice.get("prompt_token_ids"), choice.get("token_ids")
        if not isinstance(prompt, list) or not isinstance(answer, list):
            return None
        usages.append(Usage(prompt_tokens=len(prompt), completion_tokens=len(answer)))
    if total is not None and (
        sum(u.prompt_tokens for u in usages if u) != total.prompt_tokens
        or sum(u.completion_tokens for u in usages if u) != total.completion_tokens
    ):
        return None
    return usages


def parse_vllm_metrics(text: str) -> EngineMetrics:
    """`EngineMetrics` from vLLM's Prometheus text.

    The KV capacity is `vllm:cache_config_info`'s `kv_cache_size_tokens` label
    where the engine states it (vLLM >= 0.32), else `block_size x num_gpu_blocks`;
    a second tier in host memory from its `kv_offloading_size` label (`_offload_tokens`).
    """
    s = parse_prometheus(text, names=_VLLM_METRICS)
    block_size = None
    capacity = 0
    prefix_caching = None
    offload = 0
    seen_engines: set[str] = set()
    for labels, _ in s.get("vllm:cache_config_info"):
        engine = labels.get("engine", "")
        if engine in seen_engines:
            continue
        seen_engines.add(engine)
        size = _int_label(labels, "block_size")
        blocks = _int_label(labels, "num_gpu_blocks")
        tokens = _int_label(labels, "kv_cache_size_tokens")  # vLLM >= 0.32 states it
        if size is not None:
            block_size = size
        if tokens is not None:
            capacity += tokens
        elif size is not None and blocks is not None:
            capacity += size * blocks
        offload += _offload_tokens(labels, size) or 0
        flag = labels.get("enable_prefix_caching")
        if flag is not None:
            prefix_caching = flag.lower() == "true"
    queries = s.sum("vllm:prefix_cache_queries_total")
    hits = s.sum("vllm:prefix_cache_hits_total")
    return EngineMetrics(
        num_requests_running=s.sum("vllm:num_requests_running"),
        num_requests_waiting=s.sum("vllm:num_requests_waiting"),
        kv_cache_usage=s.mean("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        num_preemptions_total=s.sum("vllm:num_preemptions_total"),
        prefix_cache_queries_total=queries,
        prefix_cache_hits_total=hits,
        prompt_tokens_total=s.sum("vllm:prompt_tokens_total"),
        generation_tokens_total=s.sum("vllm:generation_tokens_total"),
        kv_capacity_tokens=capacity or None,
        kv_offload_tokens=offload or None,
        block_size=block_size,
        prefix_caching=prefix_caching,
        cache_hit_rate=(hits / queries) if queries and hits is not None else None,
        engines=len(seen_engines) or None,
    )


def forces_tool_call(tool_choice: Any) -> bool:
    """Whether `tool_choice` (the wire field) forces a tool call: `"required"` or a named tool."""
    if tool_choice == "required":
        return True
    return isinstance(tool_choice, dict) and tool_choice.get("type") == "function"


def strict_tools(tools: Any, tool_choice: Any) -> Any:
    """`tools` with `"strict": true` on each tool a forced `tool_choice` may call.

    Only tools that do not state `strict` change (copied, not mutated); with a
    named `tool_choice` only that tool, with `"required"` every tool.

    Example:
        ```python
        strict_tools([{"type": "function", "function": {"name": "f"}}], "required")
        # [{"type": "function", "function": {"name": "f", "strict": True}}]
        ```
    """
    if not isinstance(tools, list):
        return tools
    named = None
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        named = function.get("name") if isinstance(function, dict) else None
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            isinstance(fn, dict)
            and "strict" not in fn
            and (named is None or fn.get("name") == named)
        ):
            tool = {**tool, "function": {**fn, "strict": True}}
        out.append(tool)
    return out


def _translate_guided(body: dict[str, Any]) -> None:
    """Rewrite removed `guided_*` fields (silently ignored by current vLLM) to their successors."""
    schema = body.pop("guided_json", None)
    if schema is not None and "response_format" not in body:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    structured: dict[str, Any] = {}
    for old, new in (
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        value = body.pop(old, None)
        if value is not None:
            structured[new] = value
    if structured and "structured_outputs" not in body:
        body["structured_outputs"] = structured
    logger.debug("translated guided_* fields to response_format/structured_outputs")
