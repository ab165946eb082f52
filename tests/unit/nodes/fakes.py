"""Fake chat models and helpers for fan_out unit tests (no network)."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.graph import START, StateGraph

from langgraph_batch._context import current_sibling


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


class ScriptedChatModel(BaseChatModel):
    """Agent-like fake: asks for `lookup(key=<last user text>)` once, then answers.

    A user message containing "boom" makes the model raise.
    """

    queue: Any = None
    tool_turns: int = 1

    @property
    def _llm_type(self) -> str:
        return "scripted-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("async only")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.queue is not None:
            await self.queue.submit()
        sib = current_sibling()
        if sib is not None:
            sib.turn += 1
        user = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        text = str(user.content)
        if "boom" in text:
            raise ValueError(f"model exploded on {text!r}")
        tool_results = [m for m in messages if isinstance(m, ToolMessage)]
        if len(tool_results) < self.tool_turns:
            msg = AIMessage(
                content="",
                tool_calls=[
                    {"name": "lookup", "args": {"key": text}, "id": f"call_{len(tool_results)}"}
                ],
            )
        else:
            msg = AIMessage(
                content=f"answer({text}):" + ",".join(str(t.content) for t in tool_results)
            )
        return ChatResult(generations=[ChatGeneration(message=msg)])


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
