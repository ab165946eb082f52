"""Helpers for backend tests: a recording MockTransport, response and SSE builders."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport whose handler can be swapped; remembers every request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.handler: Handler = lambda request: httpx.Response(500)
        self.workers: list[Any] | None = None
        """What `GET /workers` lists (a router in front of replicas); None: 404, not
        recorded (a server, not a router: the backends ask once before a batch)."""
        self.probes = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/workers":
            self.probes += 1
            if self.workers is None:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json={"workers": self.workers})
        self.requests.append(request)
        return self.handler(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    @property
    def last_body(self) -> Any:
        return json.loads(self.requests[-1].content)


def completion(
    content: str | None = "hello",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    finish_reason: str = "stop",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def sse(*events: Any, done: bool = True) -> bytes:
    """An SSE body: dicts are JSON-encoded, bytes are sent as they are."""
    parts = []
    for event in events:
        data = event if isinstance(event, bytes) else json.dumps(event).encode()
        parts.append(b"data: " + data + b"\n\n")
    if done:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def chunk(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    obj: dict[str, Any] = {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": []
        if usage is not None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        obj["usage"] = usage
    return obj


def sse_response(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def error_body(message: str, *, code: int = 400, type_: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


class BrokenStream(httpx.AsyncByteStream):
    """A response body that sends some bytes, then fails like a dropped connection."""

    def __init__(self, *parts: bytes, error: Exception | None = None) -> None:
        self.parts = parts
        self.error = error or httpx.ReadError("connection reset by peer")
        self.closed = False

    async def __aiter__(self) -> Any:
        for part in self.parts:
            yield part
        raise self.error

    async def aclose(self) -> None:
        self.closed = True
