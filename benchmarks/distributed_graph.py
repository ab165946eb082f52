"""The sibling graph of `benchmarks.distributed_scale`: CPU-heavy work plus one LLM call.

Workers import it as `benchmarks.distributed_graph:graph`. `spin` is a number
of pure-Python loop iterations (the parent calibrates it to ~`--work-ms`);
the model is a `BatchedChatModel` against `LGB_BENCH_LLM_URL` (the emulator).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch.chat_model import BatchedChatModel


class Sibling(TypedDict, total=False):
    i: int
    spin: int
    prompt: str
    checksum: int
    answer: str


def burn(iterations: int) -> int:
    """Pure-Python work: holds the GIL, like parsing or scoring in a real sibling."""
    acc = 0
    for k in range(iterations):
        acc = (acc * 31 + k) % 1_000_003
    return acc


@functools.cache
def _llm() -> BatchedChatModel:
    # Built on first use: the parent sets LGB_BENCH_LLM_URL after importing this module.
    return BatchedChatModel(
        model=os.environ.get("LGB_BENCH_MODEL", "emulated-llama-3-8b"),
        base_url=os.environ.get("LGB_BENCH_LLM_URL", "vllm://127.0.0.1:8000"),
        max_tokens=16,
    )


async def work(state: Sibling) -> dict[str, Any]:
    checksum = burn(state.get("spin", 0))
    msg = await _llm().ainvoke(state.get("prompt", "hi"))
    return {"checksum": checksum, "answer": str(msg.content)}


def _build() -> Any:
    b = StateGraph(Sibling)
    b.add_node("work", work)
    b.add_edge(START, "work")
    return b.compile(name="cpu_sibling")


graph = _build()
