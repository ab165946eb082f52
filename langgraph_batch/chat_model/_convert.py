"""Conversion between LangChain messages and the OpenAI chat-completions wire format.

`BatchedChatModel` sends OpenAI message dicts (`ChatRequest.messages`) and gets
back backend-neutral `ChatResponse` / `ChatChunk` objects; this module turns
one into the other. It follows `langchain_openai.ChatOpenAI`'s conventions
(role mapping, tool-call replay, `invalid_tool_calls` for arguments that are
not JSON, usage metadata) without depending on the `openai` SDK.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
    convert_to_openai_data_block,
    is_data_content_block,
)
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatResult

from langgraph_batch.backends.base import ChatChunk, ChatResponse, Usage
from langgraph_batch.backends.base import ToolCall as WireToolCall
from langgraph_batch.errors import MalformedToolCallError

__all__ = (
    "chunk_generation_info",
    "chunk_to_message_chunk",
    "final_chunk",
    "first_malformed_tool_call",
    "forced_tool",
    "message_to_openai",
    "messages_to_openai",
    "parse_tool_calls",
    "response_metadata",
    "response_to_message",
    "response_to_result",
    "tool_call_check",
    "usage_to_metadata",
)

logger = logging.getLogger(__name__)

# Content blocks that other providers put into assistant content and that an
# OpenAI-compatible server would reject (ChatOpenAI drops the same ones).
_DROPPED_BLOCK_TYPES = frozenset(
    {"tool_use", "thinking", "reasoning_content", "reasoning", "function_call"}
)


def _format_content(content: Any) -> Any:
    """Turn LangChain message content into chat-completions content."""
    if not isinstance(content, list):
        return content
    formatted: list[Any] = []
    for block in content:
        if isinstance(block, str):
            formatted.append({"type": "text", "text": block})
            continue
        if not isinstance(block, dict):
            formatted.append(block)
            continue
        block_type = block.get("type")
        if block_type in _DROPPED_BLOCK_TYPES:
            continue
        if is_data_content_block(block):
            formatted.append(convert_to_openai_data_block(block))
        elif block_type == "text" and "text" in block:
            # Keep only what the wire format knows: LangChain adds ids,
            # annotations and `extras` that strict servers reject.
            formatted.append({"type": "text", "text": block["text"]})
        elif block_type == "image" and isinstance(source := block.get("source"), dict):
            # Anthropic-style image blocks.
            if source.get("type") == "base64" and source.get("data"):
                url = f"data:{source.get('media_type')};base64,{source['data']}"
                formatted.append({"type": "image_url", "image_url": {"url": url}})
            elif source.get("type") == "url" and source.get("url"):
                formatted.append({"type": "image_url", "image_url": {"url": source["url"]}})
        else:
            formatted.append(block)
    return formatted


def _tool_call_to_openai(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function",
        "id": call["id"],
        "function": {
            "name": call["name"],
            "arguments": json.dumps(call["args"], ensure_ascii=False),
        },
    }


def _invalid_tool_call_to_openai(call: InvalidToolCall) -> dict[str, Any]:
    return {
        "type": "function",
        "id": call.get("id"),
        "function": {"name": call.get("name"), "arguments": call.get("args") or ""},
    }


def message_to_openai(message: BaseMessage) -> dict[str, Any]:
    """Convert one LangChain message to an OpenAI chat-completions message dict.

    Args:
        message: Any LangChain message (human, AI, system, tool, function, chat).

    Returns:
        The message as sent on the wire.

    Raises:
        TypeError: If the message type has no OpenAI equivalent.
    """
    out: dict[str, Any] = {"content": _format_content(message.content)}
    name = message.name or message.additional_kwargs.get("name")
    if name is not None:
        out["name"] = name
    if isinstance(message, ChatMessage):
        out["role"] = message.role
    elif isinstance(message, HumanMessage):
        out["role"] = "user"
    elif isinstance(message, AIMessage):
        out["role"] = "assistant"
        if message.tool_calls or message.invalid_tool_calls:
            out["tool_calls"] = [_tool_call_to_openai(tc) for tc in message.tool_calls] + [
                _invalid_tool_call_to_openai(tc) for tc in message.invalid_tool_calls
            ]
        elif "tool_calls" in message.additional_kwargs:
            out["tool_calls"] = [
                {k: v for k, v in tc.items() if k in {"id", "type", "function"}}
                for tc in message.additional_kwargs["tool_calls"]
            ]
        elif "function_call" in message.additional_kwargs:
            out["function_call"] = message.additional_kwargs["function_call"]
        if "tool_calls" in out or "function_call" in out:
            # With tool calls, an empty content must be null, not "" or [].
            out["content"] = out["content"] or None
    elif isinstance(message, SystemMessage):
        out["role"] = message.additional_kwargs.get("__openai_role__", "system")
    elif isinstance(message, FunctionMessage):
        out["role"] = "function"
    elif isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": out["content"]}
    else:
        msg = (
            f"Cannot send a {type(message).__name__} to an OpenAI-compatible server; "
            "use HumanMessage, AIMessage, SystemMessage, ToolMessage or ChatMessage."
        )
        raise TypeError(msg)
    return out


def messages_to_openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Convert a conversation to OpenAI message dicts (see `message_to_openai`)."""
    return [message_to_openai(m) for m in messages]


