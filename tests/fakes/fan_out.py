"""Fakes and graphs for fan_out tests: a fake queue and admission, small subgraphs,
and `parent_graph`, the one-node parent graph every fan_out test runs.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langgraph_batch._context import SiblingInfo, current_sibling
from tests.fakes.chat_models import ScriptedToolModel


class FakeQueue:
    """Stands in for the scheduler: counts LLM requests waiting, can block them all."""

    def __init__(self) -> None:
        self.waiting = 0
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.all_waiting = asyncio.Event()
        self.expect_waiting: int | None = None
        self.seen: list[dict[str, Any]] = []

    async def submit(self) -> None:
        self.calls += 1
        sib = current_sibling()
        conf = get_config().get("configurable", {})
        self.seen.append(
            {
                "sibling": None if sib is None else (sib.group, sib.index, sib.total, sib.turn),
                "cfg_index": conf.get("lgb_sibling_index"),
                "cfg_group": conf.get("lgb_sibling_group"),
            }
        )
        if self.gate is None:
            return
        self.waiting += 1
        try:
            if self.expect_waiting is not None and self.waiting >= self.expect_waiting:
                self.all_waiting.set()
            await self.gate.wait()
        finally:
            self.waiting -= 1


class NumState(TypedDict, total=False):
    x: int
    y: int
    trace: Annotated[list[Any], operator.add]


def number_graph(fail_on: set[int] | None = None) -> Any:
    """A two-node subgraph: y = x * 10 + 1, recording the sibling it saw."""
    fail_on = fail_on or set()

    async def times_ten(state: NumState, config: RunnableConfig) -> dict[str, Any]:
        if state["x"] in fail_on:
            raise ValueError(f"bad x {state['x']}")
        sib = current_sibling()
        conf = config.get("configurable", {})
        return {
            "y": state["x"] * 10,
            "trace": [
                {
                    "index": None if sib is None else sib.index,
                    "group": None if sib is None else sib.group,
                    "total": None if sib is None else sib.total,
                    "cfg_index": conf.get("lgb_sibling_index"),
                }
            ],
        }

    def plus_one(state: NumState) -> dict[str, Any]:
        sib = current_sibling()  # sync node: runs in a thread with the copied context
        return {"y": state["y"] + 1, "trace": [{"sync_index": None if sib is None else sib.index}]}

    b = StateGraph(NumState)
    b.add_node("times_ten", times_ten)
    b.add_node("plus_one", plus_one)
    b.add_edge(START, "times_ten")
    b.add_edge("times_ten", "plus_one")
    return b.compile(name="numbers")


def react_graph(tool_node: Any, model: BaseChatModel | None = None) -> Any:
    """agent -> tools -> agent loop built by hand around `tool_node`."""
    llm = model or ScriptedToolModel()

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile()


class RecordingAdmission:
    """Admission fake: records every release/acquire in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, bool | None]] = []

    async def acquire(self, sibling: SiblingInfo, *, returning: bool) -> None:
        self.events.append(("acquire", sibling.index, returning))

    def release(self, sibling: SiblingInfo) -> None:
        self.events.append(("release", sibling.index, None))

    def context_changed(self, sibling: SiblingInfo) -> None:
        pass


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def tool_call_ids(result: dict[str, Any]) -> list[str]:
    return [
        str(c["id"]) for m in result["messages"] if isinstance(m, AIMessage) for c in m.tool_calls
    ]


class Parent(TypedDict, total=False):
    """The parent state of most fan_out tests: items in `xs` (or `jobs`), results in `out`."""

    xs: list[Any]
    jobs: list[Any]
    out: list[Any]


def parent_graph(
    node: Any, state: Any = Parent, *, checkpointer: Any = None, name: str = "fan"
) -> Any:
    """The parent graph of a fan_out test: START -> `node` (named `name`) -> END.

    `state` is the parent's state schema (by default `Parent`); `checkpointer`
    compiles it with one, for resume tests.
    """
    builder = StateGraph(state)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    return builder.compile(checkpointer=checkpointer)
