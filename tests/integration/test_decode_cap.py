"""The decode cap against the emulator process: long-context agents decode in waves.

64 siblings, each one agent turn over a ~3k-token context with a forced
150-token answer, on the emulator's vLLM-0.26-on-H100 cost model (where decode
throughput stops growing past ~16 sequences at that context length). The
scheduler learns its cap from the emulator's `/metrics`; the emulator's
per-request phases show how many requests decoded at once and when the
siblings finished.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.graph import START, StateGraph

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import fan_out
from langgraph_batch.scheduler import BatchPolicy

MODEL = "emulated-llama-3-8b"
N = 64
ANSWER = 150


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": False})


class Parent(TypedDict, total=False):
    tasks: list[int]
    out: Annotated[list[Any], operator.add]


class Sibling(TypedDict, total=False):
    i: int
    answer: str


def decoding_at_once(rows: list[list[Any]]) -> int:
    """The most requests between first token and finish at the same time."""
    events = sorted([(r[3], 1) for r in rows] + [(r[4], -1) for r in rows])
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def spread(rows: list[list[Any]]) -> float:
    """How much earlier than the last sibling the first quarter finished (share of the run)."""
    start = min(r[1] for r in rows)
    finishes = sorted(r[4] - start for r in rows)
    return 1.0 - finishes[len(finishes) // 4] / finishes[-1]


async def run_fan_out(url: str, policy: BatchPolicy) -> tuple[list[list[Any]], Any, int | None]:
    llm = BatchedChatModel(  # type: ignore[call-arg]
        model=MODEL,
        base_url="vllm://" + url.split("://", 1)[1],
        max_tokens=ANSWER,
        extra_body={"ignore_eos": True},
        policy=policy,
        scheduler=f"decode-cap-{policy.decode_cap}",
    )
    system = SystemMessage("You are an agent. " + "context " * 1400)

    async def turn(state: Sibling) -> Sibling:
        # A second turn of a conversation: an agent request, which the cap holds.
        messages = [
            system,
            HumanMessage(f"task {state['i']}"),
            AIMessage("I looked it up."),
            HumanMessage("Now answer."),
        ]
        return {"answer": str((await llm.ainvoke(messages)).content)}

    sib = StateGraph(Sibling)
    sib.add_node("turn", turn)
    sib.add_edge(START, "turn")
    g = StateGraph(Parent)
    g.add_node(
        "fan",
        fan_out(sib.compile(), items="tasks", into="out", make_input=lambda i, _: {"i": i}),
    )
    g.add_edge(START, "fan")
    caps: list[int] = []

    async def watch_cap() -> None:
        # The cap moves while it learns: the largest one in force bounds a wave.
        while True:
            cap = llm.get_scheduler().stats().decode_cap
            if cap is not None:
                caps.append(cap)
            await asyncio.sleep(0.005)

    async with httpx.AsyncClient(base_url=url) as client:
        await client.post("/emulator/reset")
        watcher = asyncio.create_task(watch_cap())
        try:
            out = await g.compile().ainvoke({"tasks": list(range(N))})
        finally:
            watcher.cancel()
        rows = (await client.get("/emulator/requests")).json()["requests"]
    stats = llm.get_scheduler().stats()
    await llm.get_scheduler().aclose()
    assert len(out["out"]) == N
    assert all(r[8] == ANSWER for r in rows)
    return rows, stats, max(caps, default=None)


async def test_long_context_siblings_decode_in_waves(start_emulator: Callable[..., str]) -> None:
    url = await asyncio.to_thread(
        start_emulator, profile="h100-llama3-8b", scenario="echo", time_scale=3.0
    )
    policy = BatchPolicy(inflight_limit=64, inflight_cap=256, metrics_interval_s=0.02)
    rows, stats, max_cap = await run_fan_out(url, policy)
    assert stats.decode_cap is not None
    peak = decoding_at_once(rows)
    # At most the largest cap in force, rounded up for equal waves (never twice
    # it), never all.
    assert max_cap is not None
    assert peak < 2 * max(max_cap, 16), (peak, max_cap)
    assert peak < N
    # Siblings finish wave after wave: the first quarter well before the last.
    assert spread(rows) > 0.3

    off = BatchPolicy(
        inflight_limit=64, inflight_cap=256, metrics_interval_s=0.02, decode_cap=False
    )
    rows_off, stats_off, _ = await run_fan_out(url, off)
    assert stats_off.decode_cap is None
    # Without it everyone decodes together, and finishes together.
    assert decoding_at_once(rows_off) > peak
    assert spread(rows_off) < 0.1