def parse_tool_calls(
    raw: Sequence[WireToolCall],
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """Split the model's tool calls into valid ones and `invalid_tool_calls`.

    Arguments must be a JSON object (an empty string counts as `{}`); anything
    else becomes an `InvalidToolCall` carrying the raw text and the reason, so
    `ToolNode` can answer it with an error message instead of crashing.

    Args:
        raw: The tool calls of a `ChatResponse`.

    Returns:
        `(tool_calls, invalid_tool_calls)`.
    """
    valid: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in raw:
        text = call.arguments or ""
        error: str | None = None
        args: Any = {}
        if text.strip():
            try:
                args = json.loads(text, strict=False)
            except json.JSONDecodeError as exc:
                error = f"Tool call arguments are not valid JSON ({exc}): {text[:200]!r}"
            else:
                if not isinstance(args, dict):
                    error = (
                        f"Tool call arguments must be a JSON object, got "
                        f"{type(args).__name__}: {text[:200]!r}"
                    )
        if error is not None:
            logger.debug("invalid tool call %s: %s", call.name, error)
            invalid.append(invalid_tool_call(name=call.name, args=text, id=call.id, error=error))
        else:
            valid.append(tool_call(name=call.name, args=args, id=call.id))
    return valid, invalid


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, schema: Any) -> bool:
    """Whether `value` fits the top-level `type`/`enum`/`anyOf` of a property schema.

    Anything the check does not understand (`$ref`, `allOf`, formats) passes:
    it is a guard against broken calls, not a full JSON Schema validator.
    """
    if not isinstance(schema, dict):
        return True
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches:
        return any(_type_ok(value, b) for b in branches)
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and value not in enum:
        return False
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if not kinds:
        return True
    for k in kinds:
        types = _JSON_TYPES.get(k)
        if types is None:
            return True
        if isinstance(value, bool) and k in ("integer", "number"):
            continue
        if isinstance(value, types):
            return True
        if k == "integer" and isinstance(value, float) and value.is_integer():
            return True
    return False


