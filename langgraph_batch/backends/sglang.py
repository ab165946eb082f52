"""`SGLangBackend`: the OpenAI-compatible backend plus what SGLang adds.

- `rid` carries the request id.
- `priority`, sent only with `priority_scheduling=True` (the server needs
  `--enable-priority-scheduling`). SGLang runs HIGHER values first by
  default, the opposite of our convention, so the sign is flipped unless the
  server runs with `--schedule-low-priority-values-first`
  (`low_priority_values_first=True`).
- `/metrics` with SGLang's names (needs `--enable-metrics`).
- the session key in `X-SMG-Routing-Key` (what `sglang-router --policy manual`
  routes on; SGLang itself reads it as the request's `routing_key`).
- `complete_batch_settled`: raw prompts go out as one native `/generate` call
  with a text list (its `meta_info` gives each member its exact usage); chat
  requests run one by one (concurrently). Isolation (a bad member fails only
  its caller) is `_batching.py`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from langgraph_batch.backends._batching import is_single_choice, settle_batch
from langgraph_batch.backends._prometheus import parse_prometheus
from langgraph_batch.backends._session import affinity_key
from langgraph_batch.backends.base import (
    BackendCapabilities,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    Usage,
)
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend, dumps
from langgraph_batch.errors import BackendError, BackendServerError

__all__ = ("SGLangBackend", "parse_sglang_metrics", "sampling_params_for_generate")

logger = logging.getLogger(__name__)

_SGLANG_METRICS = frozenset(
    {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:max_total_num_tokens",
        "sglang:cache_hit_rate",
        "sglang:num_retracted_reqs",
        "sglang:num_retracted_requests_total",
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:generation_tokens_total",
    }
)

# OpenAI body fields that map one-to-one onto SGLang sampling params.
_SAME_NAME = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "json_schema",
        "regex",
        "ebnf",
        "skip_special_tokens",
        "logit_bias",
        "n",
    }
)


def sampling_params_for_generate(params: dict[str, Any]) -> dict[str, Any] | None:
    """Translate OpenAI completion params to `/generate` sampling params.

    Returns:
        The sampling params, or None when a field has no `/generate` equivalent
        (the request then goes through `/v1/completions` instead).
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "prompt" or value is None:
            continue
        if key in ("max_tokens", "max_completion_tokens"):
            out["max_new_tokens"] = value
        elif key == "min_tokens":
            out["min_new_tokens"] = value
        elif key == "seed":
            out["sampling_seed"] = value
        elif key == "response_format":
            if not isinstance(value, dict):
                return None
            kind = value.get("type")
            if kind == "json_schema":
                schema = (value.get("json_schema") or {}).get("schema")
                if schema is None:
                    return None
                out["json_schema"] = json.dumps(schema)
            elif kind != "text":
                return None
        elif key in _SAME_NAME:
            out[key] = value
        else:
            return None
    return out


