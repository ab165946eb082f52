"""The sibling-agent check both hosted flavours' integration tests run (Anthropic, Bedrock)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from langgraph_batch import BatchedChatModel
from langgraph_batch.backends import LangChainBackend


@tool
def lookup(q: str) -> str:
    """Look a key up."""
    return f"{q}=42"


async def assert_siblings_warm_then_read(
    backend: LangChainBackend, *, model: str, system: str, hosted_url: str
) -> None:
    """6 agents behind `backend`: one call writes the shared prefix, every other reads it.

    Each agent calls `lookup`, then answers (12 calls); more than 80% of the
    emulator's prompt tokens must be cache reads.
    """
    llm = BatchedChatModel(model=model, backend=backend, max_inflight=16).bind_tools([lookup])

    async def agent(i: int) -> list[dict[str, Any]]:
        messages: list[Any] = [SystemMessage(system), HumanMessage(f"find key=k{i}")]
        usages = []
        for _ in range(3):
            reply = await llm.ainvoke(messages)
            usages.append(dict(reply.usage_metadata["input_token_details"]))
            messages.append(reply)
            if not reply.tool_calls:
                break
            call = reply.tool_calls[0]
            messages.append(ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"]))
        return usages

    runs = await asyncio.gather(*(agent(i) for i in range(6)))
    calls = [u for run in runs for u in run]
    assert len(calls) == 12  # a tool call, then the answer
    # Warming: one sibling wrote the shared prefix, every other call read it.
    writers = [u for u in calls if u["cache_creation"] > 1024]
    assert len(writers) == 1
    assert all(u["cache_read"] > 1024 for u in calls if u is not writers[0])
    async with httpx.AsyncClient(base_url=hosted_url) as http:
        totals = (await http.get("/emulator/hosted")).json()
    prompt = (
        totals["input_tokens"]
        + totals["cache_read_input_tokens"]
        + totals["cache_creation_input_tokens"]
    )
    assert totals["cache_read_input_tokens"] / prompt > 0.8