def _schema_problem(args: dict[str, Any], schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    if isinstance(required, list):
        missing = [name for name in required if name not in args]
        if missing:
            return f"miss the required propert{'y' if len(missing) == 1 else 'ies'} {missing}"
    for name, value in args.items():
        prop = props.get(name)
        if prop is None:
            if schema.get("additionalProperties") is False:
                return f"have a property {name!r} the tool does not take"
            continue
        if not _type_ok(value, prop):
            wanted = prop.get("type") or prop.get("enum") or "its schema"
            return f"give {name!r} a {type(value).__name__} where the tool wants {wanted}"
    return None


def first_malformed_tool_call(
    raw: Sequence[WireToolCall], tools: Sequence[Any] | None
) -> tuple[WireToolCall, str] | None:
    """The first tool call the bound tools cannot take, and why.

    A call is malformed when its arguments are not JSON, not a JSON object, or
    (for a bound tool with a JSON schema) miss a required property, have a
    top-level property of the wrong type or outside its `enum`, or a property
    the schema forbids (`additionalProperties: false`). Calls of tools that are
    not bound are left to the tool node, which answers them with an error.

    Args:
        raw: The tool calls of a `ChatResponse`.
        tools: The OpenAI tool dicts sent with the request (`params["tools"]`).

    Returns:
        `(call, reason)` for the first malformed call, or None.

    Example:
        ```python
        bad = first_malformed_tool_call(response.tool_calls, request.params.get("tools"))
        if bad is not None:
            call, reason = bad  # reason: "are not valid JSON (...)"
        ```
    """
    schemas: dict[str, Any] = {}
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            schemas[fn["name"]] = fn.get("parameters")
    for call in raw:
        text = call.arguments or ""
        if not text.strip():
            args: Any = {}
        else:
            try:
                args = json.loads(text, strict=False)
            except json.JSONDecodeError as exc:
                return call, f"are not valid JSON ({exc})"
        if not isinstance(args, dict):
            return call, f"are a JSON {type(args).__name__}, not an object"
        if call.name in schemas:
            problem = _schema_problem(args, schemas[call.name])
            if problem is not None:
                return call, problem
    return None


def forced_tool(tool_choice: Any) -> str | None:
    """The tool a wire `tool_choice` forces: its name, `""` for `"required"`, None: not forced."""
    if tool_choice == "required":
        return ""
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        return name if isinstance(name, str) else ""
    return None


_CONSTRAIN_HINT = (
    "On vLLM a forced tool_choice (a tool name, 'required') constrains the call; vLLM "
    ">= 0.32 pins its arguments to the schema only for strict tools, and BatchedChatModel "
    "sends forced tools as strict unless bind_tools(strict=False). "
    "invalid_tool_calls='return' hands such calls to the graph."
)


def tool_call_check(
    tools: Sequence[Any], *, request_id: str | None = None, tool_choice: Any = None
) -> Callable[[ChatResponse], None]:
    """A `Scheduler.submit(check=...)` that raises `MalformedToolCallError` for a bad call.

    A response is bad when one of its tool calls is malformed
    (`first_malformed_tool_call`), or when `tool_choice` forced a call (a named
    tool, `"required"`) and the response has none: the server's tool parser
    could not read what the model wrote (vLLM then returns the raw
    `<tool_call>...` text as content), typically because it was cut off
    (`finish_reason="length"`). The scheduler retries the request on that
    (retryable) error within `max_retries`; the error raised last counts the
    malformed responses seen.

    Args:
        tools: the OpenAI tool dicts sent with the request.
        request_id: the request's id (for the error).
        tool_choice: the request's wire `tool_choice` (None: not sent).

    Returns:
        The check: it returns quietly when every tool call is well formed.
    """
    attempts = 0
    forced = forced_tool(tool_choice)

    def check(response: ChatResponse) -> None:
        nonlocal attempts
        cut = " (the response was cut off: finish_reason 'length', raise max_tokens)"
        cut = cut if response.finish_reason == "length" else ""
        why = cut or " (the server's tool parser could not read the output)"
        if not response.tool_calls:
            if forced is None:
                return
            attempts += 1
            what = f"tool {forced!r}" if forced else "a tool"
            raise MalformedToolCallError(
                f"tool_choice forced a call of {what} but the response has no tool call"
                f"{why}. Retried within "
                f"max_retries ({attempts} malformed response(s)). {_CONSTRAIN_HINT}",
                tool_name=forced,
                arguments=response.content or "",
                reason="no tool call although tool_choice forced one",
                finish_reason=response.finish_reason,
                attempts=attempts,
                request_id=request_id,
            )
        bad = first_malformed_tool_call(response.tool_calls, tools)
        if bad is None:
            return
        attempts += 1
        call, reason = bad
        raise MalformedToolCallError(
            f"the model called tool {call.name!r} with arguments that {reason}{cut}: "
            f"{call.arguments[:200]!r}. Retried within max_retries ({attempts} malformed "
            f"response(s)). {_CONSTRAIN_HINT}",
            tool_name=call.name,
            arguments=call.arguments,
            reason=reason,
            tool_call_id=call.id,
            finish_reason=response.finish_reason,
            attempts=attempts,
            request_id=request_id,
        )

    return check


def usage_to_metadata(usage: Usage) -> UsageMetadata:
    """LangChain `usage_metadata` from the server's token counts."""
    metadata = UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )
    details = InputTokenDetails()
    if usage.cached_tokens is not None:
        details["cache_read"] = usage.cached_tokens
    if usage.cache_creation_tokens is not None:
        details["cache_creation"] = usage.cache_creation_tokens
    if usage.cache_creation_1h_tokens is not None:
        # Anthropic's TTL split of `cache_creation` (as langchain-anthropic names it).
        split: dict[str, int] = {
            "ephemeral_1h_input_tokens": usage.cache_creation_1h_tokens,
            "ephemeral_5m_input_tokens": (usage.cache_creation_tokens or 0)
            - usage.cache_creation_1h_tokens,
        }
        details.update(split)  # type: ignore[typeddict-item]
    if details:
        metadata["input_token_details"] = details
    return metadata


