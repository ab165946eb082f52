"""fan_out over a plain function, and `DirectLambda`, the direct call behind it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.config import ensure_config
from langgraph.config import get_config

from langgraph_batch._context import current_sibling
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.nodes._direct import DirectLambda, as_sibling_runnable
from tests.fakes.fan_out import number_graph, parent_graph


async def test_fan_out_over_an_async_function_collects_in_order_and_isolates() -> None:
    async def agent(x: int) -> int:
        await asyncio.sleep(0.01 * (3 - x % 3))  # finish out of order
        if x == 4:
            raise ValueError("four")
        info = current_sibling()
        assert info is not None
        assert info.index == x
        return x * 10

    node = fan_out(agent, items="xs", into="out")  # a function takes any item as it is
    assert node.name == "fan_out[agent]"
    out = await parent_graph(node).ainvoke({"xs": [0, 1, 2, 3, 4, 5]})
    assert out["out"][:4] == [0, 10, 20, 30]
    assert isinstance(out["out"][4], SiblingError)
    assert out["out"][4].error_type == "ValueError"
    assert out["out"][5] == 50


async def test_a_function_taking_config_gets_the_siblings_config() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    async def agent(x: int, config: RunnableConfig) -> int:
        current = get_config()  # LangGraph's view: the same config, as the current one
        seen.append(
            (
                x,
                config["configurable"]["lgb_sibling_index"],
                current["configurable"]["lgb_sibling_index"],
            )
        )
        return x

    node = fan_out(agent, items="xs", into="out", make_input=lambda x, i: x)
    await parent_graph(node).ainvoke({"xs": [0, 1, 2]})
    assert sorted(seen) == [(0, 0, 0), (1, 1, 1), (2, 2, 2)]


def test_fan_out_over_a_sync_function_in_a_sync_graph() -> None:
    def agent(x: int) -> int:
        info = current_sibling()
        assert info is not None
        return x + info.index

    node = fan_out(agent, items="xs", into="out", make_input=lambda x, i: x)
    assert parent_graph(node).invoke({"xs": [5, 6, 7]})["out"] == [5, 7, 9]


async def test_each_sibling_reaches_its_function_before_the_next_starts() -> None:
    # The inner `sibling` node and the user's function are called directly: no
    # task between a sibling's start (its input built) and its function, so the
    # first sibling's model call is made before the next sibling has started.
    # Through RunnableLambda every sibling started first (it yields at every layer).
    order: list[str] = []

    def start(x: int, i: int) -> int:
        order.append(f"start {i}")
        return x

    async def agent(x: int) -> int:
        order.append(f"call {x}")
        await asyncio.sleep(0)
        return x

    node = fan_out(agent, items="xs", into="out", make_input=start)
    await parent_graph(node).ainvoke({"xs": list(range(8))})
    assert order[:3] == ["start 0", "call 0", "start 1"]
    assert sorted(order) == sorted(f"{step} {i}" for step in ("start", "call") for i in range(8))


def test_direct_lambda_passes_config_only_when_the_function_names_it() -> None:
    def plain(x: int) -> int:
        return x + 1

    def with_config(x: int, config: RunnableConfig) -> Any:
        return (x, config["configurable"]["k"], ensure_config()["configurable"]["k"])

    assert DirectLambda(plain).invoke(1) == 2
    assert DirectLambda(with_config).invoke(1, {"configurable": {"k": "v"}}) == (1, "v", "v")
    # The config is current only during the call.
    assert "k" not in ensure_config().get("configurable", {})


async def test_direct_lambda_async_call_of_a_sync_function_runs_in_a_thread() -> None:
    threads: list[threading.Thread] = []

    def plain(x: int) -> int:
        threads.append(threading.current_thread())
        return x * 2

    assert await DirectLambda(plain).ainvoke(4) == 8
    assert threads
    assert threads[0] is not threading.current_thread()


async def test_an_object_with_an_async_call_is_awaited_not_run_in_a_thread() -> None:
    class Agent:
        async def __call__(self, x: int) -> int:
            await asyncio.sleep(0)
            return x + 1

    assert await DirectLambda(Agent()).ainvoke(1) == 2
    node = fan_out(Agent(), items="xs", into="out")
    assert (await parent_graph(node).ainvoke({"xs": [1, 2]}))["out"] == [2, 3]


def test_direct_lambda_sync_call_of_an_async_function_is_refused() -> None:
    async def agent(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="No synchronous function provided"):
        DirectLambda(agent).invoke(1)
    with pytest.raises(TypeError):
        DirectLambda()


def test_as_sibling_runnable_wraps_functions_only() -> None:
    graph = number_graph()
    lam = RunnableLambda(lambda x: x)
    assert as_sibling_runnable(graph) is graph
    assert as_sibling_runnable(lam) is lam
    thing = object()
    assert as_sibling_runnable(thing) is thing

    async def review(x: int) -> int:
        return x

    wrapped = as_sibling_runnable(review)
    assert isinstance(wrapped, DirectLambda)
    assert wrapped.name == "review"
    assert asyncio.run(wrapped.ainvoke(3)) == 3
