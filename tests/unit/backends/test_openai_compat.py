"""OpenAICompatibleBackend against httpx.MockTransport: wire format, streaming, error mapping."""

from __future__ import annotations

import json

import httpx
import pytest

from langgraph_batch.backends import ChatChunk, ChatRequest, OpenAICompatibleBackend
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendConnectionError,
    BackendError,
    BackendRateLimitError,
    BackendServerError,
    BackendStreamError,
    BackendTimeoutError,
    ContextLengthExceededError,
    ModelNotFoundError,
)
from tests.fakes.http import (
    BrokenStream,
    Recorder,
    chunk,
    completion,
    error_body,
    sse,
    sse_response,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def make(recorder: Recorder, **kw: object) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend("http://srv:8000/v1", transport=recorder.transport, **kw)  # type: ignore[arg-type]


def req(**kw: object) -> ChatRequest:
    kw.setdefault("model", "m")
    kw.setdefault("messages", MESSAGES)
    return ChatRequest(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1", "http://h:8000"),
        ("http://h:8000/v1/", "http://h:8000"),
        ("https://h/proxy/v1", "https://h/proxy"),
    ],
)
def test_base_url_normalised(given: str, root: str) -> None:
    b = OpenAICompatibleBackend(given)
    assert b.base_url == root
    assert str(b._chat_url) == root + "/v1/chat/completions"
    assert b.key == f"OpenAICompatibleBackend:{root}"


@pytest.mark.parametrize("bad", ["h:8000", "ftp://h", "http://"])
def test_bad_base_url(bad: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAICompatibleBackend(bad)


async def test_non_streaming_wire_and_response(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(
        200,
        json=completion(
            "hello",
            usage={
                "prompt_tokens": 10,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        ),
    )
    async with make(recorder, api_key="sk-1") as b:
        resp = await b.chat(req(params={"max_tokens": 5, "temperature": 0.0}, request_id="r1"))
    sent = recorder.requests[0]
    assert sent.method == "POST"
    assert str(sent.url) == "http://srv:8000/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-1"
    assert sent.headers["content-type"] == "application/json"
    body = recorder.last_body
    assert body == {"model": "m", "messages": MESSAGES, "max_tokens": 5, "temperature": 0.0}
    # the generic backend sends no vLLM extras
    assert "x-request-id" not in sent.headers
    assert (resp.content, resp.finish_reason, resp.id, resp.request_id) == (
        "hello",
        "stop",
        "chatcmpl-abc",
        "r1",
    )
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.cached_tokens) == (
        10,
        2,
        8,
    )


async def test_no_api_key_no_auth_header(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder) as b:
        await b.chat(req())
    assert "authorization" not in recorder.requests[0].headers


async def test_tool_calls_and_malformed_arguments(recorder: Recorder) -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"k": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "bad", "arguments": "{oops"}},
    ]
    recorder.handler = lambda r: httpx.Response(
        200, json=completion(None, tool_calls=calls, finish_reason="tool_calls")
    )
    async with make(recorder) as b:
        resp = await b.chat(req(params={"tools": [{"type": "function"}]}))
    assert resp.content is None
    assert [(t.id, t.name, t.arguments) for t in resp.tool_calls] == [
        ("c1", "get", '{"k": 1}'),
        ("c2", "bad", "{oops"),
    ]