def response_metadata(
    *,
    model: str,
    finish_reason: str | None,
    request_id: str,
    response_id: str | None,
) -> dict[str, Any]:
    """The `response_metadata` every message and final chunk carries."""
    meta: dict[str, Any] = {"model_name": model, "finish_reason": finish_reason}
    meta["request_id"] = request_id
    if response_id is not None:
        meta["id"] = response_id
    return meta


def response_to_message(response: ChatResponse) -> AIMessage:
    """Build the `AIMessage` for a finished (non-streamed) chat completion.

    Args:
        response: What the backend returned.

    Returns:
        An AIMessage with content, tool calls (valid and invalid), usage and
        response metadata (`model_name`, `finish_reason`, `request_id`, `id`;
        `usage_estimated` when the usage is a share of a batched call's totals).
    """
    tool_calls, invalid = parse_tool_calls(response.tool_calls)
    return AIMessage(
        content=response.content or "",
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
        usage_metadata=usage_to_metadata(response.usage) if response.usage else None,
        response_metadata=_with_logprobs(_metadata_of(response), response.logprobs),
    )


def _with_logprobs(
    meta: dict[str, Any], logprobs: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    # ChatOpenAI's place and shape: response_metadata["logprobs"] = {"content": [...]}.
    if logprobs is not None:
        meta["logprobs"] = {"content": [dict(entry) for entry in logprobs]}
    return meta


def chunk_generation_info(chunk: ChatChunk) -> dict[str, Any] | None:
    """A streamed delta's `generation_info`: its tokens' logprobs, as ChatOpenAI's.

    LangChain copies it into the chunk's `response_metadata`, and adding the
    chunks concatenates the `logprobs.content` lists.
    """
    if not chunk.logprobs:
        return None
    return {"logprobs": {"content": [dict(entry) for entry in chunk.logprobs]}}


def _metadata_of(response: ChatResponse) -> dict[str, Any]:
    meta = response_metadata(
        model=response.model,
        finish_reason=response.finish_reason,
        request_id=response.request_id,
        response_id=response.id,
    )
    if response.queue_wait_s is not None:
        # The scheduler's queue wait travels with the run (on_chat_model_end, LangSmith).
        meta["queue_wait_s"] = round(response.queue_wait_s, 6)
    if response.usage is not None and response.usage.estimated:
        # A batched call's usage is reported per call: this is the request's share.
        meta["usage_estimated"] = True
    return meta


def chunk_to_message_chunk(chunk: ChatChunk) -> AIMessageChunk:
    """Build the `AIMessageChunk` for one streamed delta (text and tool-call fragments).

    Usage and finish reason are left out: the model emits them once, on the
    final chunk, from the aggregated response.
    """
    return AIMessageChunk(
        content=chunk.content,
        tool_call_chunks=[
            tool_call_chunk(name=tc.name, args=tc.arguments, id=tc.id, index=tc.index)
            for tc in chunk.tool_call_chunks
        ],
    )


def final_chunk(response: ChatResponse) -> AIMessageChunk:
    """The closing chunk of a stream: usage, metadata and `chunk_position="last"`."""
    return AIMessageChunk(
        content="",
        usage_metadata=usage_to_metadata(response.usage) if response.usage else None,
        response_metadata=_metadata_of(response),
        chunk_position="last",
    )


def response_to_result(response: ChatResponse) -> ChatResult:
    """The `ChatResult` of a non-streamed call: the message and the call's `llm_output`."""
    message = response_to_message(response)
    generation = ChatGeneration(
        message=message,
        generation_info={"finish_reason": response.finish_reason},
    )
    llm_output: dict[str, Any] = {
        "model_name": response.model,
        "id": response.id,
        "request_id": response.request_id,
        "queue_wait_s": response.queue_wait_s,
    }
    if message.usage_metadata:
        llm_output["token_usage"] = dict(message.usage_metadata)
    return ChatResult(generations=[generation], llm_output=llm_output)
