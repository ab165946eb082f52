"""W7's sibling as a graph for the distributed executors: one tool-free extraction call.

Workers and Ray node runners import it as `benchmarks.distributed_w7_graph:graph`.
The input carries the sibling's index; the prompt is W7's (`langgraph_batch.bench.
workloads`): the shared 1,000-token instruction as the system message and the
sibling's unique 1,500-token document, built on the node that runs the sibling
(so the payload that travels is the index, as with a document id). The emulator
answers with W7's 150 tokens (`output_tokens`, set on the server).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch.bench.workloads import WORKLOADS, system_prompt, task_text
from langgraph_batch.chat_model import BatchedChatModel

W7 = WORKLOADS["W7"]
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
        max_tokens=W7.final_tokens,
    )


@functools.cache
def _system() -> str:
    return system_prompt(W7, SEED)


async def extract(state: Sibling) -> dict[str, Any]:
    i = state["i"]
    msg = await _llm().ainvoke([("system", _system()), ("user", task_text(W7, i, SEED))])
    return {"answer_chars": len(str(msg.content))}


def _build() -> Any:
    b = StateGraph(Sibling)
    b.add_node("extract", extract)
    b.add_edge(START, "extract")
    return b.compile(name="w7_sibling")


graph = _build()
