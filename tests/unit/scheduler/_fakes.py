"""Fake backends for scheduler tests: coordinated through asyncio.Event, never sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    Usage,
)


def request(rid: str = "", *, stream: bool = False, batchable: bool = False) -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=[{"role": "user", "content": rid}],
        request_id=rid,
        stream=stream,
        batchable=batchable,
    )


def response(req: ChatRequest) -> ChatResponse:
    return ChatResponse(
        id=f"chatcmpl-{req.request_id}",
        model=req.model,
        content=f"answer to {req.request_id}",
        usage=Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1),
        request_id=req.request_id,
    )


class InstantBackend(Backend):
    """Answers at once (after one loop turn)."""

    base_url = "fake://instant"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.calls += 1
        await asyncio.sleep(0)
        return response(request)


class GatedBackend(Backend):
    """Every call blocks until `gate` is set; records order and concurrency.

    `failures` maps a request id to exceptions raised by its successive calls.
    """

    base_url = "fake://gated"

    def __init__(self, *, open_gate: bool = False) -> None:
        self.gate = asyncio.Event()
        if open_gate:
            self.gate.set()
        self.changed = asyncio.Event()
        self.running = 0
        self.max_running = 0
        self.order: list[str] = []
        self.cancelled: list[str] = []
        self.failures: dict[str, list[BaseException]] = {}
        self.chunks: dict[str, list[ChatChunk]] = {}

    def _bump(self, delta: int) -> None:
        self.running += delta
        self.max_running = max(self.max_running, self.running)
        self.changed.set()

    async def wait_running(self, n: int) -> None:
        while self.running != n:
            self.changed.clear()
            await self.changed.wait()

    async def wait_started(self, n: int) -> None:
        while len(self.order) < n:
            self.changed.clear()
            await self.changed.wait()

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.order.append(request.request_id)
        self._bump(+1)
        try:
            for chunk in self.chunks.get(request.request_id, []):
                assert on_chunk is not None
                on_chunk(chunk)
            fails = self.failures.get(request.request_id)
            if fails:
                raise fails.pop(0)
            await self.gate.wait()
            return response(request)
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise
        finally:
            self._bump(-1)


class BatchBackend(GatedBackend):
    """Supports complete_batch; records batch sizes."""

    capabilities = BackendCapabilities(batch_completions=True)

    def __init__(self, **kw: bool) -> None:
        super().__init__(**kw)
        self.batches: list[list[str]] = []
        self.batch_failures: list[BaseException] = []

    async def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        self.batches.append([r.request_id for r in requests])
        self.changed.set()
        if self.batch_failures:
            raise self.batch_failures.pop(0)
        await self.gate.wait()
        return [response(r) for r in requests]


class MetricsBackend(GatedBackend):
    """Reports engine metrics; each poll sets `polled`."""

    capabilities = BackendCapabilities(metrics=True)

    def __init__(self, metrics: EngineMetrics, **kw: bool) -> None:
        super().__init__(**kw)
        self.metrics_value = metrics
        self.polls = 0

    async def metrics(self) -> EngineMetrics | None:
        self.polls += 1
        self.changed.set()
        return self.metrics_value