class SGLangBackend(OpenAICompatibleBackend):
    """An SGLang server (`python -m sglang.launch_server`).

    Example:
        ```python
        backend = SGLangBackend("http://127.0.0.1:30000", priority_scheduling=True)
        ```

    Args:
        base_url: the server, with or without the trailing `/v1`.
        priority_scheduling: the server runs with `--enable-priority-scheduling`;
            send each request's priority.
        low_priority_values_first: the server runs with
            `--schedule-low-priority-values-first` (then our priority is sent as
            it is; otherwise it is negated, since SGLang runs higher values first).
        **kwargs: `OpenAICompatibleBackend` options (api_key, timeout, ...).
    """

    def __init__(
        self,
        base_url: str,
        *,
        priority_scheduling: bool = False,
        low_priority_values_first: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, **kwargs)
        self.priority_scheduling = priority_scheduling
        self.low_priority_values_first = low_priority_values_first
        self.capabilities = BackendCapabilities(
            priority=priority_scheduling, metrics=True, batch_completions=True, flavor="sglang"
        )
        self._generate_url = httpx.URL(self.base_url + "/generate")
        self._metrics_url = httpx.URL(self.base_url + "/metrics")

    def engine_priority(self, priority: int) -> int:
        """Our priority (lower sooner) in the server's convention."""
        return priority if self.low_priority_values_first else -priority

    def _extend_body(self, body: dict[str, Any], request: ChatRequest) -> None:
        if request.request_id:
            body["rid"] = request.request_id
        if self.priority_scheduling:
            body["priority"] = self.engine_priority(request.priority)

    # ------------------------------------------------------------------ batching

    async def complete_batch_settled(
        self, requests: Sequence[ChatRequest]
    ) -> list[ChatResponse | BackendError]:
        """Send raw-prompt requests as one native `/generate` call; the rest one by one.

        A request goes into the `/generate` batch when it carries a text
        `params["prompt"]`, does not stream, and all its params have a
        `/generate` equivalent. A batch that fails with a 4xx is split: each
        member is sent alone, so a bad prompt fails only its caller.

        Returns:
            One `ChatResponse` or `BackendError` per request, in input order.
        """
        self._check_open()
        if len(requests) > 1:
            await self._resolve_session_batching()
        return await settle_batch(
            requests, group_key=self._group_key, send_batch=self._send_batch, send_one=self.chat
        )

    def _group_key(self, request: ChatRequest) -> tuple[int, str | None] | None:
        prompt = request.params.get("prompt")
        if not isinstance(prompt, str) or not is_single_choice(request):
            return None
        if sampling_params_for_generate(dict(request.params)) is None:
            return None
        priority = self.engine_priority(request.priority) if self.priority_scheduling else 0
        return priority, self._session.group_key(request)

    async def _send_batch(self, key: Any, batch: Sequence[ChatRequest]) -> list[ChatResponse]:
        members = []
        for r in batch:
            sampling = sampling_params_for_generate(dict(r.params))
            assert sampling is not None  # checked by _group_key
            members.append((r, sampling))
        return await self._generate(members, key[0])

    async def _generate(
        self, batch: Sequence[tuple[ChatRequest, dict[str, Any]]], priority: int
    ) -> list[ChatResponse]:
        first = batch[0][0]
        timeouts = [r.timeout for r, _ in batch]
        shared = ChatRequest(  # the call carries its first member's session key
            model=first.model,
            messages=(),
            request_id=first.request_id,
            timeout=None if None in timeouts else max(t for t in timeouts if t is not None),
            route_key=affinity_key(first),
        )
        body: dict[str, Any] = {
            "text": [r.params["prompt"] for r, _ in batch],
            "sampling_params": [s for _, s in batch],
        }
        rids = [r.request_id for r, _ in batch]
        if all(rids) and len(set(rids)) == len(rids):
            body["rid"] = rids
        if self.priority_scheduling:
            body["priority"] = priority
        data = await self._post_json(self._generate_url, dumps(body), shared)
        try:
            if not isinstance(data, list) or len(data) != len(batch):
                raise ValueError(f"expected a list of {len(batch)} results")
            return [
                _generate_result(item, request)
                for item, (request, _) in zip(data, batch, strict=True)
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BackendServerError(
                f"malformed /generate answer from {self.base_url}: {exc}",
                url=str(self._generate_url),
            ) from exc

    # ------------------------------------------------------------------ metrics

    async def metrics(self) -> EngineMetrics | None:
        """Load figures from `/metrics` (needs the server's `--enable-metrics`).

        Raises:
            BackendError: the server could not be reached or `/metrics` failed.
        """
        response = await self._get(self._metrics_url)
        if response.status_code >= 400:
            raise await self._error(response, self._metrics_url, None)
        return parse_sglang_metrics(response.text)


def _generate_result(item: dict[str, Any], request: ChatRequest) -> ChatResponse:
    meta = item.get("meta_info") or {}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        finish = finish.get("type")
    return ChatResponse(
        id=str(meta.get("id") or request.request_id),
        model=request.model,
        content=item["text"],
        finish_reason=finish,
        usage=Usage(
            prompt_tokens=meta.get("prompt_tokens") or 0,
            completion_tokens=meta.get("completion_tokens") or 0,
            cached_tokens=meta.get("cached_tokens"),
        ),
        request_id=request.request_id,
    )


def parse_sglang_metrics(text: str) -> EngineMetrics:
    """`EngineMetrics` from SGLang's Prometheus text."""
    s = parse_prometheus(text, names=_SGLANG_METRICS)
    capacity = s.sum("sglang:max_total_num_tokens")
    return EngineMetrics(
        num_requests_running=s.sum("sglang:num_running_reqs"),
        num_requests_waiting=s.sum("sglang:num_queue_reqs"),
        kv_cache_usage=s.mean("sglang:token_usage"),
        num_preemptions_total=s.sum(
            "sglang:num_retracted_requests_total", "sglang:num_retracted_reqs"
        ),
        prompt_tokens_total=s.sum("sglang:prompt_tokens_total"),
        # Prompt tokens served from the radix cache, summed over its cache_source labels.
        prefix_cache_hits_total=s.sum("sglang:cached_tokens_total"),
        generation_tokens_total=s.sum("sglang:generation_tokens_total"),
        kv_capacity_tokens=int(capacity) if capacity else None,
        prefix_caching=True if "sglang:cache_hit_rate" in s else None,
        cache_hit_rate=s.mean("sglang:cache_hit_rate"),
    )
