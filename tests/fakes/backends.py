"""Fake backends (no network): scripted for BatchedChatModel, event-gated for the scheduler.

`ScriptedBackend` answers from a script of `Reply`s and records every request;
`InstantBackend` answers at once; `GatedBackend` (and `BatchBackend`,
`MetricsBackend`) hold each request until the test opens its gate, so tests
order events with asyncio.Event, never with sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    ToolCall,
    ToolCallChunk,
    Usage,
)


@dataclass
class Reply:
    """What the fake server answers: text and/or tool calls (name, raw JSON args)."""

    content: str = ""
    tool_calls: Sequence[tuple[str, str]] = ()
    usage: Usage = field(default_factory=lambda: Usage(prompt_tokens=7, completion_tokens=3))
    finish_reason: str | None = None
    error: BaseException | None = None


class ScriptedBackend(Backend):
    """Answers every request with `script(request)`; records requests and concurrency.

    Streaming splits content into words and tool-call arguments in two halves,
    then returns the aggregated response, as a real backend does.
    """

    capabilities = BackendCapabilities(flavor="vllm")

    def __init__(
        self,
        script: Callable[[ChatRequest], Reply] | None = None,
        *,
        base_url: str = "fake://server",
        gate: asyncio.Event | None = None,
    ) -> None:
        self.script = script or (lambda _r: Reply(content="hello world"))
        self.base_url = base_url
        self.requests: list[ChatRequest] = []
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.gate = gate
        self.inflight = 0
        self.peak = 0
        self.started = asyncio.Event()
        self.cancelled = 0
        self.cancelled_event = threading.Event()
        self.closed = False

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.requests.append(request)
        self.loops.append(asyncio.get_running_loop())
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            reply = self.script(request)
            calls = tuple(
                ToolCall(id=f"call_{i}", name=name, arguments=args)
                for i, (name, args) in enumerate(reply.tool_calls)
            )
            if request.stream and on_chunk is not None:
                words = reply.content.split(" ")
                for i, word in enumerate(words):
                    on_chunk(ChatChunk(content=word if i == 0 else " " + word))
                    await asyncio.sleep(0)
                    self.started.set()
                for i, call in enumerate(calls):
                    half = len(call.arguments) // 2
                    on_chunk(
                        ChatChunk(
                            tool_call_chunks=(
                                ToolCallChunk(
                                    index=i,
                                    id=call.id,
                                    name=call.name,
                                    arguments=call.arguments[:half],
                                ),
                            )
                        )
                    )
                    on_chunk(
                        ChatChunk(
                            tool_call_chunks=(
                                ToolCallChunk(index=i, arguments=call.arguments[half:]),
                            )
                        )
                    )
            self.started.set()
            if self.gate is not None:
                await self.gate.wait()
            if reply.error is not None:
                raise reply.error
            finish = reply.finish_reason or ("tool_calls" if calls else "stop")
            if request.stream and on_chunk is not None:
                on_chunk(ChatChunk(finish_reason=finish, usage=reply.usage))
            return ChatResponse(
                id=f"chatcmpl-{request.request_id}",
                model=request.model,
                content=reply.content or None,
                tool_calls=calls,
                finish_reason=finish,
                usage=reply.usage,
                request_id=request.request_id,
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            self.cancelled_event.set()
            raise
        finally:
            self.inflight -= 1

    async def aclose(self) -> None:
        self.closed = True


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
