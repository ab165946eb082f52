"""BatchedChatModel over real HTTP against the emulator (vLLM flavour)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import BackendServerError, MalformedToolCallError, ModelNotFoundError
from langgraph_batch.scheduler import BatchPolicy, RetryPolicy

MODEL = "emulated-llama-3-8b"


@tool
def lookup(city: str) -> str:
    """Look up facts about a city."""
    return f"{city} has a river"


class Fact(BaseModel):
    """A fact about a city."""

    city: str
    population: int


def make(url: str, **kw: Any) -> BatchedChatModel:
    opts = {"output_tokens": 8, **kw.pop("emulator", {})}
    return BatchedChatModel(model=MODEL, base_url=url, extra_body={"emulator": opts}, **kw)


async def test_invoke_and_stream_usage(emulator_url: str) -> None:
    # 48 tokens: enough decode steps that the stream usually arrives as several events
    # (the emulator sends what was decoded since its loop last woke).
    llm = make(emulator_url, max_tokens=64, emulator={"output_tokens": 48})
    msg = await llm.ainvoke("hello there")
    assert msg.text
    assert msg.usage_metadata is not None
    assert msg.usage_metadata["output_tokens"] > 0
    assert msg.response_metadata["model_name"] == MODEL
    assert msg.response_metadata["request_id"].startswith("lgb-")
    assert msg.response_metadata["id"]
    # The same prompt again hits the emulator's prefix cache, reported as cache_read.
    # (only full 16-token blocks are cached, so the prompt must be long enough).
    long_prompt = " ".join(f"word{i}" for i in range(80))
    await llm.ainvoke(long_prompt)
    again = await llm.ainvoke(long_prompt)
    assert again.usage_metadata is not None
    assert again.usage_metadata.get("input_token_details", {}).get("cache_read", 0) > 0
    chunks = [c async for c in llm.astream("hello there")]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    # Content, then the last chunk with the usage. How many content chunks depends on
    # how often the emulator's loop wakes: on a loaded machine one event carried all
    # 48 tokens (2 chunks in all), so more than one content chunk is not asserted.
    assert len(chunks) >= 2
    assert any(c.text for c in chunks[:-1])
    assert chunks[-1].chunk_position == "last"
    assert chunks[-1].usage_metadata is not None
    assert "".join(c.text for c in chunks) == msg.text  # deterministic emulator


async def test_agent_tool_loop_with_sibling_turns(emulator_url: str) -> None:
    llm = make(emulator_url, emulator={"turns": 2}).bind_tools([lookup])
    info = SiblingInfo(group="it", index=0)
    with sibling_scope(info):
        first = await llm.ainvoke([HumanMessage("Tell me about key=Paris")])
        assert first.tool_calls, first
        call = first.tool_calls[0]
        assert call["name"] == "lookup"
        assert call["args"] == {"city": "Paris"}
        result = await lookup.ainvoke(call["args"])
        second = await llm.ainvoke(
            [
                HumanMessage("Tell me about key=Paris"),
                first,
                ToolMessage(result, tool_call_id=call["id"]),
            ]
        )
    assert not second.tool_calls
    assert second.text
    assert info.turn == 2
    assert first.response_metadata["request_id"].startswith("lgb-it-0-t0-")
    assert second.response_metadata["request_id"].startswith("lgb-it-0-t1-")


async def test_streamed_tool_call(emulator_url: str) -> None:
    llm = make(emulator_url, emulator={"turns": 2}).bind_tools([lookup])
    full: Any = None
    async for chunk in llm.astream("Tell me about key=Rome"):
        full = chunk if full is None else full + chunk
    assert full.tool_calls[0]["args"] == {"city": "Rome"}
    assert full.response_metadata["finish_reason"] == "tool_calls"


async def test_structured_output_json_schema(emulator_url: str) -> None:
    llm = make(emulator_url)
    fact = await llm.with_structured_output(Fact).ainvoke("A fact about Oslo")
    assert isinstance(fact, Fact)
    raw = await llm.with_structured_output(Fact, include_raw=True).ainvoke("A fact")
    assert raw["parsing_error"] is None
    assert isinstance(raw["parsed"], Fact)


async def test_malformed_tool_arguments_raise_after_retries(emulator_url: str) -> None:
    fast = BatchPolicy(retry=RetryPolicy(initial_interval=0.001, max_interval=0.001))
    emulator = {"turns": 2, "fault": "bad_tool_args"}
    for streaming in (False, True):
        llm = make(emulator_url, emulator=emulator, policy=fast, max_retries=2, streaming=streaming)
        with pytest.raises(MalformedToolCallError) as info:
            await llm.bind_tools([lookup]).ainvoke("Tell me about key=Lima")
        assert info.value.tool_name == "lookup"
        # Not streamed: retried twice. Streamed: the call's chunks reached the caller
        # before the arguments turned out broken, so it is not replayed.
        assert info.value.attempts == (1 if streaming else 3)


async def test_malformed_tool_arguments_can_be_returned(emulator_url: str) -> None:
    llm = make(
        emulator_url, emulator={"turns": 2, "fault": "bad_tool_args"}, invalid_tool_calls="return"
    ).bind_tools([lookup])
    msg = await llm.ainvoke("Tell me about key=Lima")
    assert msg.tool_calls == []
    assert msg.invalid_tool_calls
    assert msg.invalid_tool_calls[0]["name"] == "lookup"


async def test_a_storm_of_malformed_calls_is_retried_never_passed_off_as_valid(
    start_emulator: Any,
) -> None:
    url = await asyncio.to_thread(start_emulator, fault_rate=0.4, faults=("bad_tool_args",), seed=3)
    llm = make(
        url,
        emulator={"turns": 2},
        policy=BatchPolicy(retry=RetryPolicy(initial_interval=0.001, max_interval=0.001)),
        max_retries=4,
    ).bind_tools([lookup])
    cities = [f"City{i}" for i in range(40)]
    results = await asyncio.gather(
        *(llm.ainvoke(f"Tell me about key={c}") for c in cities), return_exceptions=True
    )
    ok = 0
    for city, result in zip(cities, results, strict=True):
        if isinstance(result, BaseException):
            assert isinstance(result, MalformedToolCallError), result
            continue
        ok += 1
        assert result.invalid_tool_calls == []
        assert result.tool_calls[0]["args"] == {"city": city}
    assert ok >= 35
    stats = BatchedChatModel(model=MODEL, base_url=url).get_scheduler().stats()
    assert stats.malformed_tool_calls > 0
    assert stats.retries >= stats.malformed_tool_calls - (len(cities) - ok)


async def test_errors_surface_as_backend_errors(emulator_url: str) -> None:
    with pytest.raises(BackendServerError):
        await make(emulator_url, max_retries=0, emulator={"fault": "500"}).ainvoke("x")
    with pytest.raises(ModelNotFoundError):
        await BatchedChatModel(model="no-such-model", base_url=emulator_url).ainvoke("x")


async def test_cancelled_stream_frees_its_slot(emulator_url: str) -> None:
    llm = make(emulator_url, max_inflight=1, emulator={"output_tokens": 400})
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in llm.astream("long answer please"):
            got_one.set()

    task = asyncio.create_task(consume())
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The only slot is free again: a new call goes through.
    msg = await asyncio.wait_for(make(emulator_url, max_inflight=1).ainvoke("next"), 20)
    assert msg.text
    scheduler = llm.get_scheduler()
    assert scheduler.stats().cancelled >= 1
    await scheduler.aclose()


def test_sync_invoke_and_stream(emulator_url: str) -> None:
    llm = make(emulator_url)
    assert llm.invoke("hello").text
    chunks = list(llm.stream("hello"))
    assert chunks[-1].chunk_position == "last"
