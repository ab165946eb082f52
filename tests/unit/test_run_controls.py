"""LangGraph 1.2's run controls around the library's holds (`langgraph_batch._heartbeat`).

A node attempt under `TimeoutPolicy(idle_timeout=...)` must not time out while
its model call waits in the scheduler's queue, or while its fan_out sibling
waits for admission: the library beats the node's `runtime.heartbeat`. The
policy here is `refresh_on="heartbeat"`, so nothing else refreshes it: each
call is in flight 0.3 s (well under the 1.5 s idle timeout, for a loaded CI
machine), and the holds last up to 2.1 s (over it). The first test shows
that such a hold does trip the timeout when nobody beats.
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.errors import NodeTimeoutError
from langgraph.graph import START, StateGraph
from langgraph.types import Send, TimeoutPolicy

from langgraph_batch._heartbeat import current_heartbeat, held
from langgraph_batch.backends.base import ChatRequest, ChatResponse
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import fan_out
from tests.fakes.backends import ScriptedBackend

IN_FLIGHT_S = 0.3
IDLE = TimeoutPolicy(idle_timeout=1.5, refresh_on="heartbeat")
N = 8


class SlowBackend(ScriptedBackend):
    """Every call takes `IN_FLIGHT_S` on the 'server'."""

    async def chat(self, request: ChatRequest, *, on_chunk: Any = None) -> ChatResponse:  # type: ignore[override]
        await asyncio.sleep(IN_FLIGHT_S)
        return await super().chat(request, on_chunk=on_chunk)


def slow_model() -> BatchedChatModel:
    backend = SlowBackend(base_url=f"fake://{uuid.uuid4().hex}")
    return BatchedChatModel(model="m", backend=backend, max_inflight=1)


class State(TypedDict, total=False):
    xs: list[int]
    out: Annotated[list[Any], operator.add]


def map_reduce(node: Any) -> Any:
    b = StateGraph(State)
    b.add_node("agent", node)
    b.add_conditional_edges(
        START, lambda s: [Send("agent", {"xs": [x]}, timeout=IDLE) for x in s["xs"]]
    )
    return b.compile()


async def test_a_silent_hold_trips_the_idle_timeout() -> None:
    async def agent(state: State) -> dict[str, Any]:
        await asyncio.sleep(2.1)  # held by something that does not beat
        return {"out": state["xs"]}

    with pytest.raises(NodeTimeoutError):
        await map_reduce(agent).ainvoke({"xs": [1]})


async def test_calls_queued_in_the_scheduler_do_not_trip_it() -> None:
    llm = slow_model()  # one call at a time: the last waits 2.1 s in the queue

    async def agent(state: State) -> dict[str, Any]:
        reply = await llm.ainvoke(f"item {state['xs'][0]}")
        return {"out": [reply.content]}

    out = await map_reduce(agent).ainvoke({"xs": list(range(N))})
    assert len(out["out"]) == N
    stats = llm.get_scheduler().stats()
    assert stats.completed == N
    await llm.get_scheduler().aclose()


class Sib(TypedDict, total=False):
    x: int
    y: str


class Parent(TypedDict, total=False):
    xs: list[dict[str, Any]]
    out: list[Any]


async def test_fan_out_siblings_waiting_for_admission_do_not_trip_it() -> None:
    llm = slow_model()

    async def call(state: Sib) -> dict[str, Any]:
        return {"y": (await llm.ainvoke(f"item {state['x']}")).content}

    sib = StateGraph(Sib)
    sib.add_node("call", call)
    sib.add_edge(START, "call")
    node = fan_out(sib.compile(), items="xs", into="out", max_active=1)
    b = StateGraph(Parent)
    b.add_node("fan", node, timeout=IDLE)
    b.add_edge(START, "fan")
    out = await b.compile().ainvoke({"xs": [{"x": i} for i in range(N)]})
    assert [r["x"] for r in out["out"]] == list(range(N))
    await llm.get_scheduler().aclose()


async def test_no_heartbeat_outside_a_run_or_without_an_idle_timeout() -> None:
    assert current_heartbeat() is None
    with held():  # a no-op: nothing to beat
        await asyncio.sleep(0)
    seen: list[object] = []

    async def node(state: State) -> dict[str, Any]:
        seen.append(current_heartbeat())
        return {}

    b = StateGraph(State)
    b.add_node("n", node)
    b.add_edge(START, "n")
    await b.compile().ainvoke({"xs": []})
    assert seen == [None]  # LangGraph's no-op heartbeat is recognised


async def test_agents_run_by_tasks_get_one_session_each_from_execution_info() -> None:
    backend = ScriptedBackend(base_url=f"fake://{uuid.uuid4().hex}")
    llm = BatchedChatModel(model="m", backend=backend)

    class Agent(TypedDict, total=False):
        x: int
        turns: int

    async def model(state: Agent) -> dict[str, Any]:
        await llm.ainvoke("the same opening message for every agent")
        return {"turns": state.get("turns", 0) + 1}

    agent = StateGraph(Agent)
    agent.add_node("model", model)
    agent.add_edge(START, "model")
    agent.add_conditional_edges("model", lambda s: "model" if s["turns"] < 3 else "__end__")
    compiled = agent.compile()

    b = StateGraph(State)
    b.add_node("agent", compiled)
    b.add_conditional_edges(START, lambda s: [Send("agent", {"x": x}) for x in s["xs"]])
    await b.compile().ainvoke({"xs": [1, 2]})
    keys = [r.route_key for r in backend.requests]
    assert len(keys) == 6
    assert all(k is not None and k.startswith("task:") for k in keys), keys
    assert len(set(keys)) == 2  # one per agent, the same on its three turns
    assert sorted(keys.count(k) for k in set(keys)) == [3, 3]

    backend.requests.clear()  # a model node of the top-level graph: a new task each turn
    await compiled.ainvoke({"x": 1})
    assert [r.route_key for r in backend.requests] == [None, None, None]
    await llm.get_scheduler().aclose()
