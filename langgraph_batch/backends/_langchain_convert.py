"""Conversions between `ChatRequest`/`ChatResponse` and LangChain for `LangChainBackend`.

The request side turns OpenAI-format messages back into LangChain messages
and `tool_choice` into what `bind_tools` methods accept; the response side
reads an `AIMessage` (or a stream of `AIMessageChunk`s) into the
backend-neutral `ChatResponse` / `ChatChunk` pieces: finish reason (OpenAI,
Anthropic and Ollama spellings), usage from `usage_metadata`, tool calls with
their raw argument text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import ToolCall as LCToolCall
from langchain_core.messages.tool import invalid_tool_call, tool_call

from langgraph_batch.backends.base import ToolCall, ToolCallChunk, Usage
from langgraph_batch.errors import BackendBadRequestError

__all__ = (
    "StreamedCalls",
    "finish_reason",
    "message_tool_calls",
    "openai_to_messages",
    "tool_choice_for_bind",
    "usage_of",
)

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "STOP": "stop",
    "MAX_TOKENS": "length",
}


def _parse_wire_tool_calls(
    raw: Sequence[Mapping[str, Any]],
) -> tuple[list[LCToolCall], list[InvalidToolCall]]:
    valid: list[LCToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in raw:
        function = call.get("function") or {}
        name = function.get("name")
        text = function.get("arguments") or ""
        try:
            args = json.loads(text, strict=False) if text.strip() else {}
        except json.JSONDecodeError as exc:
            invalid.append(
                invalid_tool_call(name=name, args=text, id=call.get("id"), error=str(exc))
            )
            continue
        if isinstance(args, dict):
            valid.append(tool_call(name=name or "", args=args, id=call.get("id")))
        else:
            invalid.append(
                invalid_tool_call(
                    name=name, args=text, id=call.get("id"), error="arguments are not an object"
                )
            )
    return valid, invalid


def openai_to_messages(messages: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """Turn OpenAI chat-completions message dicts back into LangChain messages.

    The inverse of the conversion `BatchedChatModel` does before it submits:
    roles map to `SystemMessage` (`system`, `developer`), `HumanMessage`,
    `AIMessage` (with `tool_calls`, or `invalid_tool_calls` for arguments
    that are not a JSON object), `ToolMessage`, `FunctionMessage`, else
    `ChatMessage`. Content lists (text, `image_url` blocks) pass as they are.

    Args:
        messages: OpenAI-format message dicts (`ChatRequest.messages`).

    Returns:
        The conversation as LangChain messages.

    Raises:
        BackendBadRequestError: If a message has no `role`.

    Example:
        ```python
        openai_to_messages([{"role": "user", "content": "hi"}])  # [HumanMessage("hi")]
        ```
    """
    out: list[BaseMessage] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if content is None:
            content = ""
        extra: dict[str, Any] = {}
        if message.get("name") is not None:
            extra["name"] = message["name"]
        if role in ("system", "developer"):
            kwargs = {"__openai_role__": "developer"} if role == "developer" else {}
            out.append(SystemMessage(content=content, additional_kwargs=kwargs, **extra))
        elif role == "user":
            out.append(HumanMessage(content=content, **extra))
        elif role == "assistant":
            valid, invalid = _parse_wire_tool_calls(message.get("tool_calls") or ())
            out.append(
                AIMessage(content=content, tool_calls=valid, invalid_tool_calls=invalid, **extra)
            )
        elif role == "tool":
            out.append(
                ToolMessage(content=content, tool_call_id=str(message.get("tool_call_id")), **extra)
            )
        elif role == "function":
            out.append(FunctionMessage(content=content, name=str(message.get("name") or "")))
        elif isinstance(role, str) and role:
            out.append(ChatMessage(content=content, role=role, **extra))
        else:
            raise BackendBadRequestError(f"message without a role: {sorted(message)}")
    return out


def tool_choice_for_bind(choice: Any) -> Any:
    """OpenAI `tool_choice` -> the spelling LangChain's `bind_tools` methods accept."""
    if choice is None or choice in ("auto", "none"):
        return choice
    if choice == "required" or choice is True:
        return "any"  # ChatOpenAI maps it back to "required"; Anthropic knows "any"
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        if name:
            return name
    return choice


