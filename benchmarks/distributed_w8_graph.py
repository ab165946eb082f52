"""W8's sibling as a graph for the distributed executors: one long-horizon agent.

Workers and Ray node runners import it as `benchmarks.distributed_w8_graph:graph`.
The input carries the sibling's index; everything else is W8's
(`langgraph_batch.bench.workloads`), drawn on the node that runs the sibling:
its number of model calls (6-24), the shared 3,000-token system prompt and its
1,000-token task, a line of reasoning (20-200 tokens) per call and W8's final
answer, and between calls a tool: it waits W8's long-tailed latency for that
call (shrunk with the emulator's clock) while it is in a tool for the admission
gate (`SiblingInfo.tool_enter` / `tool_exit`, as a tool node does), then its
result (300-3,000 tokens) joins the conversation. So the contexts grow as W8's
do, and KV admission, tool release and the scheduler work as in W8; the model
is told each answer's length (the emulator's `output_tokens`), no tool is bound.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch._context import current_sibling
from langgraph_batch.bench.workloads import WORKLOADS, system_prompt, task_text, tool_config
from langgraph_batch.chat_model import BatchedChatModel

W8 = WORKLOADS["W8"]
SEED = 0


class Sibling(TypedDict, total=False):
    i: int
    answer_chars: int


@functools.cache
def _llm() -> BatchedChatModel:
    # Built on first use: the parent sets LGB_BENCH_LLM_URL after importing this module.
    return BatchedChatModel(
        model=os.environ.get("LGB_BENCH_MODEL", "emulated-llama-3-8b"),
        base_url=os.environ.get("LGB_BENCH_LLM_URL", "vllm://127.0.0.1:8000"),
    )


@functools.cache
def _system() -> str:
    return system_prompt(W8, SEED)


@functools.cache
def _tools() -> Any:
    return tool_config(W8, W8.time_scale, SEED)


async def _say(messages: list[BaseMessage], tokens: int) -> AIMessage:
    reply = await _llm().ainvoke(
        messages, max_tokens=tokens, extra_body={"emulator": {"output_tokens": tokens}}
    )
    assert isinstance(reply, AIMessage)
    return reply


async def agent(state: Sibling) -> dict[str, Any]:
    i = state["i"]
    rng = random.Random(f"w8-agent:{SEED}:{i}")
    messages: list[BaseMessage] = [
        SystemMessage(_system()),
        HumanMessage(task_text(W8, i, SEED)),
    ]
    tools, sibling = _tools(), current_sibling()
    think = W8.think_tokens or (20, 200)
    for turn in range(W8.turns_for(i, SEED) - 1):
        messages.append(await _say(messages, rng.randint(*think)))
        key = f"{i}:{turn}"
        if sibling is not None:
            await sibling.tool_enter("w8_tool")
        try:
            await asyncio.sleep(tools.latency_for(key))
        finally:
            if sibling is not None:
                await sibling.tool_exit()
        messages.append(HumanMessage(tools.result_for(key)))
    answer = await _say(messages, W8.final_tokens)
    return {"answer_chars": len(str(answer.content)) or 1}


def _build() -> Any:
    b = StateGraph(Sibling)
    b.add_node("agent", agent)
    b.add_edge(START, "agent")
    return b.compile(name="w8_sibling")


graph = _build()
