"""BatchedChatModel as a drop-in in plain LangGraph map-reduce graphs (no fan_out).

Every branch's call goes over HTTP to the emulator through the one scheduler
for that server, which holds at most `max_inflight` of them on the wire.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from langgraph_batch._loop import background_loop
from langgraph_batch.backends.base import ChatChunk, ChatRequest, ChatResponse
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.scheduler import Scheduler

MODEL = "emulated-llama-3-8b"


class State(TypedDict):
    topics: list[str]
    answers: Annotated[list[str], operator.add]


class Branch(TypedDict):
    topic: str


class Probe:
    """Counts concurrent backend calls by wrapping the scheduler's backend."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.inflight = 0
        self.peak = 0
        self.calls = 0
        self.loops: set[asyncio.AbstractEventLoop] = set()
        self.threads: set[str] = set()
        backend = scheduler.backend
        original: Callable[..., Any] = backend.chat

        async def chat(
            request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
        ) -> ChatResponse:
            self.inflight += 1
            self.calls += 1
            self.peak = max(self.peak, self.inflight)
            self.loops.add(asyncio.get_running_loop())
            self.threads.add(threading.current_thread().name)
            try:
                result: ChatResponse = await original(request, on_chunk=on_chunk)
                return result
            finally:
                self.inflight -= 1

        backend.chat = chat  # type: ignore[method-assign]


def fan(state: State) -> list[Send]:
    return [Send("answer", {"topic": t}) for t in state["topics"]]


async def test_async_send_mapreduce_shares_one_scheduler(emulator_url: str) -> None:
    llm = BatchedChatModel(
        model=MODEL,
        base_url=emulator_url,
        max_inflight=4,
        extra_body={"emulator": {"output_tokens": 8}},
    )
    scheduler = llm.get_scheduler()
    probe = Probe(scheduler)

    async def answer(branch: Branch) -> dict[str, list[str]]:
        msg = await llm.ainvoke(f"Say something about {branch['topic']}")
        return {"answers": [f"{branch['topic']}:{msg.text}"]}

    builder = StateGraph(State)
    builder.add_node("answer", answer)
    builder.add_conditional_edges(START, fan, ["answer"])
    builder.add_edge("answer", END)
    graph = builder.compile()

    topics = [f"t{i}" for i in range(40)]
    try:
        out = await graph.ainvoke({"topics": topics, "answers": []})
        stats = scheduler.stats()
    finally:
        await scheduler.aclose()
    assert sorted(a.split(":")[0] for a in out["answers"]) == sorted(topics)
    assert all(a.split(":", 1)[1] for a in out["answers"])
    assert probe.calls == 40
    assert stats.completed == 40
    assert 1 < probe.peak <= 4, probe.peak


def test_sync_graph_calls_go_through_the_background_loop(emulator_url: str) -> None:
    llm = BatchedChatModel(
        model=MODEL,
        base_url=emulator_url,
        max_inflight=3,
        extra_body={"emulator": {"output_tokens": 8}},
        # Its own scheduler: earlier sync tests made one for this URL on the
        # background loop, and the first creator's policy wins.
        scheduler="send-sync-test",
    )

    async def get_scheduler() -> Scheduler:
        return llm.get_scheduler()

    scheduler = background_loop().run(get_scheduler())
    probe = Probe(scheduler)
    node_threads: set[str] = set()

    def answer(branch: Branch) -> dict[str, list[str]]:
        node_threads.add(threading.current_thread().name)
        msg = llm.invoke(f"Say something about {branch['topic']}")
        return {"answers": [f"{branch['topic']}:{msg.text}"]}

    builder = StateGraph(State)
    builder.add_node("answer", answer)
    builder.add_conditional_edges(START, fan, ["answer"])
    builder.add_edge("answer", END)
    graph = builder.compile()

    topics = [f"s{i}" for i in range(12)]
    try:
        out = graph.invoke({"topics": topics, "answers": []})
        stats = scheduler.stats()
    finally:
        background_loop().run(scheduler.aclose())
    assert len(out["answers"]) == 12
    assert probe.calls == 12
    assert stats.completed == 12
    # Nodes ran in LangGraph's worker threads; every HTTP call ran on the one loop.
    assert probe.loops == {background_loop().loop}
    assert probe.threads == {"langgraph-batch-loop"}
    assert "langgraph-batch-loop" not in node_threads
    assert 1 < probe.peak <= 3, probe.peak
