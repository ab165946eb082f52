"""LangGraph 1.2's `RunControl.request_drain` on a fan_out, against the emulator.

A drain stops the run at its next superstep boundary (`GraphDrained`); a
fan_out must drain with it promptly: siblings that finished are kept in the
checkpoint, siblings still waiting for admission never start, their model
calls are not left queued, no booking stays on the server's KV ledger, and
resuming the thread runs only the siblings that had not finished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphDrained
from langgraph.graph import START, StateGraph
from langgraph.runtime import RunControl

from langgraph_batch import BatchedChatModel, fan_out
from tests.fakes.fan_out import parent_graph

N = 8
TURNS = 2


class Sib(TypedDict, total=False):
    x: int
    turns: int


def build(llm: BatchedChatModel, calls: list[int], first_done: asyncio.Event) -> Any:
    async def turn(state: Sib) -> dict[str, Any]:
        calls.append(state["x"])
        await llm.ainvoke(f"sibling {state['x']} turn {state.get('turns', 0)}")
        if state["x"] == 0 and state.get("turns", 0) + 1 == TURNS:
            first_done.set()
        return {"turns": state.get("turns", 0) + 1}

    sib = StateGraph(Sib)
    sib.add_node("turn", turn)
    sib.add_edge(START, "turn")
    sib.add_conditional_edges("turn", lambda s: "turn" if s["turns"] < TURNS else "__end__")
    node = fan_out(sib.compile(), items="xs", into="out", max_active=2)
    return parent_graph(node, checkpointer=InMemorySaver())


async def test_a_drained_fan_out_keeps_finished_siblings_and_leaves_nothing_behind(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(start_emulator, scenario="echo", time_scale=1.0)
    llm = BatchedChatModel(
        model="emulated-llama-3-8b", base_url="vllm://" + url.split("://")[1], max_tokens=48
    )
    calls: list[int] = []
    first_done = asyncio.Event()
    graph = build(llm, calls, first_done)
    config: dict[str, Any] = {"configurable": {"thread_id": "drain"}}
    control = RunControl()
    items = [{"x": i} for i in range(N)]
    task = asyncio.create_task(graph.ainvoke({"xs": items}, config, control=control))
    # Drain once the first sibling made its last call, while others still wait.
    async with asyncio.timeout(30):
        await first_done.wait()
    control.request_drain("test")
    t0 = time.monotonic()
    with pytest.raises(GraphDrained) as drained:
        await task
    assert drained.value.reason == "test"
    drained_s = time.monotonic() - t0
    print(f"\ndrained in {drained_s:.2f} s; {len(set(calls))} of {N} siblings had started")
    started = set(calls)
    assert len(started) < N, "every sibling started: the drain stopped nothing"
    scheduler = llm.get_scheduler()
    stats = scheduler.stats()
    assert (stats.in_flight, stats.queued) == (0, 0)
    ledger = await scheduler.kv_ledger()
    assert ledger is not None
    assert (ledger.members, ledger.resident_tokens(), ledger.active()) == (0, 0, 0)
    # A model call lasts well under a second here: the drain waits for at most the
    # calls already running, not for the siblings that had not started.
    assert drained_s < 10, drained_s

    first_run = list(calls)
    calls.clear()
    out = await graph.ainvoke(None, config, control=RunControl())
    assert [r["x"] for r in out["out"]] == list(range(N))
    assert all(r["turns"] == TURNS for r in out["out"])
    finished = {x for x in started if first_run.count(x) == TURNS}
    assert finished, first_run
    assert not finished & set(calls), "a sibling that had finished ran again"
    assert set(calls) | finished == set(range(N))
    await scheduler.aclose()
