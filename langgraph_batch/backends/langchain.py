"""`LangChainBackend`: any LangChain chat model behind the scheduler (degraded mode).

A team on a cloud model (`ChatAnthropic`, `ChatOpenAI` against the OpenAI
API, `ChatOllama`, ...) gets the scheduler without an OpenAI-compatible
server of its own: wrap the model, hand it to `BatchedChatModel(backend=...)`,
and every call of every sibling goes through one scheduler, with its slots
(`max_inflight`), priority, AIMD on 429, retries with `Retry-After`, rate
budgets (`BatchPolicy.rate_limit`; limits from `response_metadata["headers"]`
when the model keeps them, as `ChatOpenAI(include_response_headers=True)`
does), failure isolation in `fan_out` and tool coalescing.

What the wrapped model cannot give is what needs the engine: no engine-side
batching (list-prompt calls), no engine priority, no `/metrics` (so no KV-aware
admission and no metrics-driven slow start; the in-flight limit is
`max_inflight`, lowered after 429/503), no prefix warming.

How a request travels: the scheduler hands over an OpenAI-format
`ChatRequest`; this module turns its messages back into LangChain messages,
binds its tools with the wrapped model's own `bind_tools`, calls `ainvoke`
(or `astream` when streaming) and turns the resulting `AIMessage` back into a
`ChatResponse`. Failures map into `langgraph_batch.errors`
(`_langchain_errors.map_model_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig

from langgraph_batch._loop import background_loop
from langgraph_batch._rate_budget import observe_headers
from langgraph_batch.backends._langchain_convert import (
    StreamedCalls,
    finish_reason,
    message_tool_calls,
    openai_to_messages,
    tool_choice_for_bind,
    usage_of,
)
from langgraph_batch.backends._langchain_errors import map_model_error
from langgraph_batch.backends._langchain_identity import fingerprint, is_openai_like, model_name
from langgraph_batch.backends._prompt_cache import (
    anthropic_breakpoints,
    cache_style,
    has_cache_control,
    openai_cache_key,
    ttl_for,
)
from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    ModelInfo,
    ToolCall,
    ToolCallChunk,
)
from langgraph_batch.errors import BackendBadRequestError, BackendError, BackendTimeoutError

__all__ = ("LangChainBackend",)

logger = logging.getLogger(__name__)

# Body fields handled here (or meaningless for a LangChain call); every other
# `ChatRequest.params` entry goes to the wrapped model as a call kwarg.
_HANDLED = frozenset(
    {"tools", "tool_choice", "parallel_tool_calls", "response_format", "stop", "stream"}
)
_DROPPED = frozenset({"stream_options", "model"})

_END = object()

# The inner call is this backend's "HTTP request": it must not report its own
# LLM run to the graph's callbacks, or `stream_mode="messages"` and
# `astream_events` would see every token twice (once from BatchedChatModel).
_INNER_CONFIG: RunnableConfig = {"callbacks": []}


@dataclass(slots=True, kw_only=True)
class _Call:
    """One prepared call of the wrapped model."""

    runnable: Runnable[LanguageModelInput, BaseMessage]
    messages: list[BaseMessage]
    stop: list[str] | None
    kwargs: dict[str, Any]
    schema_tool: str | None = None
    """Structured output by a forced tool call: the tool whose arguments are the answer."""


class LangChainBackend(Backend):
    """Any LangChain chat model as a scheduler backend (degraded mode).

    `BatchedChatModel(backend=LangChainBackend(model))` and `fan_out` give a
    cloud or local LangChain model the scheduler: slots (`max_inflight`),
    priority order of the queue, AIMD on 429, retries with `Retry-After`,
    failure isolation and tool coalescing. Engine-side batching, engine
    priority, KV-aware admission and metrics-driven slot sizing need an
    inference server and are absent.

    What passes through:

    - **messages**: OpenAI-format messages become LangChain messages again.
      Content the OpenAI format does not carry (Anthropic thinking blocks,
      reasoning items) was dropped before the request reached the scheduler.
    - **tools**: the OpenAI tool dicts go to the model's own `bind_tools`,
      with `tool_choice` (`required` as `"any"`, a function as its name) and
      `parallel_tool_calls`.
    - **structured output**: `response_format` is passed as a call kwarg to
      OpenAI-like models (langchain-openai's classes and subclasses, or
      `pass_response_format=True`). For other models a `json_schema` format
      becomes a forced call of a tool with that schema (what
      `with_structured_output(method="function_calling")` does) and its
      arguments become the answer's JSON content; `json_object`, and a
      `json_schema` together with tools, are refused with
      `BackendBadRequestError` (use `with_structured_output(...,
      method="function_calling")` or create_agent's `ToolStrategy`).
    - **other parameters** (`max_tokens`, `temperature`, `top_p`, `seed`,
      `logprobs`, `extra_body` fields, ...) go to the wrapped model as call
      kwargs, which ChatOpenAI and ChatAnthropic merge into their request;
      `stop` is passed as `stop`. The wrapped model's own settings apply
      otherwise; `BatchedChatModel(model=...)` is only a label here.
    - **streaming**: `astream` fragments reach the caller as text and
      tool-call chunks; **usage** comes from `usage_metadata`: cache reads
      from `input_token_details.cache_read`, cache writes from
      `cache_creation` (and the `ephemeral_5m/1h_input_tokens` split).
    - **prompt caching** (`prompt_caching`, on by default): `ChatAnthropic`
      requests get two `cache_control` breakpoints, one on the shared prefix
      (tools and system) and one on the last message, with a 5m or 1h TTL
      from the predicted tool wait; `ChatBedrockConverse` (Claude, Nova) gets
      the same as its `cache_control` kwarg; `ChatOpenAI` against OpenAI's
      API a `prompt_cache_key` per shared prefix and group of siblings.
      Requests that carry breakpoints of their own are left alone. With
      Anthropic and Bedrock models, siblings sharing a prefix wait until the
      first one's answer begins, which is when its cache entry can be read
      (the scheduler's prefix warming). See docs/hosted-apis.md.
    - **errors**: the provider's exceptions become the `langgraph_batch.errors`
      an HTTP backend raises (429 with `retry_after_s`, 5xx, timeouts,
      connection, authentication, bad request, context overflow), so the
      scheduler retries and adapts the same way. Build the wrapped model with
      `max_retries=0` so that the scheduler, not the provider SDK, sees and
      retries 429s (a warning is logged otherwise).

    Args:
        chat_model: The LangChain chat model to call.
        key: Names the scheduler to share (default: a fingerprint of the
            model's class and configuration, credentials included as a
            salted hash, never in clear).
        pass_response_format: Pass `response_format` through as a call kwarg
            (default: True for OpenAI-like models).
        timeout: Seconds one call may take when the request sets no timeout
            (None: no limit beyond the wrapped model's own).
        isolate_loop: Run every call of the wrapped model on langgraph-batch's
            background event loop, whatever loop the caller runs in. Provider
            SDKs bind their pooled HTTP connections to the loop that first used
            them (langchain-openai even shares one cached client per base URL),
            so a model called from several loops fails with "bound to a
            different event loop" or "Event loop is closed": BatchedChatModel's
            sync calls run on the background loop, async ones on yours, and
            each `asyncio.run` is a new loop. False: call in the caller's loop
            (one thread hop less; use it when one loop does all the calls).
        prompt_caching: Prompt-cache hints for hosted APIs (see above).
            `"auto"`: Anthropic and Bedrock models, and OpenAI models against
            OpenAI's or Azure's API; True: also OpenAI-like models elsewhere;
            False: none (the opt-out), and no prefix warming.

    Raises:
        TypeError: If `chat_model` is not a `BaseChatModel`.
        ValueError: If `timeout` is not > 0.

    Example:
        ```python
        from langchain_anthropic import ChatAnthropic
        from langgraph_batch import BatchedChatModel
        from langgraph_batch.backends import LangChainBackend

        claude = ChatAnthropic(model="claude-haiku-4-5", max_retries=0)
        llm = BatchedChatModel(
            model="claude-haiku-4-5",  # a label; the wrapped model decides
            backend=LangChainBackend(claude),
            max_inflight=16,  # the provider's concurrency limit
        )
        ```

    !!! version-added "Added in 0.2.0"
    """

    capabilities = BackendCapabilities(flavor="openai")

    def __init__(
        self,
        chat_model: BaseChatModel,
        *,
        key: str | None = None,
        pass_response_format: bool | None = None,
        timeout: float | None = None,
        isolate_loop: bool = True,
        prompt_caching: bool | Literal["auto"] = "auto",
    ) -> None:
        if not isinstance(chat_model, BaseChatModel):
            raise TypeError(
                "LangChainBackend wraps a LangChain BaseChatModel (ChatOpenAI, ChatAnthropic, "
                f"...), got {type(chat_model).__name__}; pass the model itself, not a "
                "bound runnable (tools and options travel with each request)."
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if prompt_caching not in (True, False, "auto"):
            raise ValueError(
                f"prompt_caching must be True, False or 'auto', got {prompt_caching!r}"
            )
        self._model = chat_model
        self._model_name = model_name(chat_model)
        self._label = f"{type(chat_model).__name__}({self._model_name})"
        self._openai_like = is_openai_like(chat_model)
        self._pass_response_format = (
            self._openai_like if pass_response_format is None else pass_response_format
        )
        self._timeout = timeout
        self._isolate_loop = isolate_loop
        self._cache_style = cache_style(chat_model, mode=prompt_caching)
        # A hosted cache entry is readable once the first answer begins: siblings
        # sharing a prefix wait for it (prefix warming) rather than all writing it.
        self.capabilities = BackendCapabilities(
            flavor="openai", hosted_prompt_cache=self._cache_style in ("anthropic", "bedrock")
        )
        self._home_started = False
        suffix = key if key is not None else fingerprint(chat_model)
        self._key = f"LangChainBackend:{type(chat_model).__name__}:{self._model_name}:{suffix}"
        retries = getattr(chat_model, "max_retries", None)
        if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0:
            logger.warning(
                "%s retries failed calls itself (max_retries=%d): the scheduler sees a 429 "
                "only after those retries and retries multiply; build it with max_retries=0 "
                "and let BatchedChatModel(max_retries=...) retry.",
                self._label,
                retries,
            )

    @property
    def chat_model(self) -> BaseChatModel:
        """The wrapped LangChain chat model."""
        return self._model

    @property
    def model_name(self) -> str:
        """The wrapped model's name (its `model_name` / `model` field, else its class)."""
        return self._model_name

    @property
    def key(self) -> str:
        """`LangChainBackend:<class>:<model>:<fingerprint>`; never contains a secret.

        Models of the same class and configuration (credentials included) share
        a key, hence a scheduler; any difference separates them. The fingerprint
        is salted per process.
        """
        return self._key

    def __repr__(self) -> str:
        return f"LangChainBackend({self._label}, key={self._key!r})"

    async def models(self) -> list[ModelInfo]:
        """The wrapped model's name."""
        return [ModelInfo(id=self._model_name)]

    # ------------------------------------------------------------------ calls

    async def chat(
        self,
        request: ChatRequest,
        *,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        """Run one request on the wrapped model (`ainvoke`, or `astream` when streaming).

        With `isolate_loop` the call runs on langgraph-batch's background loop;
        streamed chunks still reach `on_chunk` from the calling task, in order,
        before this returns. Cancelling the caller cancels the call there.

        Raises:
            BackendError: A subclass for every failure of the wrapped model.
        """
        home = background_loop() if self._isolate_loop else None
        if home is None or home.in_loop_thread():
            return await self._chat(request, on_chunk)
        if not self._home_started:
            # Starting the loop's thread blocks briefly: not on the caller's loop.
            await asyncio.to_thread(lambda: home.loop)
            self._home_started = True
        if on_chunk is None:
            return await asyncio.wrap_future(home.submit(self._chat(request, None)))
        caller = asyncio.get_running_loop()
        chunks: asyncio.Queue[Any] = asyncio.Queue()

        def relay(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone
                caller.call_soon_threadsafe(chunks.put_nowait, item)

        async def run() -> ChatResponse:
            try:
                return await self._chat(request, relay)
            finally:
                relay(_END)  # after every chunk: the caller drains them all first

        future = asyncio.wrap_future(home.submit(run()))
        try:
            while (item := await chunks.get()) is not _END:
                on_chunk(item)
            return await future
        finally:
            if not future.done():
                future.cancel()  # cancels the call on the background loop

    async def _chat(
        self, request: ChatRequest, on_chunk: Callable[[ChatChunk], None] | None
    ) -> ChatResponse:
        timeout = request.timeout if request.timeout is not None else self._timeout
        deadline = asyncio.timeout(timeout)
        try:
            call = self._prepare(request)
            async with deadline:
                if request.stream and on_chunk is not None and call.schema_tool is None:
                    return await self._stream(call, request, on_chunk)
                message = await call.runnable.ainvoke(
                    call.messages, _INNER_CONFIG, stop=call.stop, **call.kwargs
                )
            response = self._response(message, request, call.schema_tool)
        except BackendError:
            raise
        except TimeoutError as exc:
            if deadline.expired():
                raise BackendTimeoutError(
                    f"{self._label} did not answer within {timeout} s.",
                    request_id=request.request_id,
                ) from None
            raise self._error(exc, request) from exc
        except Exception as exc:
            raise self._error(exc, request) from exc
        if request.stream and on_chunk is not None:
            # A structured answer is produced whole: hand it over as one chunk.
            on_chunk(
                ChatChunk(
                    content=response.content or "",
                    tool_call_chunks=tuple(
                        ToolCallChunk(index=i, id=c.id, name=c.name, arguments=c.arguments)
                        for i, c in enumerate(response.tool_calls)
                    ),
                )
            )
            on_chunk(ChatChunk(finish_reason=response.finish_reason, usage=response.usage))
        return response

    def _error(self, exc: Exception, request: ChatRequest) -> BackendError:
        return map_model_error(
            exc, label=self._label, model=self._model_name, request_id=request.request_id
        )

    def _prepare(self, request: ChatRequest) -> _Call:
        params = dict(request.params)
        tools = params.get("tools") or None
        choice = params.get("tool_choice")
        response_format = params.get("response_format")
        stop = params.get("stop")
        kwargs = {k: v for k, v in params.items() if k not in _HANDLED and k not in _DROPPED}
        schema_tool: str | None = None
        fmt_type = response_format.get("type") if isinstance(response_format, Mapping) else None
        if response_format is None or fmt_type == "text":
            pass
        elif self._pass_response_format:
            kwargs["response_format"] = response_format
        elif fmt_type == "json_schema" and not tools:
            assert isinstance(response_format, Mapping)
            spec = response_format.get("json_schema") or {}
            schema_tool = str(spec.get("name") or "response")
            function: dict[str, Any] = {
                "name": schema_tool,
                "description": spec.get("description") or "Answer in this format.",
                "parameters": spec.get("schema") or {"type": "object"},
            }
            tools = [{"type": "function", "function": function}]
            choice = schema_tool
        else:
            reason = (
                "a json_schema response format together with tools"
                if fmt_type == "json_schema"
                else f"response_format type {fmt_type!r}"
            )
            raise BackendBadRequestError(
                f"{self._label} cannot take {reason} through LangChainBackend: use "
                "with_structured_output(..., method='function_calling') or create_agent's "
                "ToolStrategy, or pass_response_format=True for a model that accepts "
                "response_format.",
                request_id=request.request_id,
            )
        messages = openai_to_messages(request.messages)
        style = self._cache_style
        if style is not None and not has_cache_control(messages, tools):
            ttl = ttl_for(request.retention_s)
            if style == "anthropic":
                messages, anthropic_tools = anthropic_breakpoints(messages, tools, ttl=ttl)
                if anthropic_tools is not None:
                    tools = anthropic_tools
            elif style == "bedrock":
                kwargs.setdefault("cache_control", {"type": "ephemeral", "ttl": ttl})
            else:
                kwargs.setdefault(
                    "prompt_cache_key",
                    openai_cache_key(request.messages, tools, request.route_key),
                )
        runnable: Runnable[LanguageModelInput, BaseMessage] = self._model
        if tools:
            bind: dict[str, Any] = {}
            if (mapped := tool_choice_for_bind(choice)) is not None:
                bind["tool_choice"] = mapped
            if params.get("parallel_tool_calls") is not None:
                bind["parallel_tool_calls"] = params["parallel_tool_calls"]
            try:
                runnable = self._model.bind_tools(list(tools), **bind)
            except NotImplementedError:
                raise BackendBadRequestError(
                    f"{self._label} does not implement bind_tools: it cannot call tools.",
                    request_id=request.request_id,
                ) from None
        if request.stream and self._openai_like:
            kwargs["stream_usage"] = True
        return _Call(
            runnable=runnable,
            messages=messages,
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
            kwargs=kwargs,
            schema_tool=schema_tool,
        )

    async def _stream(
        self, call: _Call, request: ChatRequest, on_chunk: Callable[[ChatChunk], None]
    ) -> ChatResponse:
        total: AIMessageChunk | None = None
        calls = StreamedCalls()
        finish: str | None = None
        stream = call.runnable.astream(call.messages, _INNER_CONFIG, stop=call.stop, **call.kwargs)
        started = False
        try:
            async for part in stream:
                if not isinstance(part, AIMessageChunk):
                    continue
                if not started:
                    # The answer has begun (Anthropic's `message_start`, OpenAI's role
                    # delta): an empty chunk, as the HTTP backends pass on, tells a
                    # prefix-warming leader's followers that the prefix is cached.
                    started = True
                    on_chunk(ChatChunk())
                total = part if total is None else total + part
                finish = finish_reason(part.response_metadata) or finish
                text = str(part.text)
                fragments = tuple(calls.add(c) for c in part.tool_call_chunks)
                if text or fragments:
                    on_chunk(ChatChunk(content=text, tool_call_chunks=fragments))
        finally:
            # Close the provider's stream now (and its HTTP response), also on
            # cancellation, rather than whenever the generator is collected.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        tool_calls = tuple(calls.tool_calls())
        response = self._response(
            total if total is not None else AIMessageChunk(content=""),
            request,
            None,
            tool_calls=tool_calls,
            finish=finish,
        )
        on_chunk(ChatChunk(finish_reason=response.finish_reason, usage=response.usage))
        return response

    def _response(
        self,
        message: BaseMessage,
        request: ChatRequest,
        schema_tool: str | None,
        *,
        tool_calls: tuple[ToolCall, ...] | None = None,
        finish: str | None = None,
    ) -> ChatResponse:
        meta = message.response_metadata
        # ChatOpenAI(include_response_headers=True) keeps the HTTP headers here:
        # their rate limits feed the key's budget (ChatAnthropic keeps none).
        headers = meta.get("headers")
        observe_headers(self._key, headers if isinstance(headers, Mapping) else None)
        content: str | None = str(message.text) or None
        calls = tuple(message_tool_calls(message)) if tool_calls is None else tool_calls
        finish = finish or finish_reason(meta)
        if schema_tool is not None:
            answer = next((c for c in calls if c.name == schema_tool), None)
            if answer is not None:
                # The forced tool call is the structured answer: its arguments
                # are the JSON the caller's parser reads from the content.
                content, calls, finish = answer.arguments, (), "stop"
        if calls and finish in (None, "stop"):
            finish = "tool_calls"
        model = meta.get("model_name") or meta.get("model") or self._model_name
        response_id = meta.get("id") or message.id or f"lc-{request.request_id}"
        return ChatResponse(
            id=str(response_id),
            model=str(model),
            content=content,
            tool_calls=calls,
            finish_reason=finish or "stop",
            usage=usage_of(message),
            request_id=request.request_id,
        )
