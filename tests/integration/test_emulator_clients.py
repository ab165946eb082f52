"""Real clients against the emulator subprocess: the openai SDK and ChatOpenAI."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

MODEL = "emulated-llama-3-8b"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}


@pytest.fixture(scope="module", autouse=True)
def _import_lazily_loaded_modules(emulator_url: str) -> None:
    """The SDKs import (and read package metadata) on first use: do it off the event loop."""
    openai.OpenAI(base_url=emulator_url + "/v1", api_key="x").close()
    openai.AsyncOpenAI(base_url=emulator_url + "/v1", api_key="x")
    ChatOpenAI(model=MODEL, base_url=emulator_url + "/v1", api_key="x")


@pytest.fixture
async def client(emulator_url: str) -> openai.AsyncOpenAI:
    async with openai.AsyncOpenAI(base_url=emulator_url + "/v1", api_key="x", max_retries=0) as c:
        yield c


async def test_openai_chat_with_tools_then_answer(client: openai.AsyncOpenAI) -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": "find it key=k42"}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "lookup"
    assert json.loads(call.function.arguments)["query"] == "k42"
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "result"})
    second = await client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP])
    assert second.choices[0].finish_reason == "stop"
    assert "k42" in second.choices[0].message.content
    # Turn 2 extends turn 1's prompt: its prefix comes from the cache.
    assert (
        second.usage.prompt_tokens_details.cached_tokens
        >= first.usage.prompt_tokens // 16 * 16 - 16
    )


async def test_openai_streaming_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "tell me"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
    )
    text = ""
    usage = None
    finish = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert usage is not None
    assert usage.completion_tokens == 12
    assert finish == "length"
    assert text


async def test_openai_streaming_tool_call(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "go key=zz"}],
        tools=[LOOKUP],
        stream=True,
    )
    args = ""
    names = []
    async for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                args += (tc.function.arguments or "") if tc.function else ""
    assert names == ["lookup"]
    assert json.loads(args)["query"] == "zz"


async def test_long_horizon_agent_reasons_varies_its_calls_and_reuses_its_context(
    client: openai.AsyncOpenAI,
) -> None:
    """`turns=` and `think=` markers: text before every call, new arguments each turn, the
    next turn's prompt a cache hit past the previous answer; streamed the same."""
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "fix key=k9 turns=4 think=10-30 now"}
    ]
    seen: list[str] = []
    prompt = output = 0
    for turn in range(4):
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=[LOOKUP])
        if turn:
            cached = reply.usage.prompt_tokens_details.cached_tokens
            assert cached >= (prompt + output) // 16 * 16 - 16
        prompt, output = reply.usage.prompt_tokens, reply.usage.completion_tokens
        choice = reply.choices[0]
        if turn == 3:
            assert choice.finish_reason == "stop"
            break
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content
        assert choice.message.content.startswith("Next:")
        call = choice.message.tool_calls[0]
        seen.append(json.loads(call.function.arguments)["query"])
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[LOOKUP], stream=True
        )
        text = args = ""
        async for chunk in stream:
            for ch in chunk.choices:
                text += ch.delta.content or ""
                for tc in ch.delta.tool_calls or []:
                    args += (tc.function.arguments or "") if tc.function else ""
        assert text == choice.message.content
        assert json.loads(args) == json.loads(call.function.arguments)
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"result {turn}"})
    assert seen == ["k9", "k9.1", "k9.2"]


async def test_openai_json_schema(client: openai.AsyncOpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "kind": {"enum": ["a", "b"]},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "score", "tags", "kind", "ok"],
    }
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "rate key=r1"}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    data = json.loads(resp.choices[0].message.content)
    assert data["name"] == "r1"
    assert isinstance(data["score"], float)
    assert data["kind"] in {"a", "b"}
    assert data["ok"] is True


async def test_openai_list_prompt_completions(client: openai.AsyncOpenAI) -> None:
    resp = await client.completions.create(
        model=MODEL, prompt=["one", "two two", "three"], max_tokens=5
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert resp.usage.completion_tokens == 15


async def test_openai_errors(client: openai.AsyncOpenAI, emulator_url: str) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}]
        )
    # vLLM 0.32 cuts a too-large max_tokens to what fits; a prompt over the limit is a 400.
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.completions.create(model=MODEL, prompt=[1] * 40_000, max_tokens=1)
    async with httpx.AsyncClient() as h:
        r = await h.post(emulator_url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


class Verdict(BaseModel):
    label: str
    confidence: float


async def test_chat_openai_tools_and_structured(emulator_url: str) -> None:
    llm = ChatOpenAI(model=MODEL, base_url=emulator_url + "/v1", api_key="x", max_retries=0)
    msg = await llm.bind_tools([LOOKUP]).ainvoke("search key=lc1")
    assert msg.tool_calls[0]["args"]["query"] == "lc1"
    verdict = await llm.with_structured_output(Verdict, method="json_schema").ainvoke(
        "judge key=v9"
    )
    assert verdict.label == "v9"
    chunks = [c async for c in llm.astream("hello")]
    assert "".join(str(c.content) for c in chunks)