# ------------------------------------------------------------------ LangChain -> ChatResponse


def finish_reason(meta: Mapping[str, Any]) -> str | None:
    raw = meta.get("finish_reason") or meta.get("stop_reason") or meta.get("done_reason")
    if not isinstance(raw, str) or not raw:
        return None
    return _FINISH_REASONS.get(raw, raw)


def usage_of(message: BaseMessage) -> Usage | None:
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return None
    details: Mapping[str, Any] = usage.get("input_token_details") or {}
    cached = details.get("cache_read")
    # langchain-anthropic zeroes `cache_creation` when it reports the TTL split.
    long_ttl = details.get("ephemeral_1h_input_tokens")
    split = [details.get(k) for k in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")]
    created = details.get("cache_creation")
    if any(v is not None for v in split):
        created = max(int(created or 0), sum(int(v or 0) for v in split))
    return Usage(
        prompt_tokens=int(usage.get("input_tokens") or 0),
        completion_tokens=int(usage.get("output_tokens") or 0),
        cached_tokens=int(cached) if cached is not None else None,
        cache_creation_tokens=int(created) if created is not None else None,
        cache_creation_1h_tokens=int(long_ttl) if long_ttl is not None else None,
    )


def message_tool_calls(message: BaseMessage) -> list[ToolCall]:
    if not isinstance(message, AIMessage):
        return []
    calls = [
        ToolCall(
            id=c.get("id") or new_call_id(),
            name=c["name"],
            arguments=json.dumps(c["args"], ensure_ascii=False),
        )
        for c in message.tool_calls
    ]
    calls.extend(
        ToolCall(
            id=c.get("id") or new_call_id(), name=c.get("name") or "", arguments=c["args"] or ""
        )
        for c in message.invalid_tool_calls
    )
    return calls


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class StreamedCalls:
    """Tool-call fragments of a stream, renumbered 0..k in order of appearance.

    Providers number fragments their own way (OpenAI: per call; Anthropic: per
    content block, so the first call may be index 1; some: none at all). The
    chunks handed on use one index per call and carry its id on the first
    fragment (made up when the provider sent none), so the aggregated message
    and the `ChatResponse` agree.
    """

    def __init__(self) -> None:
        self.calls: list[list[str]] = []  # [id, name, arguments]
        self._by_key: dict[tuple[str, Any], int] = {}

    def add(self, fragment: Mapping[str, Any]) -> ToolCallChunk:
        provider_index = fragment.get("index")
        call_id = fragment.get("id")
        name = fragment.get("name")
        key: tuple[str, Any] | None = None
        if provider_index is not None:
            key = ("index", provider_index)
        elif call_id:
            key = ("id", call_id)
        index = self._by_key.get(key) if key is not None else None
        first = False
        if index is None:
            if key is None and not name and self.calls:
                index = len(self.calls) - 1  # an unnumbered continuation
            else:
                index = len(self.calls)
                self.calls.append([call_id or new_call_id(), "", ""])
                first = True
                if key is not None:
                    self._by_key[key] = index
        entry = self.calls[index]
        # Names and ids are sent once per call: LangChain concatenates repeated
        # ones when it merges chunks.
        new_name = bool(name) and not entry[1]
        if new_name:
            entry[1] = str(name)
        args = fragment.get("args") or ""
        entry[2] += args
        return ToolCallChunk(
            index=index,
            id=entry[0] if first else None,
            name=entry[1] if new_name else None,
            arguments=args or None,
        )

    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(id=i, name=n, arguments=a) for i, n, a in self.calls]
