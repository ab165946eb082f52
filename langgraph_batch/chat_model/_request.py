"""One `BatchedChatModel` call outside the scheduler: its request, its run, its answer.

`build_request` turns LangChain messages, `stop` and call kwargs into the
wire body (the model's fields, then `model_kwargs`, `extra_body`, then the
call's own kwargs), the request id, the sibling's turn and its `route_key`.
It reads the model's settings through `CallSettings`, the public fields it
needs, and never the model class itself.
`record_context` notes a sibling's KV working set after a call (what fan_out's
admission books in the server's ledger). `tool_call_check_for` gives the
check that rejects malformed tool calls. `run_call` and `stream_call` run a
built request through the model's `submit` (the scheduler) and give back
LangChain's output; `ls_params` is what LangSmith is told about a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from langchain_core.language_models import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from langgraph_batch._context import SiblingInfo, current_sibling, task_route_key
from langgraph_batch.backends.base import ChatChunk, ChatRequest, ChatResponse, sibling_route_key
from langgraph_batch.chat_model._convert import (
    chunk_generation_info,
    chunk_to_message_chunk,
    final_chunk,
    messages_to_openai,
    response_to_result,
    tool_call_check,
)

__all__ = (
    "CallSettings",
    "Submit",
    "build_request",
    "ls_params",
    "record_context",
    "request_params",
    "run_call",
    "stream_call",
    "tool_call_check_for",
)

# Call kwargs that are LangChain bookkeeping, never body fields.
_NOT_ON_WIRE = frozenset({"ls_structured_output_format", "structured_output_format", "stream"})
# Body fields where None means "leave it out".
_OMIT_IF_NONE = frozenset({"tool_choice", "parallel_tool_calls", "response_format", "tools"})
# Body fields an HTTP batch of plain prompts cannot carry.
_NOT_BATCHABLE = ("tools", "response_format", "n", "logprobs")


class CallSettings(Protocol):
    """The settings a call is built from (`BatchedChatModel`'s public fields)."""

    @property
    def model(self) -> str: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def logprobs(self) -> bool | None: ...
    @property
    def top_logprobs(self) -> int | None: ...
    @property
    def stop(self) -> list[str] | None: ...
    @property
    def model_kwargs(self) -> dict[str, Any]: ...
    @property
    def extra_body(self) -> dict[str, Any] | None: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def stream_chunk_timeout(self) -> float | None: ...


Built = tuple[ChatRequest, SiblingInfo | None]
"""A built call: its request (which carries the caller's turn) and the calling sibling."""
Submit = Callable[
    [ChatRequest, SiblingInfo | None, Callable[[ChatChunk], None] | None],
    Coroutine[Any, Any, ChatResponse],
]
"""How a call reaches the scheduler: `(request, sibling, on_chunk) -> response`."""
_END = object()


def request_params(
    model: CallSettings, stop: list[str] | None, kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The body fields of one call: the model's, `model_kwargs`, `extra_body`, the call's."""
    params: dict[str, Any] = {}
    if model.temperature is not None:
        params["temperature"] = model.temperature
    if model.max_tokens is not None:
        params["max_tokens"] = model.max_tokens
    if model.logprobs is not None:
        params["logprobs"] = model.logprobs
    if model.top_logprobs is not None:
        params["top_logprobs"] = model.top_logprobs
    stop_seq = stop if stop is not None else model.stop
    if stop_seq:
        params["stop"] = list(stop_seq)
    params.update(model.model_kwargs)
    if model.extra_body:
        params.update(model.extra_body)
    for key, value in kwargs.items():
        if key in _NOT_ON_WIRE or key in {"model", "extra_body"}:
            continue
        if value is None and key in _OMIT_IF_NONE:
            continue
        params[key] = value
    if extra := kwargs.get("extra_body"):
        params.update(extra)
    if params.get("tools") == []:
        params.pop("tools")
        params.pop("tool_choice", None)
    return params


def build_request(
    model: CallSettings,
    messages: Sequence[BaseMessage],
    stop: list[str] | None,
    kwargs: Mapping[str, Any],
    *,
    stream: bool,
) -> Built:
    """The request of one call (`turn`: the caller's completed calls) and the calling sibling."""
    sibling = current_sibling()
    if sibling is not None:
        turn = sibling.turn
        request_id = f"lgb-{sibling.group}-{sibling.index}-t{turn}-{uuid.uuid4().hex[:8]}"
    else:
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        request_id = f"lgb-{uuid.uuid4().hex}"
    params = request_params(model, stop, kwargs)
    if stream:
        params["stream_options"] = {"include_usage": True}
    batchable = not stream and not any(k in params for k in _NOT_BATCHABLE)
    batchable = batchable and all(m.type in {"human", "system"} for m in messages)
    request = ChatRequest(
        model=kwargs.get("model") or model.model,
        messages=messages_to_openai(messages),
        params=params,
        stream=stream,
        request_id=request_id,
        timeout=model.timeout,
        stream_chunk_timeout=model.stream_chunk_timeout or None,
        batchable=batchable,
        route_key=sibling_route_key(sibling.sibling_id)
        if sibling is not None
        else task_route_key(),
        turn=turn,
        retention_s=sibling.retention_hint() if sibling is not None else None,
        program=(sibling.run_id or sibling.group) if sibling is not None else None,
        final=sibling is not None and sibling.tool_name is not None and _binds_no_tool(params),
    )
    return request, sibling


def _binds_no_tool(params: Mapping[str, Any]) -> bool:
    """The call cannot call a tool: none bound, or `tool_choice="none"`."""
    return not params.get("tools") or params.get("tool_choice") == "none"


def tool_call_check_for(
    request: ChatRequest, invalid_tool_calls: str
) -> Callable[[ChatResponse], None] | None:
    """A response check that rejects malformed tool calls (None: nothing to check)."""
    tools = request.params.get("tools")
    if invalid_tool_calls != "raise" or not tools:
        return None
    return tool_call_check(
        tools, request_id=request.request_id or None, tool_choice=request.params.get("tool_choice")
    )


def record_context(sibling: SiblingInfo, response: ChatResponse) -> None:
    """Note the sibling's context size (its KV working set) after a completed call.

    fan_out's admission gate reads `SiblingInfo.context_tokens` to keep the
    siblings' resident KV within the server's cache.
    """
    usage = response.usage
    if usage is None or usage.total_tokens <= 0:
        return
    if sibling.turn == 1 and usage.cached_tokens:
        # On a sibling's first call the cached part of its prompt is the prefix
        # it shares with the others (system prompt, tools): the server holds
        # that KV once, so it is not part of this sibling's own working set.
        sibling.shared_tokens = usage.cached_tokens
    sibling.record_context(
        max(0, usage.prompt_tokens + usage.completion_tokens - sibling.shared_tokens)
    )


async def run_call(submit: Submit, built: Built) -> ChatResult:
    """Run a built call through `submit`; note the sibling's turn and context."""
    request, sibling = built
    response = await submit(request, sibling, None)
    if sibling is not None:
        sibling.turn += 1
        record_context(sibling, response)
    return response_to_result(response)


async def stream_call(
    submit: Submit, build: Callable[[], Built]
) -> AsyncIterator[ChatGenerationChunk]:
    """Build a streamed call (on first iteration), run it, yield its chunks, then the last one.

    The call runs in a task of its own that feeds a queue; a consumer that stops
    or is cancelled withdraws the request (cancelling the submit aborts the HTTP
    call), waiting for it at most 5 s.
    """
    request, sibling = build()
    chunks: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.create_task(submit(request, sibling, chunks.put_nowait))
    # Runs after the last on_chunk call: the backend calls on_chunk from
    # inside the submit task, so the queue sees every chunk before _END.
    task.add_done_callback(lambda _: chunks.put_nowait(_END))
    try:
        while (item := await chunks.get()) is not _END:
            if item.content or item.tool_call_chunks:
                yield ChatGenerationChunk(
                    message=chunk_to_message_chunk(item),
                    generation_info=chunk_generation_info(item),
                )
        response = task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
        elif not task.cancelled():
            # The consumer left just as the call ended: its outcome is nobody's now
            # (unread, asyncio would report "Task exception was never retrieved").
            task.exception()
    if sibling is not None:
        sibling.turn += 1
        record_context(sibling, response)
    yield ChatGenerationChunk(
        message=final_chunk(response),
        generation_info={"finish_reason": response.finish_reason},
    )


def ls_params(
    settings: CallSettings, provider: str, stop: list[str] | None, kwargs: Mapping[str, Any]
) -> LangSmithParams:
    """What LangSmith is told about a call: provider, model, temperature, max_tokens, stop."""
    params = LangSmithParams(
        ls_provider=provider,
        ls_model_name=kwargs.get("model") or settings.model,
        ls_model_type="chat",
    )
    temperature = kwargs.get("temperature", settings.temperature)
    if temperature is not None:
        params["ls_temperature"] = temperature
    max_tokens = kwargs.get("max_tokens", settings.max_tokens)
    if max_tokens is not None:
        params["ls_max_tokens"] = max_tokens
    if ls_stop := stop or kwargs.get("stop") or settings.stop:
        params["ls_stop"] = list(ls_stop)
    return params
