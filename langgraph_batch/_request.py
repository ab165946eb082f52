"""How one `BatchedChatModel` call becomes a `ChatRequest`, and what its answer teaches.

`build_request` turns LangChain messages, `stop` and call kwargs into the
wire body (the model's fields, then `model_kwargs`, `extra_body`, then the
call's own kwargs), the request id, the sibling's turn and its `route_key`.
`record_context` notes a sibling's KV working set after a call (what fan_out's
admission books in the server's ledger). `tool_call_check_for` gives the
check that rejects malformed tool calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage

from langgraph_batch._context import SiblingInfo, current_sibling
from langgraph_batch._convert import messages_to_openai, tool_call_check
from langgraph_batch.backends.base import ChatRequest, ChatResponse, sibling_route_key

if TYPE_CHECKING:
    from langgraph_batch.chat_model import BatchedChatModel

__all__ = ("build_request", "record_context", "request_params", "tool_call_check_for")

# Call kwargs that are LangChain bookkeeping, never body fields.
_NOT_ON_WIRE = frozenset({"ls_structured_output_format", "structured_output_format", "stream"})
# Body fields where None means "leave it out".
_OMIT_IF_NONE = frozenset({"tool_choice", "parallel_tool_calls", "response_format", "tools"})
# Body fields an HTTP batch of plain prompts cannot carry.
_NOT_BATCHABLE = ("tools", "response_format", "n", "logprobs")


def request_params(
    model: BatchedChatModel, stop: list[str] | None, kwargs: Mapping[str, Any]
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
    model: BatchedChatModel,
    messages: Sequence[BaseMessage],
    stop: list[str] | None,
    kwargs: Mapping[str, Any],
    *,
    stream: bool,
) -> tuple[ChatRequest, int, SiblingInfo | None]:
    """The request of one call, the caller's turn, and the calling sibling (if any)."""
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
        route_key=sibling_route_key(sibling.sibling_id) if sibling is not None else None,
        turn=turn,
    )
    return request, turn, sibling


def tool_call_check_for(
    request: ChatRequest, invalid_tool_calls: str
) -> Callable[[ChatResponse], None] | None:
    """A response check that rejects malformed tool calls (None: nothing to check)."""
    tools = request.params.get("tools")
    if invalid_tool_calls != "raise" or not tools:
        return None
    return tool_call_check(tools, request_id=request.request_id or None)


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
    sibling.context_tokens = max(
        0, usage.prompt_tokens + usage.completion_tokens - sibling.shared_tokens
    )
