"""Fake LangChain chat models (no network).

- `ProviderFake(script=...)`: stands in for a cloud provider's model; each call
  answers with `script(messages, kwargs)` (an `AIMessage`, returned or streamed
  as fragments, or an exception raised as a provider SDK would) and is recorded
  with the kwargs that reached `_agenerate`/`_astream`.
- `ScriptedChatModel`: an agent that asks for `lookup(key=<last user text>)`
  `tool_turns` times, then answers; "boom" in the user text makes it raise.
- `ScriptedToolModel`: calls the tools listed (as JSON, see `ask`) in the human
  message, then answers with their results joined.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import openai
from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import Field, SecretStr

from langgraph_batch._context import current_sibling

Script = Callable[[list[BaseMessage], dict[str, Any]], AIMessage | BaseException]

USAGE = UsageMetadata(
    input_tokens=11,
    output_tokens=5,
    total_tokens=16,
    input_token_details={"cache_read": 4},
)


def reply(
    content: str = "",
    *,
    tool_calls: Sequence[tuple[str, dict[str, Any]]] = (),
    stop_reason: str | None = None,
) -> AIMessage:
    """An AIMessage as a provider returns it (Anthropic-style `stop_reason` when given)."""
    calls = [
        {"name": name, "args": args, "id": f"toolu_{i}", "type": "tool_call"}
        for i, (name, args) in enumerate(tool_calls)
    ]
    meta: dict[str, Any] = {"model_name": "fake-model-2025", "id": "msg_123"}
    if stop_reason is not None:
        meta["stop_reason"] = stop_reason
    return AIMessage(
        content=content, tool_calls=calls, usage_metadata=USAGE, response_metadata=meta
    )


def rate_limit_error(retry_after_ms: str = "1") -> openai.RateLimitError:
    """What the openai SDK raises on a 429 (with `retry-after-ms`)."""
    request = httpx.Request("POST", "https://api.example.test/v1/chat/completions")
    response = httpx.Response(
        429,
        headers={"retry-after-ms": retry_after_ms, "content-type": "application/json"},
        request=request,
        json={"error": {"message": "Rate limit reached", "type": "rate_limit"}},
    )
    return openai.RateLimitError(
        "Rate limit reached", response=response, body={"message": "Rate limit reached"}
    )


class ProviderFake(BaseChatModel):
    """A provider-like chat model with tools, usage, streaming and scripted failures."""

    script: Any
    """`Script`: (messages, call kwargs) -> AIMessage or exception to raise."""
    model_name: str = "fake-model"
    api_key: SecretStr | None = None
    base_url: str = "https://api.example.test"
    max_retries: int = 0
    temperature: float | None = None
    calls: list[dict[str, Any]] = Field(default_factory=list, exclude=True)
    stream_index_offset: int = 0
    """Added to streamed tool-call indices (Anthropic numbers content blocks, not calls)."""

    @property
    def _llm_type(self) -> str:
        return "provider-fake"

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[Any, AIMessage]:
        return self.bind(tools=list(tools), tool_choice=tool_choice, **kwargs)

    def _answer(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: Any
    ) -> AIMessage:
        record = {"messages": messages, "stop": stop, **kwargs}
        self.calls.append(record)
        out = self.script(messages, record)
        if isinstance(out, BaseException):
            raise out
        return out

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("async only")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        await asyncio.sleep(0)
        return ChatResult(
            generations=[ChatGeneration(message=self._answer(messages, stop, kwargs))]
        )

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        message = self._answer(messages, stop, kwargs)
        text = str(message.content)
        words = text.split(" ") if text else []
        for i, word in enumerate(words):
            await asyncio.sleep(0)
            chunk = AIMessageChunk(content=word if i == 0 else " " + word)
            if run_manager is not None:
                await run_manager.on_llm_new_token(
                    chunk.text, chunk=ChatGenerationChunk(message=chunk)
                )
            yield ChatGenerationChunk(message=chunk)
        for i, call in enumerate(message.tool_calls):
            args = json.dumps(call["args"])
            half = len(args) // 2
            index = i + self.stream_index_offset
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content="",
                    tool_call_chunks=[
                        tool_call_chunk(
                            name=call["name"], args=args[:half], id=call["id"], index=index
                        )
                    ],
                )
            )
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content="",
                    tool_call_chunks=[tool_call_chunk(args=args[half:], index=index)],
                )
            )
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=message.usage_metadata,
                response_metadata=dict(message.response_metadata),
                chunk_position="last",
            )
        )


class ScriptedChatModel(BaseChatModel):
    """Agent-like fake: asks for `lookup(key=<last user text>)` once, then answers.

    A user message containing "boom" makes the model raise.
    """

    queue: Any = None
    tool_turns: int = 1

    @property
    def _llm_type(self) -> str:
        return "scripted-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("async only")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.queue is not None:
            await self.queue.submit()
        sib = current_sibling()
        if sib is not None:
            sib.turn += 1
        user = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        text = str(user.content)
        if "boom" in text:
            raise ValueError(f"model exploded on {text!r}")
        tool_results = [m for m in messages if isinstance(m, ToolMessage)]
        if len(tool_results) < self.tool_turns:
            msg = AIMessage(
                content="",
                tool_calls=[
                    {"name": "lookup", "args": {"key": text}, "id": f"call_{len(tool_results)}"}
                ],
            )
        else:
            msg = AIMessage(
                content=f"answer({text}):" + ",".join(str(t.content) for t in tool_results)
            )
        return ChatResult(generations=[ChatGeneration(message=msg)])


_IDS = itertools.count()


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, list[BaseMessage]]:
    """Graph input whose human message tells the scripted model which tools to call."""
    body = json.dumps([{"name": name, "args": args} for name, args in calls])
    return {"messages": [HumanMessage(body)]}


class ScriptedToolModel(BaseChatModel):
    """First turn: the tool calls listed (as JSON) in the human message, each with a
    fresh id; after tool results: a final answer joining their contents."""

    def _respond(self, messages: list[BaseMessage]) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            results = [m for m in messages if isinstance(m, ToolMessage)]
            text = "|".join(str(m.content) for m in results)
            message = AIMessage(content=f"final:{text}")
        else:
            human = next(m for m in messages if isinstance(m, HumanMessage))
            spec = json.loads(str(human.content))
            calls = [
                {
                    "name": c["name"],
                    "args": c["args"],
                    "id": f"call_{next(_IDS)}",
                    "type": "tool_call",
                }
                for c in spec
            ]
            message = AIMessage(content="", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._respond(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._respond(messages)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-model"
