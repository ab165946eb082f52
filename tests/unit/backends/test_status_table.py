"""One status table: every HTTP status is the same error, equally retryable, on every path.

Each status is sent by one fake server (an `httpx.MockTransport`) to every way a
backend can meet it: `OpenAICompatibleBackend` (a plain call, a stream that gets
the status before its first event, an error event inside a stream, as vLLM sends
after a 200) and `LangChainBackend(ChatOpenAI)` (invoke and stream, the openai
SDK in between). Every path must agree with `_errormap.status_error`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from langchain_openai import ChatOpenAI

from langgraph_batch.backends import (
    Backend,
    ChatRequest,
    LangChainBackend,
    OpenAICompatibleBackend,
)
from langgraph_batch.backends._errormap import STATUS_ERRORS, status_error
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendBadRequestError,
    BackendError,
    BackendRateLimitError,
    BackendServerError,
    BackendTimeoutError,
    ContextLengthExceededError,
    ModelNotFoundError,
)
from tests.fakes.http import chunk, sse

STATUSES = (400, 401, 403, 404, 405, 408, 409, 413, 422, 429, 500, 501, 502, 503, 504, 529)

# Written out: a change to the table must be deliberate (and documented in _errormap).
EXPECTED: dict[int, type[BackendError]] = {
    400: BackendBadRequestError,
    401: BackendAuthenticationError,
    403: BackendAuthenticationError,
    404: ModelNotFoundError,
    405: ModelNotFoundError,
    408: BackendTimeoutError,
    409: BackendBadRequestError,
    413: BackendBadRequestError,
    422: BackendBadRequestError,
    429: BackendRateLimitError,
    500: BackendServerError,
    501: BackendServerError,
    502: BackendServerError,
    503: BackendServerError,
    504: BackendServerError,
    529: BackendServerError,
}
RETRYABLE = {408, 429, 500, 501, 502, 503, 504, 529}
CONTEXT_MESSAGE = (
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
    "(4990 in the messages, 10 in the completion). Please reduce the length of the messages."
)

Path = Callable[[int, str], Awaitable[BaseException]]


def _error_body(status: int, message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": "Error", "param": None, "code": status}}


def _server(status: int, message: str, *, in_stream: bool = False) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        if request.method == "GET":
            return httpx.Response(404, json={"detail": "Not Found"})
        if in_stream:
            body = sse(chunk(content=""), _error_body(status, message), done=False)
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        headers = {"retry-after": "0"} if status == 429 else {}
        return httpx.Response(status, json=_error_body(status, message), headers=headers)

    return httpx.MockTransport(handle)


def _request(*, stream: bool) -> ChatRequest:
    return ChatRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=stream, request_id="r1"
    )


def _chat(backend: Backend, *, stream: bool) -> Awaitable[object]:
    request = _request(stream=stream)
    # A stream is consumed as the scheduler consumes it: chunk by chunk.
    return backend.chat(request, on_chunk=(lambda chunk: None) if stream else None)


async def _caught(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except BackendError as exc:
        return exc
    raise AssertionError("no error")


def _http(*, stream: bool, in_stream: bool = False) -> Path:
    async def path(status: int, message: str) -> BaseException:
        transport = _server(status, message, in_stream=in_stream)
        async with OpenAICompatibleBackend("http://srv:8000/v1", transport=transport) as b:
            return await _caught(_chat(b, stream=stream))

    return path


def _chat_openai(*, stream: bool) -> Path:
    async def path(status: int, message: str) -> BaseException:
        http = httpx.AsyncClient(transport=_server(status, message))

        def build() -> LangChainBackend:
            model = ChatOpenAI(
                model="m",
                base_url="http://srv:8000/v1",
                api_key="x",  # type: ignore[arg-type]
                max_retries=0,
                http_async_client=http,
            )
            return LangChainBackend(model, isolate_loop=False)

        # Built off the loop: the SDK reads package metadata on first use.
        backend = await asyncio.to_thread(build)
        try:
            return await _caught(_chat(backend, stream=stream))
        finally:
            await backend.aclose()
            await http.aclose()

    return path


PATHS: dict[str, Path] = {
    "http": _http(stream=False),
    "http stream": _http(stream=True),
    "http error event in a stream": _http(stream=True, in_stream=True),
    "LangChainBackend(ChatOpenAI)": _chat_openai(stream=False),
    "LangChainBackend(ChatOpenAI) stream": _chat_openai(stream=True),
}


def test_the_table_is_the_one_written_out_here() -> None:
    for status in STATUSES:
        assert status_error(status) is EXPECTED[status], status
        assert EXPECTED[status].is_retryable == (status in RETRYABLE), status
    assert set(STATUS_ERRORS) <= set(STATUSES)
    assert status_error(399) is None
    assert status_error(400, CONTEXT_MESSAGE) is ContextLengthExceededError


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("status", STATUSES)
async def test_every_path_maps_a_status_the_same_way(path: str, status: int) -> None:
    exc = await PATHS[path](status, f"the server says no ({status})")
    assert type(exc) is EXPECTED[status], (path, status, exc)
    assert getattr(exc, "is_retryable", False) == (status in RETRYABLE), (path, status)
    assert exc.status_code == status  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", PATHS)
async def test_every_path_finds_a_context_overflow_in_a_400(path: str) -> None:
    exc = await PATHS[path](400, CONTEXT_MESSAGE)
    assert type(exc) is ContextLengthExceededError, (path, exc)
    assert exc.max_model_len == 4096  # type: ignore[attr-defined]
    assert not exc.is_retryable  # type: ignore[attr-defined]
