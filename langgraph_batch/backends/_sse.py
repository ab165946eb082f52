"""Server-sent events for OpenAI-style streaming.

A byte-level SSE decoder, and the accumulator that turns
`chat.completion.chunk` objects into one response. Both are plain
synchronous objects, so they can be tested without HTTP and the per-chunk
work stays small: `json.loads` on bytes, no models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langgraph_batch.backends.base import ChatChunk, ChatResponse, ToolCall, ToolCallChunk, Usage

__all__ = (
    "ChatStreamAccumulator",
    "SSEDecoder",
    "parse_logprobs",
    "parse_usage",
    "tool_calls_from_wire",
)


class SSEDecoder:
    """Incremental SSE decoder: feed it bytes, get complete `data` payloads.

    Only `data:` fields matter for OpenAI streams; comments (`:` lines, used
    as keep-alives), `event:`, `id:` and `retry:` fields are ignored. A
    multi-line `data` event is joined with newlines, per the SSE spec.
    """

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add bytes; return the payloads of the events they complete."""
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\n" not in buffer and b"\r" not in buffer:
            self._buffer = buffer
            return []
        lines = buffer.splitlines(keepends=True)
        if lines[-1].endswith(b"\n"):
            self._buffer = b""
        else:
            # An unterminated line, or one ending in a lone \r that may be the first
            # half of \r\n: finish it with the next bytes.
            self._buffer = lines.pop()
        events: list[bytes] = []
        data = self._data
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # Everything else (comments, event/id/retry fields) is ignored.
        return events

    def flush(self) -> list[bytes]:
        """The payload of an event left unterminated at the end of the stream."""
        events = []
        if self._buffer:
            line = self._buffer.rstrip(b"\r\n")
            self._buffer = b""
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        if self._data:
            events.append(b"\n".join(self._data))
            self._data.clear()
        return events


def parse_logprobs(raw: Any) -> tuple[Mapping[str, Any], ...] | None:
    """A choice's `logprobs.content` (OpenAI's chat shape); None when absent or not that shape."""
    if not isinstance(raw, dict):
        return None
    content = raw.get("content")
    if not isinstance(content, list):
        return None
    return tuple(entry for entry in content if isinstance(entry, dict))


def parse_usage(raw: Any) -> Usage | None:
    """An OpenAI `usage` object as `Usage` (cached tokens from `prompt_tokens_details`)."""
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=raw.get("prompt_tokens") or 0,
        completion_tokens=raw.get("completion_tokens") or 0,
        cached_tokens=cached,
    )


def _arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    # Some servers send an object instead of JSON text; keep the contract (raw JSON text).
    return json.dumps(arguments)


def tool_calls_from_wire(raw: Any) -> tuple[ToolCall, ...]:
    """`message.tool_calls` as `ToolCall`s. Arguments stay raw text, even when not JSON."""
    if not raw:
        return ()
    calls = []
    for i, item in enumerate(raw):
        fn = item.get("function") or {}
        calls.append(
            ToolCall(
                id=item.get("id") or f"call_{i}",
                name=fn.get("name") or "",
                arguments=_arguments_text(fn.get("arguments")),
            )
        )
    return tuple(calls)


class ChatStreamAccumulator:
    """Folds `chat.completion.chunk` objects into `ChatChunk`s and a final `ChatResponse`.

    Tool-call deltas are aggregated by their `index`: the first fragment
    brings the id and name, later ones append argument text.
    """

    __slots__ = (
        "_content",
        "_logprobs",
        "_tools",
        "chunks",
        "finish_reason",
        "id",
        "model",
        "usage",
    )

    def __init__(self) -> None:
        self._content: list[str] = []
        self._tools: dict[int, list[Any]] = {}
        self._logprobs: list[Mapping[str, Any]] | None = None
        self.chunks = 0
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.id: str | None = None
        self.model: str | None = None

    def add(self, obj: dict[str, Any]) -> ChatChunk:
        """Take one decoded chunk object; return it as a `ChatChunk`."""
        self.chunks += 1
        if self.id is None:
            self.id = obj.get("id")
            self.model = obj.get("model")
        content = ""
        tool_chunks: tuple[ToolCallChunk, ...] = ()
        finish = None
        logprobs = None
        choices = obj.get("choices")
        if choices:
            choice = choices[0]
            logprobs = parse_logprobs(choice.get("logprobs"))
            if logprobs:
                if self._logprobs is None:
                    self._logprobs = []
                self._logprobs.extend(logprobs)
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                if text:
                    content = text
                    self._content.append(text)
                raw_tools = delta.get("tool_calls")
                if raw_tools:
                    tool_chunks = self._add_tools(raw_tools)
            else:  # /v1/completions streams `text`
                text = choice.get("text")
                if text:
                    content = text
                    self._content.append(text)
            finish = choice.get("finish_reason")
            if finish:
                self.finish_reason = finish
        usage = None
        raw_usage = obj.get("usage")
        if raw_usage:
            usage = parse_usage(raw_usage)
            self.usage = usage
        return ChatChunk(
            content=content,
            tool_call_chunks=tool_chunks,
            finish_reason=finish,
            usage=usage,
            id=self.id,
            model=self.model,
            logprobs=logprobs,
        )

    def _add_tools(self, raw_tools: list[dict[str, Any]]) -> tuple[ToolCallChunk, ...]:
        out = []
        for position, item in enumerate(raw_tools):
            index = item.get("index", position)
            fn = item.get("function") or {}
            name = fn.get("name")
            args = fn.get("arguments")
            if args is not None and not isinstance(args, str):
                args = json.dumps(args)
            call_id = item.get("id")
            slot = self._tools.get(index)
            if slot is None:
                slot = self._tools[index] = [call_id, name, []]
            else:
                if call_id and not slot[0]:
                    slot[0] = call_id
                if name and not slot[1]:
                    slot[1] = name
            if args:
                slot[2].append(args)
            out.append(ToolCallChunk(index=index, id=call_id, name=name, arguments=args))
        return tuple(out)

    def response(self, *, request_id: str, fallback_model: str) -> ChatResponse:
        """The aggregated response."""
        tool_calls = tuple(
            ToolCall(id=slot[0] or f"call_{index}", name=slot[1] or "", arguments="".join(slot[2]))
            for index, slot in sorted(self._tools.items())
        )
        content = "".join(self._content)
        return ChatResponse(
            id=self.id or request_id,
            model=self.model or fallback_model,
            content=content if content or not tool_calls else None,
            tool_calls=tool_calls,
            finish_reason=self.finish_reason,
            usage=self.usage,
            request_id=request_id,
            logprobs=tuple(self._logprobs) if self._logprobs is not None else None,
        )
