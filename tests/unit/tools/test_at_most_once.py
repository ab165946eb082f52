"""`at_most_once` tools: a call an earlier attempt of the sibling made is not made again."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.errors import ToolAlreadyRanError
from langgraph_batch.tools import BatchToolNode, at_most_once, forget_run, set_once_store
from langgraph_batch.tools._once import ONCE_DONE, ONCE_RUN, ONCE_TAKEN, MemoryOnceStore

effects: list[str] = []


@tool
async def charge(order: str, cents: int) -> dict[str, Any]:
    """Charge an order."""
    effects.append(f"{order}:{cents}")
    return {"order": order, "charged": cents}


@pytest.fixture(autouse=True)
def fresh_store() -> Any:
    effects.clear()
    previous = set_once_store(MemoryOnceStore())
    yield
    set_once_store(previous)


def attempt(index: int = 0, run: str = "run-1") -> SiblingInfo:
    return SiblingInfo(group=run, index=index, run_id=run)


async def test_the_memory_store_gives_a_call_to_one_attempt() -> None:
    store = MemoryOnceStore()
    assert await store.claim("r", "k", "a1") == (ONCE_RUN, None)
    assert await store.claim("r", "k", "a1") == (ONCE_RUN, None)  # the holder may ask again
    assert await store.claim("r", "k", "a2") == (ONCE_TAKEN, None)
    await store.settle("r", "k", '{"k": "ok", "v": 1}')
    assert await store.claim("r", "k", "a2") == (ONCE_DONE, '{"k": "ok", "v": 1}')
    store.forget("r")
    assert await store.claim("r", "k", "a3") == (ONCE_RUN, None)


async def test_a_second_attempt_gets_the_first_result_without_running_the_tool() -> None:
    once = at_most_once(charge)
    with sibling_scope(attempt()):
        first = await once.ainvoke({"order": "A", "cents": 5})
    with sibling_scope(attempt()):  # the sibling runs again (its worker died)
        again = await once.ainvoke({"order": "A", "cents": 5})
        other = await once.ainvoke({"order": "B", "cents": 5})  # a call it never made
    assert first == again == {"order": "A", "charged": 5}
    assert other == {"order": "B", "charged": 5}
    assert effects == ["A:5", "B:5"]


async def test_equal_calls_of_one_attempt_are_separate_calls_met_in_order() -> None:
    once = at_most_once(charge)
    with sibling_scope(attempt()):
        await once.ainvoke({"order": "A", "cents": 1})
        await once.ainvoke({"order": "A", "cents": 1})
    with sibling_scope(attempt()):
        await once.ainvoke({"order": "A", "cents": 1})  # replays the first
        await once.ainvoke({"order": "A", "cents": 1})  # replays the second
        await once.ainvoke({"order": "A", "cents": 1})  # a third: runs
    assert effects == ["A:1", "A:1", "A:1"]


async def test_a_call_whose_attempt_died_inside_it_is_refused_typed() -> None:
    started = asyncio.Event()

    @tool
    async def send(to: str) -> str:
        """Send an email."""
        effects.append(to)
        started.set()
        await asyncio.sleep(30)
        return "sent"

    once = at_most_once(send)
    with sibling_scope(attempt(index=7)):
        task = asyncio.ensure_future(once.ainvoke({"to": "x@example.com"}))
    await started.wait()
    task.cancel()  # the attempt dies inside the tool
    with pytest.raises(asyncio.CancelledError):
        await task
    with sibling_scope(attempt(index=7)), pytest.raises(ToolAlreadyRanError) as caught:
        await once.ainvoke({"to": "x@example.com"})
    assert (caught.value.tool, caught.value.index, caught.value.outcome) == ("send", 7, "unknown")
    assert "x@example.com" not in str(caught.value)  # arguments never reach the message
    assert effects == ["x@example.com"]


async def test_a_failed_call_is_not_retried_by_the_next_attempt() -> None:
    @tool
    async def flaky(n: int) -> str:
        """Fail."""
        effects.append(str(n))
        raise RuntimeError("boom")

    once = at_most_once(flaky)
    with sibling_scope(attempt()), pytest.raises(RuntimeError):
        await once.ainvoke({"n": 1})
    with sibling_scope(attempt()), pytest.raises(ToolAlreadyRanError) as caught:
        await once.ainvoke({"n": 1})
    assert caught.value.outcome == "failed"
    assert effects == ["1"]


async def test_a_result_that_json_cannot_keep_is_refused_on_replay() -> None:
    @tool
    async def opaque(n: int) -> Any:
        """Return an object."""
        effects.append(str(n))
        return {1, 2}

    once = at_most_once(opaque)
    with sibling_scope(attempt()):
        assert await once.ainvoke({"n": 1}) == {1, 2}
    with sibling_scope(attempt()), pytest.raises(ToolAlreadyRanError) as caught:
        await once.ainvoke({"n": 1})
    assert caught.value.outcome == "unreplayable"


async def test_siblings_runs_and_the_end_of_a_run_keep_calls_apart() -> None:
    once = at_most_once(charge)
    for info in (attempt(0), attempt(1), attempt(0, run="run-2")):
        with sibling_scope(info):
            await once.ainvoke({"order": "A", "cents": 1})
    assert len(effects) == 3
    forget_run("run-1")
    with sibling_scope(attempt(0)):
        await once.ainvoke({"order": "A", "cents": 1})
    assert len(effects) == 4


async def test_outside_a_sibling_the_tool_just_runs() -> None:
    once = at_most_once(charge)
    await once.ainvoke({"order": "A", "cents": 1})
    await once.ainvoke({"order": "A", "cents": 1})
    assert effects == ["A:1", "A:1"]


def test_the_marked_tool_keeps_its_name_description_and_arguments() -> None:
    once = at_most_once(charge)
    assert (once.name, once.description) == (charge.name, charge.description)
    assert once.args == charge.args
    assert (once.metadata or {}).get("lgb_at_most_once") is True


def test_tools_with_injected_arguments_or_no_tool_are_refused() -> None:
    @tool
    async def reply(text: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Reply."""
        return text

    with pytest.raises(TypeError, match="injected"):
        at_most_once(reply)
    with pytest.raises(TypeError, match="LangChain tool"):
        at_most_once(lambda: None)  # type: ignore[arg-type]


async def test_through_a_tool_node_a_rerun_sibling_gets_its_tool_message_back() -> None:
    def call(state: MessagesState) -> dict[str, Any]:
        tc = {"name": "charge", "args": {"order": "A", "cents": 3}, "id": "c1", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[tc])]}

    b = StateGraph(MessagesState)
    b.add_node("call", call)
    b.add_node("tools", BatchToolNode([at_most_once(charge)]))
    b.add_edge(START, "call")
    b.add_edge("call", "tools")
    b.add_edge("tools", END)
    graph = b.compile()
    outs = []
    for _ in range(2):
        with sibling_scope(attempt()):
            outs.append((await graph.ainvoke({"messages": []}))["messages"][-1].content)
    assert outs[0] == outs[1]
    assert effects == ["A:3"]
