"""A scripted in-memory Backend for BatchedChatModel unit tests."""

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


class FakeBackend(Backend):
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