async def test_raw_prompt_goes_to_completions(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(
        200,
        json={
            "id": "cmpl-1",
            "model": "m",
            "choices": [{"index": 0, "text": " world", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        },
    )
    async with make(recorder) as b:
        resp = await b.chat(req(messages=(), params={"prompt": "hello", "max_tokens": 1}))
    assert str(recorder.requests[0].url) == "http://srv:8000/v1/completions"
    assert recorder.last_body == {"model": "m", "prompt": "hello", "max_tokens": 1}
    assert (resp.content, resp.finish_reason) == (" world", "length")


async def test_streaming_text_chunks_and_usage(recorder: Recorder) -> None:
    body = sse(
        chunk(content=""),
        chunk(content="Hel"),
        chunk(content="lo"),
        chunk(finish_reason="stop"),
        chunk(
            usage={
                "prompt_tokens": 7,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
        ),
    )
    recorder.handler = lambda r: sse_response(body)
    seen: list[ChatChunk] = []
    async with make(recorder) as b:
        resp = await b.chat(
            req(stream=True, params={"stream_options": {"continuous_usage_stats": True}}),
            on_chunk=seen.append,
        )
    sent = recorder.last_body
    assert sent["stream"] is True
    assert sent["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert [c.content for c in seen] == ["", "Hel", "lo", "", ""]
    assert seen[3].finish_reason == "stop"
    assert seen[4].usage is not None
    assert seen[4].usage.prompt_tokens == 7
    assert resp.content == "Hello"
    assert resp.finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.cached_tokens == 0


async def test_streaming_tool_call_deltas(recorder: Recorder) -> None:
    body = sse(
        chunk(
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": ""},
                }
            ]
        ),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"key": '}}]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": '"abc"}'}}]),
        chunk(finish_reason="tool_calls"),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": 9}),
    )
    recorder.handler = lambda r: sse_response(body)
    seen: list[ChatChunk] = []
    async with make(recorder) as b:
        resp = await b.chat(req(stream=True), on_chunk=seen.append)
    assert [c.tool_call_chunks[0].arguments for c in seen[:3]] == ["", '{"key": ', '"abc"}']
    assert [(t.id, t.name, t.arguments) for t in resp.tool_calls] == [
        ("call_1", "lookup", '{"key": "abc"}')
    ]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 9


async def test_stream_without_done_but_finished_is_accepted(recorder: Recorder) -> None:
    body = sse(chunk(content="ok"), chunk(finish_reason="stop"), done=False)
    recorder.handler = lambda r: sse_response(body)
    async with make(recorder) as b:
        resp = await b.chat(req(stream=True))
    assert (resp.content, resp.finish_reason) == ("ok", "stop")


async def test_truncated_stream(recorder: Recorder) -> None:
    body = sse(chunk(content="par"), chunk(content="tial"), done=False)
    recorder.handler = lambda r: sse_response(body)
    async with make(recorder) as b:
        with pytest.raises(BackendStreamError, match="without a finish_reason") as info:
            await b.chat(req(stream=True, request_id="r5"))
    assert info.value.chunks_received == 2
    assert info.value.request_id == "r5"
    assert info.value.is_retryable


async def test_truncated_mid_event(recorder: Recorder) -> None:
    body = sse(chunk(content="a"), done=False) + b'data: {"choices": [{"de'
    recorder.handler = lambda r: sse_response(body)
    async with make(recorder) as b:
        with pytest.raises(BackendStreamError, match="invalid JSON") as info:
            await b.chat(req(stream=True))
    assert info.value.chunks_received == 1


async def test_invalid_json_line(recorder: Recorder) -> None:
    body = sse(chunk(content="a"), b"{not json}", chunk(finish_reason="stop"))
    recorder.handler = lambda r: sse_response(body)
    async with make(recorder) as b:
        with pytest.raises(BackendStreamError, match="invalid JSON") as info:
            await b.chat(req(stream=True))
    assert info.value.chunks_received == 1


async def test_connection_dropped_mid_stream(recorder: Recorder) -> None:
    stream = BrokenStream(sse(chunk(content="a"), chunk(content="b"), done=False))
    recorder.handler = lambda r: httpx.Response(
        200, stream=stream, headers={"content-type": "text/event-stream"}
    )
    seen: list[ChatChunk] = []
    async with make(recorder) as b:
        with pytest.raises(BackendStreamError, match="dropped after the response started") as info:
            await b.chat(req(stream=True), on_chunk=seen.append)
    assert info.value.chunks_received == 2
    assert len(seen) == 2
    assert isinstance(info.value.__cause__, httpx.ReadError)
    assert stream.closed


async def test_read_timeout_mid_stream(recorder: Recorder) -> None:
    stream = BrokenStream(sse(chunk(content="a"), done=False), error=httpx.ReadTimeout("t"))
    recorder.handler = lambda r: httpx.Response(200, stream=stream)
    async with make(recorder, timeout=3.0) as b:
        with pytest.raises(BackendTimeoutError, match="after 1 chunks"):
            await b.chat(req(stream=True))


async def test_error_event_in_stream(recorder: Recorder) -> None:
    body = sse(chunk(content="a"), error_body("engine died", code=500, type_="InternalServerError"))
    recorder.handler = lambda r: sse_response(body)
    async with make(recorder) as b:
        with pytest.raises(BackendServerError, match="engine died"):
            await b.chat(req(stream=True))


async def test_stream_http_error_is_mapped(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(
        429, json=error_body("busy", code=429), headers={"Retry-After": "2"}
    )
    async with make(recorder) as b:
        with pytest.raises(BackendRateLimitError) as info:
            await b.chat(req(stream=True))
    assert info.value.retry_after_s == 2.0


@pytest.mark.parametrize(
    ("exc", "expected", "match"),
    [
        (
            httpx.ConnectError("[Errno 111] Connection refused"),
            BackendConnectionError,
            "could not connect to http://srv:8000/v1/chat/completions",
        ),
        (httpx.ReadError("[Errno 104] Connection reset by peer"), BackendConnectionError, "reset"),
        (httpx.RemoteProtocolError("Server disconnected"), BackendConnectionError, "disconnected"),
        (httpx.ReadTimeout("timed out"), BackendTimeoutError, "read timeout"),
        (httpx.ConnectTimeout("timed out"), BackendTimeoutError, "connecting"),
        (httpx.PoolTimeout("timed out"), BackendTimeoutError, "timeout"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_transport_errors(
    recorder: Recorder, exc: Exception, expected: type[BackendError], match: str, stream: bool
) -> None:
    def raise_(request: httpx.Request) -> httpx.Response:
        raise exc

    recorder.handler = raise_
    async with make(recorder) as b:
        with pytest.raises(expected, match=match) as info:
            await b.chat(req(stream=stream, request_id="r7"))
    assert info.value.__cause__ is exc
    assert info.value.request_id == "r7"
    assert info.value.is_retryable


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors(recorder: Recorder, status: int) -> None:
    recorder.handler = lambda r: httpx.Response(status, text="overloaded")
    async with make(recorder) as b:
        with pytest.raises(BackendServerError, match="overloaded") as info:
            await b.chat(req())
    assert info.value.status_code == status


async def test_rate_limit_with_http_date(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(
        429,
        json=error_body("slow", code=429),
        headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"},
    )
    async with make(recorder) as b:
        with pytest.raises(BackendRateLimitError) as info:
            await b.chat(req())
    assert info.value.retry_after_s == 0.0  # a date in the past: retry now


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors(recorder: Recorder, status: int) -> None:
    recorder.handler = lambda r: httpx.Response(
        status, json=error_body("Unauthorized", code=status)
    )
    async with make(recorder) as b:
        with pytest.raises(BackendAuthenticationError):
            await b.chat(req())


async def test_context_length(recorder: Recorder) -> None:
    message = (
        "This model's maximum context length is 32768 tokens. However, your prompt contains "
        "40000 input tokens, which exceeds this limit even without any output tokens."
    )
    recorder.handler = lambda r: httpx.Response(400, json=error_body(message))
    async with make(recorder) as b:
        with pytest.raises(ContextLengthExceededError) as info:
            await b.chat(req())
    assert (info.value.prompt_tokens, info.value.max_model_len) == (40000, 32768)
    assert info.value.status_code == 400


async def test_unknown_model_lists_available(recorder: Recorder) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "llama"}]})
        return httpx.Response(
            404,
            json=error_body("The model `gpt-9` does not exist.", code=404, type_="NotFoundError"),
        )

    recorder.handler = handler
    async with make(recorder) as b:
        with pytest.raises(ModelNotFoundError, match=r"'gpt-9'.*llama") as info:
            await b.chat(req(model="gpt-9"))
    assert info.value.model == "gpt-9"
    assert info.value.available == ("llama",)


async def test_non_json_200(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, text="<html>proxy login</html>")
    async with make(recorder) as b:
        with pytest.raises(BackendServerError, match="not JSON"):
            await b.chat(req())


async def test_request_timeout_overrides_default(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder, timeout=60.0) as b:
        await b.chat(req(timeout=2.5))
        await b.chat(req())
    assert recorder.requests[0].extensions["timeout"]["read"] == 2.5
    assert recorder.requests[1].extensions["timeout"]["read"] == 60.0
    assert recorder.requests[1].extensions["timeout"]["pool"] == 30.0


async def test_models_and_health(recorder: Recorder) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(
                200,
                json={
                    "object": "list",
                    "data": [
                        {
                            "id": "llama",
                            "object": "model",
                            "owned_by": "vllm",
                            "max_model_len": 32768,
                        },
                        {"id": "lora-a", "object": "model"},
                    ],
                },
            )
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(404)

    recorder.handler = handler
    async with make(recorder) as b:
        models = await b.models()
        assert await b.health() is True
        assert await b.metrics() is None
    assert [(m.id, m.max_model_len) for m in models] == [("llama", 32768), ("lora-a", None)]


async def test_health_false_when_down_or_dead(recorder: Recorder) -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    recorder.handler = refused
    async with make(recorder) as b:
        assert await b.health() is False
        recorder.handler = lambda r: httpx.Response(503)
        assert await b.health() is False


async def test_closed_backend_refuses(recorder: Recorder) -> None:
    b = make(recorder)
    await b.aclose()
    await b.aclose()  # idempotent
    with pytest.raises(BackendError, match="closed"):
        await b.chat(req())


async def test_mapping_messages_are_serialised(recorder: Recorder) -> None:
    from types import MappingProxyType

    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder) as b:
        await b.chat(req(messages=(MappingProxyType({"role": "user", "content": "é"}),)))
    assert recorder.last_body["messages"] == [{"role": "user", "content": "é"}]
    assert "é".encode() in recorder.requests[0].content
    assert json.loads(recorder.requests[0].content)["model"] == "m"


class _Stalling(httpx.AsyncByteStream):
    """One event, then only keep-alive comments (forever, or until `events` more)."""

    def __init__(self, keepalives: int | None = None) -> None:
        self.keepalives = keepalives

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        import anyio

        yield sse(chunk(content="a"), done=False)
        n = 0
        while self.keepalives is None or n < self.keepalives:
            await anyio.sleep(0.02)
            yield b": keep-alive\n\n"
            n += 1
        yield sse(chunk(content="b", finish_reason="stop"))


async def test_stream_chunk_timeout_ignores_keepalives(recorder: Recorder) -> None:
    from langgraph_batch.errors import StreamChunkTimeoutError

    recorder.handler = lambda r: httpx.Response(
        200, stream=_Stalling(), headers={"content-type": "text/event-stream"}
    )
    got: list[ChatChunk] = []
    async with make(recorder) as b:
        with pytest.raises(StreamChunkTimeoutError, match="no stream chunk") as info:
            await b.chat(req(stream=True, stream_chunk_timeout=0.15), on_chunk=got.append)
        assert (info.value.timeout_s, info.value.chunks_received) == (0.15, 1)
        assert info.value.is_retryable
        assert [c.content for c in got] == ["a"]
        assert b.transport.state().requests_active == 0
        # Keep-alives for less than the gap between events: no timeout.
        recorder.handler = lambda r: httpx.Response(
            200, stream=_Stalling(keepalives=3), headers={"content-type": "text/event-stream"}
        )
        resp = await b.chat(req(stream=True, stream_chunk_timeout=0.5))
        assert resp.content == "ab"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout": 0}, "timeout must be > 0"),
        ({"timeout": -3.0}, "-3.0"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"pool_timeout": -1}, "pool_timeout"),
        ({"limits": {"max_connections": 5}}, "httpx.Limits"),
        ({"limits": httpx.Limits(max_connections=0)}, "max_connections"),
        ({"headers": {"X-Key": 5}}, "headers"),
        ({"query": "a=b"}, "query"),
        ({"api_key": 123}, "api_key"),
    ],
)
def test_bad_options_fail_at_construction(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OpenAICompatibleBackend("http://h:8000", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["http://h:99999", "http://h:0", "http://h:x1"])
def test_bad_ports_fail_at_construction(url: str) -> None:
    with pytest.raises(ValueError, match=r"port|not a valid URL"):
        OpenAICompatibleBackend(url)


async def test_a_body_left_open_after_done_does_not_hold_the_answer(recorder: Recorder) -> None:
    import time

    class OpenAfterDone(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            import anyio

            yield sse(chunk(content="hi", finish_reason="stop"))  # ends with [DONE]
            await anyio.sleep(30)  # a server or proxy that never ends the body

    recorder.handler = lambda r: httpx.Response(
        200, stream=OpenAfterDone(), headers={"content-type": "text/event-stream"}
    )
    async with make(recorder) as b:
        t0 = time.monotonic()
        resp = await b.chat(req(stream=True))
        assert resp.content == "hi"
        assert time.monotonic() - t0 < 2.0  # the drain after [DONE] is bounded
        assert b.transport.state().requests_active == 0
