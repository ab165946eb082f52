"""Tool coalescing under a real `fan_out` (its own sibling groups and admission gate)."""

from __future__ import annotations

import asyncio
import operator
from collections import Counter
from typing import Annotated, Any, TypedDict

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph

from langgraph_batch._context import current_sibling
from langgraph_batch.nodes.fan_out import fan_out
from langgraph_batch.tools import (
    BatchMiddleware,
    BatchToolNode,
    coalesce,
    coalesce_policy,
    coalescing,
    tool_stats,
)
from tests.fakes.chat_models import ScriptedToolModel, ask
from tests.fakes.fan_out import react_graph, tool_messages


class Parent(TypedDict, total=False):
    cities: list[str]
    answers: Annotated[list[Any], operator.add]


def parent_graph(subgraph: Any, *, max_active: int | None = None) -> Any:
    builder = StateGraph(Parent)
    builder.add_node(
        "fan",
        fan_out(
            subgraph,
            items="cities",
            into="answers",
            make_input=lambda city, i: ask(("weather", {"city": city})),
            result=lambda state: state["messages"],
            max_active=max_active,
        ),
    )
    builder.add_edge(START, "fan")
    return builder.compile()


def make_weather() -> tuple[Any, Counter[str], list[str]]:
    executions: Counter[str] = Counter()
    groups: list[str] = []

    @tool
    async def weather(city: str) -> str:
        """Weather for a city."""
        executions[city] += 1
        sibling = current_sibling()
        assert sibling is not None
        assert sibling.in_tool
        groups.append(sibling.group)
        return f"sunny in {city}"

    return weather, executions, groups


def check_answers(answers: list[Any], cities: list[str]) -> None:
    assert len(answers) == len(cities)
    ids: set[str] = set()
    for city, messages in zip(cities, answers, strict=True):
        calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        (msg,) = tool_messages({"messages": messages})
        assert msg.tool_call_id == calls[0]["id"]
        assert msg.content == f"sunny in {city}"
        ids.add(msg.tool_call_id)
    assert len(ids) == len(cities)


async def test_fan_out_with_batch_tool_node_executes_distinct_keys() -> None:
    weather, executions, groups = make_weather()
    cities = ["paris", "tokyo", "lima", "paris", "tokyo", "paris"] * 3
    graph = parent_graph(react_graph(BatchToolNode([coalesce(weather)])))
    before = tool_stats()
    out = await graph.ainvoke({"cities": cities})
    check_answers(out["answers"], cities)
    assert sum(executions.values()) == 3
    group = groups[0]
    stats = tool_stats(group)
    assert (stats.requested, stats.executed, stats.shared) == (len(cities), 3, len(cities) - 3)
    assert tool_stats().requested - before.requested == len(cities)

    # A second run is a new group: its siblings execute again (no cross-run reuse without ttl).
    await graph.ainvoke({"cities": ["paris"]})
    assert executions["paris"] == 2
    assert groups[-1] != group


async def test_fan_out_with_create_agent_middleware() -> None:
    weather, executions, _ = make_weather()
    agent = create_agent(ScriptedToolModel(), [coalesce(weather)], middleware=[BatchMiddleware()])
    cities = ["oslo", "rome"] * 5
    out = await parent_graph(agent).ainvoke({"cities": cities})
    check_answers(out["answers"], cities)
    assert executions == Counter({"oslo": 1, "rome": 1})


async def test_in_tool_siblings_free_their_admission_place() -> None:
    """max_active=1: only if a sibling waiting in a tool releases its place can the
    other siblings reach the same tool call and share it (otherwise: deadlock)."""
    release = asyncio.Event()
    executions = 0

    @tool
    async def weather(city: str) -> str:
        """Weather for a city."""
        nonlocal executions
        executions += 1
        await release.wait()
        return f"sunny in {city}"

    marked = coalesce(weather, scope="inflight")
    policy = coalesce_policy(marked)
    live = coalescing(marked)
    assert live is not None
    assert policy is not None
    key = policy.call_key("weather", {"city": "paris"})
    cities = ["paris"] * 4
    graph = parent_graph(react_graph(BatchToolNode([marked])), max_active=1)
    run = asyncio.create_task(graph.ainvoke({"cities": cities}))
    try:
        for _ in range(2000):  # at most ~10 s; stuck here if places are not released
            if live.coalescer.waiting(key) == len(cities):
                break
            await asyncio.sleep(0.005)
        assert live.coalescer.waiting(key) == len(cities)
    except BaseException:
        run.cancel()
        raise
    release.set()
    out = await run
    check_answers(out["answers"], cities)
    assert executions == 1
