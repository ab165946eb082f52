"""The sibling agent every LangGraph contender runs: a ReAct-style subgraph.

`model -> (tools -> model)* -> finish`, the way the LangGraph docs teach it:
the model node calls a chat model with the tools bound, `tools_condition`
routes tool calls to a tool node, and `finish` records the sibling's answer.
The contenders differ only in the chat model, the tool node and how the
siblings are fanned out, so the comparison is of those parts alone.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypedDict

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition
from pydantic import BaseModel, Field, create_model

from benchmarks.contenders._common import RECORDER


class AgentState(TypedDict, total=False):
    """State of one sibling."""

    messages: Annotated[list[AnyMessage], add_messages]
    index: int
    answer: str


class ParentState(TypedDict, total=False):
    """State of the parent map-reduce graph."""

    tasks: list[dict[str, Any]]
    results: Annotated[list[dict[str, Any]], operator.add]


def initial_messages(job: dict[str, Any], index: int) -> list[AnyMessage]:
    """System prompt (shared) plus the sibling's task."""
    return [SystemMessage(job["system_prompt"]), HumanMessage(job["tasks"][index])]


def make_http_client() -> httpx.AsyncClient:
    """One client for all tool calls of the run (the tool service caps concurrency)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(300.0),
        limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512),
    )


def make_tools(job: dict[str, Any], client: httpx.AsyncClient) -> list[BaseTool]:
    """LangChain tools that call the benchmark's tool service over HTTP."""
    tools: list[BaseTool] = []
    for spec in job["tools"]:
        name: str = spec["name"]
        arg: str = spec["arg"]
        url = f"{job['tool_url']}/tools/{name}"
        schema: type[BaseModel] = create_model(
            f"{name}_args", **{arg: (str, Field(description=spec.get("arg_description", arg)))}
        )

        def _factory(url: str = url) -> Callable[..., Any]:
            async def call(**kwargs: Any) -> str:
                resp = await client.post(url, json={"args": kwargs})
                resp.raise_for_status()
                result: str = resp.json()["result"]
                return result

            return call

        tools.append(
            StructuredTool.from_function(
                coroutine=_factory(),
                name=name,
                description=spec["description"],
                args_schema=schema,
            )
        )
    return tools


def answer_text(msg: AIMessage) -> str:
    """The final answer as text (structured output parsed or raw)."""
    parsed = msg.additional_kwargs.get("parsed")
    if parsed is not None:
        return json.dumps(parsed if isinstance(parsed, dict) else str(parsed))
    content = msg.content
    return content if isinstance(content, str) else json.dumps(content)


def build_agent(llm: Any, tool_node: Any, *, name: str = "agent") -> Any:
    """Compile the sibling subgraph around a tool-bound chat model and a tool node."""

    async def model(state: AgentState) -> dict[str, Any]:
        RECORDER.event(state["index"], "llm_start")
        msg = await llm.ainvoke(state["messages"])
        RECORDER.event(state["index"], "llm_end")
        RECORDER.llm_calls += 1
        RECORDER.tool_calls_requested += len(getattr(msg, "tool_calls", None) or [])
        return {"messages": [msg]}

    def finish(state: AgentState) -> dict[str, Any]:
        last = state["messages"][-1]
        text = answer_text(last) if isinstance(last, AIMessage) else str(last.content)
        RECORDER.done(state["index"], text)
        return {"answer": text}

    def route(state: AgentState) -> str:
        return "tools" if tools_condition(state) == "tools" else "finish"

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", tool_node)
    g.add_node("finish", finish)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", "finish"])
    g.add_edge("tools", "model")
    g.add_edge("finish", END)
    return g.compile(name=name)


def bind(llm: BaseChatModel, tools: Sequence[BaseTool], job: dict[str, Any]) -> Any:
    """Bind the tools (and the final answer's JSON schema, as a user would)."""
    schema = job.get("response_schema")
    if not tools:
        if schema:
            return llm.bind(response_format=_response_format(schema))
        return llm
    if schema:
        return llm.bind_tools(list(tools), response_format=_response_format(schema), strict=True)
    return llm.bind_tools(list(tools))


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.get("title", "Answer"), "schema": schema, "strict": True},
    }
