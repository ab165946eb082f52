"""Degraded mode against a real server: ChatOpenAI (pointed at the emulator) wrapped in
LangChainBackend, driven by BatchedChatModel and fan_out.

Everything crosses real HTTP through the openai SDK: tools, structured output
(response_format passed through), streaming, usage with cached tokens, and
429s injected by the emulator, which the scheduler (not the SDK: max_retries=0)
must retry.
"""

from __future__ import annotations

import asyncio
import operator
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from pydantic import BaseModel
from typing_extensions import TypedDict

from langgraph_batch import (
    BatchedChatModel,
    BatchMiddleware,
    BatchPolicy,
    RetryPolicy,
    fan_out,
)
from langgraph_batch._loop import background_loop
from langgraph_batch.backends import LangChainBackend
from langgraph_batch.tools import coalesce

MODEL = "emulated-llama-3-8b"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}


def _build(url: str, http: httpx.AsyncClient) -> LangChainBackend:
    # max_retries=0: the scheduler, not the SDK, retries (and sees every 429).
    # Its own async client: langchain-openai otherwise shares one cached client
    # per base URL across the process, and test_emulator_clients.py used that one
    # from its own (since closed) event loops.
    model = ChatOpenAI(
        model=MODEL,
        base_url=url + "/v1",
        api_key="x",  # type: ignore[arg-type]
        max_retries=0,
        http_async_client=http,
    )
    return LangChainBackend(model)


@pytest.fixture
async def wrap() -> AsyncIterator[Callable[[str], Awaitable[LangChainBackend]]]:
    """`await wrap(url)`: ChatOpenAI at `url` in a LangChainBackend, built off the loop
    (the SDK reads package metadata and CA files on first use)."""
    clients: list[httpx.AsyncClient] = []

    async def make(url: str) -> LangChainBackend:
        http = await asyncio.to_thread(httpx.AsyncClient)
        clients.append(http)
        return await asyncio.to_thread(_build, url, http)

    yield make
    for http in clients:  # on the loop that used it (LangChainBackend's home loop)
        await asyncio.wrap_future(background_loop().submit(http.aclose()))


class Verdict(BaseModel):
    label: str
    confidence: float


async def test_tools_structured_output_streaming_and_usage(
    emulator_url: str, wrap: Callable[[str], Awaitable[LangChainBackend]]
) -> None:
    llm = BatchedChatModel(model=MODEL, backend=await wrap(emulator_url))

    msg = await llm.bind_tools([LOOKUP], tool_choice="required").ainvoke("search key=lc1")
    assert msg.tool_calls[0]["name"] == "lookup"
    assert msg.tool_calls[0]["args"] == {"query": "lc1"}
    assert msg.response_metadata["finish_reason"] == "tool_calls"

    verdict = await llm.with_structured_output(Verdict).ainvoke("judge key=v9")
    assert isinstance(verdict, Verdict)
    assert verdict.label == "v9"

    prompt = "tell me about caching key=s1 " + "context " * 200
    first = await llm.ainvoke(prompt)
    assert first.usage_metadata is not None
    assert first.usage_metadata["input_tokens"] > 200
    chunks = [c async for c in llm.astream(prompt)]
    text = "".join(str(c.content) for c in chunks)
    assert text.startswith("Final answer for s1:")
    # Really streamed: more than one piece (a loaded machine gets several tokens an event).
    assert sum(1 for c in chunks if c.content) >= 2
    usage = chunks[-1].usage_metadata
    assert usage is not None
    assert usage["output_tokens"] > 0
    # The same prompt again: the emulator's prefix cache reports cached tokens,
    # ChatOpenAI maps them to input_token_details.cache_read, and so do we.
    assert usage.get("input_token_details", {}).get("cache_read", 0) >= 128

    stream = llm.bind_tools([LOOKUP], tool_choice="required").astream("go key=zz")
    total: AIMessageChunk | None = None
    async for chunk in stream:
        total = chunk if total is None else total + chunk
    assert total is not None
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [("lookup", {"query": "zz"})]

    stats = llm.get_scheduler().stats()
    assert stats.completed == 5
    assert stats.prompt_tokens > 400


class Parent(TypedDict, total=False):
    topics: list[str]
    answers: Annotated[list[Any], operator.add]


async def test_fan_out_of_agents_with_injected_429s(
    start_emulator: Callable[..., str], wrap: Callable[[str], Awaitable[LangChainBackend]]
) -> None:
    url = await asyncio.to_thread(
        start_emulator, fault_rate=0.3, faults=("429",), retry_after_s=0.01
    )
    backend = await wrap(url)
    llm = BatchedChatModel(
        model=MODEL,
        backend=backend,
        max_retries=10,
        policy=BatchPolicy(inflight_limit=8, retry=RetryPolicy(initial_interval=0.01)),
    )
    executions: Counter[str] = Counter()

    @tool
    async def lookup(query: str) -> str:
        """Look something up."""
        executions[query] += 1
        return f"notes on {query}"

    agent = create_agent(llm, [coalesce(lookup)], middleware=[BatchMiddleware()])
    builder = StateGraph(Parent)
    builder.add_node(
        "fan",
        fan_out(
            agent,
            items="topics",
            into="answers",
            make_input=lambda t, i: {"messages": [("user", f"research key={t} (sibling {i})")]},
            result=lambda final: final["messages"][-1].content,
        ),
    )
    builder.add_edge(START, "fan")
    topics = [f"t{i % 4}" for i in range(16)]

    out = await builder.compile().ainvoke({"topics": topics})

    answers = out["answers"]
    assert len(answers) == len(topics)
    for topic, answer in zip(topics, answers, strict=True):
        assert isinstance(answer, str), answer  # no SiblingError: every 429 was retried
        assert answer.startswith(f"Final answer for {topic}")
    stats = llm.get_scheduler().stats()
    assert stats.retries >= 1  # the emulator's seeded faults hit some calls
    assert stats.failed == 0
    assert sum(executions.values()) == 4  # one lookup per distinct topic (coalesced)
