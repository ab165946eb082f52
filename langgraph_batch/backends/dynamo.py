"""`DynamoBackend`: the OpenAI-compatible backend plus what NVIDIA Dynamo's frontend reads.

Dynamo (`python -m dynamo.frontend`, pip package `ai-dynamo`) puts an
OpenAI-compatible HTTP frontend and a KV-aware router in front of its
workers. Per request this backend adds (`backends/_dynamo_hints.py` says what
each field means and what Dynamo 1.6.1 accepts):

- `X-Dynamo-Session-ID` (the sibling's opaque session key) and, on a call
  known to be the sibling's last, `X-Dynamo-Session-Final: true`;
  `X-Dynamo-Parent-Session-ID` (its fan_out run) only with
  `parent_session=True`: Dynamo 1.6.1's router binds a child session to its
  parent's worker, so every sibling of a run lands on ONE worker (measured:
  128 of 128 requests on one of 2 workers, `benchmarks/dynamo_w4.py`).
  `session_affinity=None` sends none of them (nor the `SessionConfig` headers).
- `nvext.agent_hints`: `priority` (from the sibling's progress), `osl` (the
  output length learned from this backend's answers) and
  `latency_sensitivity`; `agent_hints=False` sends none.
- `nvext.cache_control` with the learned tool wait as its TTL (300-3600 s),
  only with `cache_control=True`: Dynamo 1.6.1 answers it with HTTP 400.

Every other call (models, health, errors, streaming) is the base class's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from langgraph_batch.backends._dynamo_hints import (
    OutputLengths,
    agent_hints,
    cache_control,
    dynamo_headers,
    program_key,
)
from langgraph_batch.backends.base import BackendCapabilities, ChatChunk, ChatRequest, ChatResponse
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend

__all__ = ("DynamoBackend",)

logger = logging.getLogger(__name__)


class DynamoBackend(OpenAICompatibleBackend):
    """An NVIDIA Dynamo frontend (`python -m dynamo.frontend`).

    Example:
        ```python
        backend = DynamoBackend("http://127.0.0.1:8000")
        llm = BatchedChatModel(model="Qwen/Qwen3-0.6B", base_url="dynamo://127.0.0.1:8000")
        ```

    Args:
        base_url: the frontend, with or without the trailing `/v1`.
        agent_hints: send `nvext.agent_hints` (priority, osl, latency_sensitivity).
        parent_session: send `X-Dynamo-Parent-Session-ID` (the fan_out run). Off by
            default: Dynamo pins child sessions to the parent's worker, which puts a
            whole fan_out on one worker; for a few subagents sharing a long context.
        cache_control: send `nvext.cache_control` with the learned tool wait as
            TTL. Off by default: Dynamo 1.6.1 rejects the field (HTTP 400); it
            needs a build with cache pinning and the frontend's
            `--enable-cache-control`.
        low_priority_values_first: the engine behind Dynamo runs lower priority
            values first (vLLM; SGLang with `--schedule-low-priority-values-first`).
            False negates our priority (SGLang's default order).
        latency_per_turn_s: `agent_hints.latency_sensitivity` per completed turn
            of the caller, seconds (a sibling further along jumps the router's
            queue further; needs the frontend's `--router-queue-threshold`). 0: never.
        **kwargs: `OpenAICompatibleBackend` options (api_key, timeout,
            session_affinity, ...).

    Raises:
        ValueError: `latency_per_turn_s` is negative or not a number.

    !!! version-added "Added in 0.3.0"
    """

    def __init__(
        self,
        base_url: str,
        *,
        agent_hints: bool = True,
        parent_session: bool = False,
        cache_control: bool = False,
        low_priority_values_first: bool = True,
        latency_per_turn_s: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(latency_per_turn_s, int | float) or not latency_per_turn_s >= 0:
            raise ValueError(f"latency_per_turn_s must be >= 0 seconds, got {latency_per_turn_s!r}")
        super().__init__(base_url, **kwargs)
        self.agent_hints = agent_hints
        self.parent_session = parent_session
        self.cache_control = cache_control
        self.low_priority_values_first = low_priority_values_first
        self.latency_per_turn_s = float(latency_per_turn_s)
        # priority=True: the scheduler fills each request's progress priority for the hints.
        self.capabilities = BackendCapabilities(priority=agent_hints, flavor="openai")
        self.output_lengths = OutputLengths()

    def _extend_body(self, body: dict[str, Any], request: ChatRequest) -> None:
        nvext: dict[str, Any] = {}
        if self.agent_hints:
            hints = agent_hints(
                request,
                osl=self.output_lengths.expect(request),
                low_priority_values_first=self.low_priority_values_first,
                latency_per_turn_s=self.latency_per_turn_s,
            )
            if hints:
                nvext["agent_hints"] = hints
        if self.cache_control:
            ttl = cache_control(request.retention_s)
            if ttl is not None:
                nvext["cache_control"] = ttl
        if not nvext:
            return
        own = body.get("nvext")
        if isinstance(own, dict):  # the caller's own nvext fields win
            nvext = {**nvext, **own}
        body["nvext"] = nvext

    def _request_headers(self, request: ChatRequest) -> dict[str, str] | None:
        headers = self._session.headers(request)
        if self._session.config is None:
            return headers
        key = self._session.key(request)
        parent = program_key(request, self._credentials) if self.parent_session else None
        return {**(headers or {}), **dynamo_headers(request, key, parent)}

    async def chat(
        self,
        request: ChatRequest,
        *,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        """Run one chat completion (see `Backend.chat`); learn its output length.

        Raises:
            BackendError: a subclass for every failure (see `langgraph_batch.errors`).
        """
        response = await super().chat(request, on_chunk=on_chunk)
        usage = response.usage
        if usage is not None and not usage.estimated:
            self.output_lengths.observe(request.turn, usage.completion_tokens)
        return response
