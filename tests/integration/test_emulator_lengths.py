"""`ignore_eos` / `max_tokens` / `min_tokens` over HTTP: every route gives vLLM's lengths.

Before the fix the emulator ignored `ignore_eos`: an agent answer asked for
200 tokens with `ignore_eos` came back at the scenario's own length.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

MODEL = "emulated-llama-3-8b"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "web_search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "enum": ["k1", "k2", "k3"]}},
                "required": ["query"],
            },
        },
    }
]
USER = {"role": "user", "content": "Task 3: look up key=k3 and report."}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "web_search", "arguments": '{"query":"k3"}'},
        }
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "the result"}
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "Finding",
        "schema": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    },
}


async def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await client.post(path, json={"model": MODEL, **body})


async def test_named_tool_turn_then_forced_answer_length(emulator_url: str) -> None:
    # The forced W1 shape of `bench --server`: a named tool choice, then an
    # answer of exactly 200 tokens.
    r = await _post(
        emulator_url,
        "/v1/chat/completions",
        {
            "messages": [USER],
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "web_search"}},
            "max_tokens": 64,
        },
    )
    body = r.json()
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"query": "k3"}
    natural = body["usage"]["completion_tokens"]
    assert natural < 64

    r = await _post(
        emulator_url,
        "/v1/chat/completions",
        {
            "messages": [USER, CALL, TOOL_RESULT],
            "tools": TOOLS,
            "tool_choice": "none",
            "max_tokens": 200,
            "ignore_eos": True,
        },
    )
    body = r.json()
    assert body["usage"]["completion_tokens"] == 200
    assert body["choices"][0]["finish_reason"] == "length"
    assert not body["choices"][0]["message"]["tool_calls"]


async def test_tool_turn_under_ignore_eos_is_exactly_max_tokens_and_valid(
    emulator_url: str,
) -> None:
    r = await _post(
        emulator_url,
        "/v1/chat/completions",
        {"messages": [USER], "tools": TOOLS, "max_tokens": 50, "ignore_eos": True},
    )
    body = r.json()
    assert body["usage"]["completion_tokens"] == 50
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"query": "k3"}


@pytest.mark.parametrize("stream", [False, True])
async def test_schema_answer_under_ignore_eos_stays_json(emulator_url: str, stream: bool) -> None:
    req = {
        "messages": [USER, CALL, TOOL_RESULT],
        "tools": TOOLS,
        "response_format": SCHEMA,
        "max_tokens": 120,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }
    r = await _post(emulator_url, "/v1/chat/completions", req)
    if not stream:
        body = r.json()
        content, usage = body["choices"][0]["message"]["content"], body["usage"]
    else:
        content, usage = "", None
        for line in r.text.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                content += choice["delta"].get("content") or ""
    assert usage is not None
    assert usage["completion_tokens"] == 120
    assert set(json.loads(content)) == {"summary"}


async def test_without_ignore_eos_the_answer_keeps_its_own_length(emulator_url: str) -> None:
    r = await _post(
        emulator_url,
        "/v1/chat/completions",
        {"messages": [USER, CALL, TOOL_RESULT], "tools": TOOLS, "max_tokens": 200},
    )
    assert r.json()["usage"]["completion_tokens"] == 64  # the server's output_tokens


async def test_min_tokens_and_bad_values(emulator_url: str) -> None:
    ok = await _post(
        emulator_url,
        "/v1/chat/completions",
        {"messages": [USER, CALL, TOOL_RESULT], "max_tokens": 300, "min_tokens": 100},
    )
    assert ok.json()["usage"]["completion_tokens"] == 100
    for bad in ({"ignore_eos": "yes"}, {"min_tokens": 400}, {"min_tokens": -1}):
        r = await _post(
            emulator_url, "/v1/chat/completions", {"messages": [USER], "max_tokens": 300, **bad}
        )
        assert r.status_code == 400, bad


async def test_batch_and_completions_routes_honour_ignore_eos(emulator_url: str) -> None:
    r = await _post(
        emulator_url,
        "/v1/chat/completions/batch",
        {
            "messages": [[USER], [{"role": "user", "content": "other key=k1"}]],
            "max_tokens": 90,
            "ignore_eos": True,
        },
    )
    body = r.json()
    assert body["usage"]["completion_tokens"] == 180
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    r = await _post(
        emulator_url,
        "/v1/completions",
        {"prompt": ["one", "two"], "max_tokens": 40, "ignore_eos": True},
    )
    assert r.json()["usage"]["completion_tokens"] == 80


async def test_sglang_generate_honours_ignore_eos_with_a_schema(
    start_emulator: Callable[..., str],
) -> None:
    import asyncio

    url = await asyncio.to_thread(start_emulator, flavor="sglang")
    schema = json.dumps(SCHEMA["json_schema"]["schema"])  # type: ignore[index]
    r = await _post(
        url,
        "/generate",
        {
            "text": "key=k2",
            "sampling_params": {"max_new_tokens": 70, "ignore_eos": True, "json_schema": schema},
        },
    )
    body = r.json()
    assert body["meta_info"]["completion_tokens"] == 70
    assert set(json.loads(body["text"])) == {"summary"}
