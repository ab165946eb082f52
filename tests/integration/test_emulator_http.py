"""Fault paths and SGLang's /generate over real HTTP (emulator subprocesses)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable

import httpx
import pytest

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


def _chat(*, stream: bool = False, tools: bool = False, max_tokens: int = 16) -> dict[str, object]:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "find it key=k7"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if tools:
        body["tools"] = TOOLS
        body["tool_choice"] = "required"
    return body


def _fault(name: str, **extra: object) -> dict[str, str]:
    return {"X-Emulator-Options": json.dumps({"fault": name, **extra})}


async def test_429_carries_retry_after(emulator_url: str) -> None:
    async with httpx.AsyncClient(base_url=emulator_url) as client:
        r = await client.post(
            "/v1/chat/completions", json=_chat(), headers=_fault("429", retry_after_s=3)
        )
    assert r.status_code == 429
    assert r.headers["retry-after"] == "3"
    err = r.json()["error"]
    assert err["type"] == "RateLimitError"
    assert err["code"] == 429


@pytest.mark.parametrize(("fault", "err_type"), [("500", "InternalServerError"),
                                                 ("503", "ServiceUnavailableError")])  # fmt: skip
async def test_server_errors(emulator_url: str, fault: str, err_type: str) -> None:
    async with httpx.AsyncClient(base_url=emulator_url) as client:
        r = await client.post("/v1/chat/completions", json=_chat(), headers=_fault(fault))
    assert r.status_code == int(fault)
    assert r.json()["error"]["type"] == err_type


async def test_drop_cuts_the_stream_midway(emulator_url: str) -> None:
    lines: list[str] = []

    async def read(client: httpx.AsyncClient) -> None:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json=_chat(stream=True, max_tokens=16),
            headers=_fault("drop"),
        ) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                lines.append(line)

    async with httpx.AsyncClient(base_url=emulator_url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await read(client)
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert data, "some chunks arrive before the connection drops"
    assert "data: [DONE]" not in data


async def test_drop_cuts_a_json_response(emulator_url: str) -> None:
    async with httpx.AsyncClient(base_url=emulator_url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/chat/completions", json=_chat(), headers=_fault("drop"))


async def test_truncate_ends_the_stream_without_finish(emulator_url: str) -> None:
    async with httpx.AsyncClient(base_url=emulator_url) as client:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json=_chat(stream=True, max_tokens=16),
            headers=_fault("truncate"),
        ) as r:
            data = [ln[6:] async for ln in r.aiter_lines() if ln.startswith("data: ")]
        assert data
        assert "[DONE]" not in data
        chunks = [json.loads(d) for d in data]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
        r2 = await client.post("/v1/chat/completions", json=_chat(), headers=_fault("truncate"))
    assert r2.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(r2.content)


async def test_bad_tool_args_are_not_json(emulator_url: str) -> None:
    async with httpx.AsyncClient(base_url=emulator_url) as client:
        good = await client.post("/v1/chat/completions", json=_chat(tools=True, max_tokens=200))
        bad = await client.post(
            "/v1/chat/completions",
            json=_chat(tools=True, max_tokens=200),
            headers=_fault("bad_tool_args"),
        )
    good_args = good.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(good_args)["key"] == "k7"
    call = bad.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "lookup"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])


async def test_slow_first_token_delays_the_stream(emulator_url: str) -> None:
    # 10 engine seconds at the session emulator's time scale (50) = 0.2 s wall.
    async with httpx.AsyncClient(base_url=emulator_url) as client:
        started = time.monotonic()
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json=_chat(stream=True, max_tokens=4),
            headers=_fault("slow_first_token", slow_first_token_s=10),
        ) as r:
            first_token_at = None
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"content":"' in line[6:]:
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    if delta.get("content") and first_token_at is None:
                        first_token_at = time.monotonic() - started
    assert first_token_at is not None
    assert first_token_at >= 0.2


async def test_sglang_generate_batch_and_stream(start_emulator: Callable[..., str]) -> None:
    url = await asyncio.to_thread(start_emulator, flavor="sglang", scenario="echo")
    async with httpx.AsyncClient(base_url=url) as client:
        r = await client.post(
            "/generate",
            json={
                "text": ["alpha beta gamma", "delta epsilon"],
                "sampling_params": {"max_new_tokens": 5},
                "rid": ["a", "b"],
            },
        )
        assert r.status_code == 200
        results = r.json()
        assert [x["meta_info"]["id"] for x in results] == ["a", "b"]
        assert all(x["meta_info"]["completion_tokens"] == 5 for x in results)
        assert all(x["meta_info"]["finish_reason"]["type"] == "length" for x in results)
        assert results[0]["meta_info"]["prompt_tokens"] > 0

        texts: list[str] = []
        async with client.stream(
            "POST",
            "/generate",
            json={
                "text": "one two three",
                "sampling_params": {"max_new_tokens": 4},
                "stream": True,
            },
        ) as s:
            async for line in s.aiter_lines():
                if line.startswith("data: {"):
                    texts.append(json.loads(line[6:])["text"])
        assert texts
        # Each event carries the whole text so far (SGLang's cumulative stream).
        assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
        metrics = (await client.get("/metrics")).text
    assert "sglang:num_running_reqs" in metrics
    assert "emulator:max_lag_seconds" in metrics
    # The counters the decode cap reads: generated tokens and the prefill computed.
    from langgraph_batch.backends.sglang import parse_sglang_metrics

    parsed = parse_sglang_metrics(metrics)
    assert parsed.generation_tokens_total is not None
    assert parsed.generation_tokens_total >= 9
    assert parsed.prompt_tokens_total is not None
    assert parsed.prefix_cache_hits_total is not None
    assert parsed.prefix_cache_hits_total <= parsed.prompt_tokens_total
