"""Fakes shared by the tool tests: a scripted tool-calling chat model, a recording admission."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langgraph_batch._context import SiblingInfo

_IDS = itertools.count()


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, list[BaseMessage]]:
    """Graph input whose human message tells the scripted model which tools to call."""
    body = json.dumps([{"name": name, "args": args} for name, args in calls])
    return {"messages": [HumanMessage(body)]}


class ScriptedToolModel(BaseChatModel):
    """First turn: the tool calls listed (as JSON) in the human message, each with a
    fresh id; after tool results: a final answer joining their contents."""

    def _respond(self, messages: list[BaseMessage]) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            results = [m for m in messages if isinstance(m, ToolMessage)]
            text = "|".join(str(m.content) for m in results)
            message = AIMessage(content=f"final:{text}")
        else:
            human = next(m for m in messages if isinstance(m, HumanMessage))
            spec = json.loads(str(human.content))
            calls = [
                {
                    "name": c["name"],
                    "args": c["args"],
                    "id": f"call_{next(_IDS)}",
                    "type": "tool_call",
                }
                for c in spec
            ]
            message = AIMessage(content="", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._respond(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._respond(messages)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-model"


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
