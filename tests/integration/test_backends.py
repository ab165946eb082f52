"""The HTTP backends against the built-in emulator (a real server on loopback).

Faults are injected per request with the body field `"emulator": {"fault": ...}`.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from langgraph_batch.backends import (
    ChatChunk,
    ChatRequest,
    OpenAICompatibleBackend,
    VLLMBackend,
    backend_from_url,
)
from langgraph_batch.errors import (
    BackendConnectionError,
    BackendRateLimitError,
    BackendServerError,
    BackendStreamError,
    ContextLengthExceededError,
    ModelNotFoundError,
)

MODEL = "emulated-llama-3-8b"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }
]


@pytest.fixture
async def vllm(emulator_url: str) -> AsyncIterator[VLLMBackend]:
    backend = backend_from_url(emulator_url.replace("http://", "vllm://"), timeout=30.0)
    assert isinstance(backend, VLLMBackend)
    async with backend:
        yield backend


def ask(text: str = "hello", *, emulator: dict[str, Any] | None = None, **kw: Any) -> ChatRequest:
    params: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0}
    params.update(kw.pop("params", {}))
    if emulator is not None:
        params["emulator"] = emulator
    return ChatRequest(
        model=MODEL, messages=[{"role": "user", "content": text}], params=params, **kw
    )


async def test_non_streaming_answer(vllm: VLLMBackend) -> None:
    resp = await vllm.chat(ask(request_id="lgb-it-1"))
    assert resp.content
    assert resp.finish_reason in ("stop", "length")
    assert resp.request_id == "lgb-it-1"
    assert resp.usage is not None
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.completion_tokens > 0


async def test_streaming_tool_call_deltas_and_usage(vllm: VLLMBackend) -> None:
    seen: list[ChatChunk] = []
    request = ask(
        "find it: key=alpha-42",
        stream=True,
        params={"tools": TOOLS, "max_tokens": 256},
        emulator={"turns": 2},
    )
    resp = await vllm.chat(request, on_chunk=seen.append)
    assert len(seen) > 2
    assert any(c.tool_call_chunks for c in seen)
    assert len(resp.tool_calls) == 1
    call = resp.tool_calls[0]
    assert call.name == "lookup"
    assert "alpha-42" in call.arguments
    assert resp.finish_reason == "tool_calls"
    assert resp.usage is not None
    assert resp.usage.completion_tokens > 0
    assert seen[-1].usage == resp.usage


async def test_streaming_text(vllm: VLLMBackend) -> None:
    seen: list[ChatChunk] = []
    resp = await vllm.chat(ask(stream=True), on_chunk=seen.append)
    assert resp.content == "".join(c.content for c in seen)
    assert resp.content


async def test_rate_limit_fault(vllm: VLLMBackend) -> None:
    with pytest.raises(BackendRateLimitError) as info:
        await vllm.chat(ask(emulator={"fault": "429"}))
    assert info.value.status_code == 429
    assert info.value.retry_after_s is not None


@pytest.mark.parametrize("fault", ["500", "503"])
async def test_server_error_faults(vllm: VLLMBackend, fault: str) -> None:
    with pytest.raises(BackendServerError) as info:
        await vllm.chat(ask(emulator={"fault": fault}))
    assert info.value.status_code == int(fault)
    assert info.value.is_retryable


async def test_connection_dropped_mid_stream(vllm: VLLMBackend) -> None:
    seen: list[ChatChunk] = []
    with pytest.raises(BackendStreamError) as info:
        await vllm.chat(ask(stream=True, emulator={"fault": "drop"}), on_chunk=seen.append)
    assert info.value.chunks_received == len(seen)
    assert info.value.chunks_received > 0


async def test_dropped_non_streaming_response(vllm: VLLMBackend) -> None:
    with pytest.raises(BackendConnectionError):
        await vllm.chat(ask(emulator={"fault": "drop"}))


async def test_truncated_stream(vllm: VLLMBackend) -> None:
    with pytest.raises(BackendStreamError, match="without a finish_reason") as info:
        await vllm.chat(ask(stream=True, emulator={"fault": "truncate"}))
    assert info.value.chunks_received > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_tool_arguments_are_kept(vllm: VLLMBackend, stream: bool) -> None:
    request = ask(
        "key=beta",
        stream=stream,
        params={"tools": TOOLS, "max_tokens": 256},
        emulator={"turns": 2, "fault": "bad_tool_args"},
    )
    resp = await vllm.chat(request)
    assert len(resp.tool_calls) == 1
    import json

    with pytest.raises(ValueError):  # noqa: PT011 - json's own error
        json.loads(resp.tool_calls[0].arguments)


async def test_context_length_exceeded(vllm: VLLMBackend) -> None:
    [info_model] = await vllm.models()
    assert info_model.max_model_len is not None
    huge = "word " * (info_model.max_model_len + 100)
    with pytest.raises(ContextLengthExceededError) as info:
        await vllm.chat(ask(huge))
    assert info.value.max_model_len == info_model.max_model_len
    assert info.value.prompt_tokens is not None
    assert info.value.prompt_tokens > info_model.max_model_len


async def test_unknown_model(vllm: VLLMBackend) -> None:
    request = ChatRequest(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(ModelNotFoundError) as info:
        await vllm.chat(request)
    assert info.value.model == "no-such-model"
    assert MODEL in info.value.available


async def test_models_health_and_metrics(vllm: VLLMBackend) -> None:
    models = await vllm.models()
    assert [m.id for m in models] == [MODEL]
    assert await vllm.health() is True
    await vllm.chat(ask())
    metrics = await vllm.metrics()
    assert metrics is not None
    assert metrics.kv_capacity_tokens is not None
    assert metrics.kv_capacity_tokens > 0
    assert metrics.block_size == 16
    assert metrics.prompt_tokens_total is not None
    assert metrics.prompt_tokens_total > 0
    assert metrics.num_requests_running is not None


async def test_complete_batch(vllm: VLLMBackend) -> None:
    requests = [ask(f"question {i}", batchable=True) for i in range(4)]
    out = await vllm.complete_batch(requests)
    assert len(out) == 4
    assert all(r.content for r in out)


async def test_openai_compatible_with_v1_suffix(emulator_url: str) -> None:
    async with OpenAICompatibleBackend(emulator_url + "/v1") as backend:
        resp = await backend.chat(ask())
    assert resp.content


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_wrong_port_is_a_connection_error() -> None:
    port = _free_port()
    async with backend_from_url(f"http://127.0.0.1:{port}", timeout=5.0) as backend:
        with pytest.raises(BackendConnectionError, match="is the server running"):
            await backend.chat(ask())
        assert await backend.health() is False
