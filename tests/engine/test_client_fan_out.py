"""fan_out against the real engine: coalesced tools, results in order, one failure isolated.

Each sibling is a two-step agent: a forced call of the coalesced `lookup`
tool (its only argument an enum of one value, so every sibling's call is the
same call), then a short answer. One sibling's prompt does not fit the
engine's context window: vLLM refuses it (HTTP 400), and only that sibling
fails, as a `SiblingError` in its place.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel, BatchToolNode, coalesce, fan_out
from langgraph_batch.nodes import SiblingError
from tests.engine._client import vllm_url


class Sib(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    item: str


class Parent(TypedDict, total=False):
    items: list[str]
    results: Annotated[list[Any], operator.add]


def build(server: VLLMCPUServer) -> tuple[Any, Counter[str]]:
    executions: Counter[str] = Counter()

    @tool
    async def lookup(topic: Literal["kv"]) -> str:
        """Look the topic up in the docs."""
        executions[topic] += 1
        return f"docs about {topic}"

    shared = coalesce(lookup)
    llm = BatchedChatModel(
        model=server.model, base_url=vllm_url(server), max_tokens=200, temperature=1.0
    )
    caller = llm.bind_tools([shared], tool_choice="lookup")
    answer = llm.bind(max_tokens=4, extra_body={"ignore_eos": True})

    async def agent(state: Sib) -> Sib:
        done = any(isinstance(m, ToolMessage) for m in state["messages"])
        model = answer if done else caller
        return {"messages": [await model.ainvoke(state["messages"], seed=3)]}

    def route(state: Sib) -> str:
        return "tools" if state["messages"][-1].tool_calls else END  # type: ignore[union-attr]

    sib = StateGraph(Sib)
    sib.add_node("agent", agent)
    sib.add_node("tools", BatchToolNode([shared]))
    sib.add_edge(START, "agent")
    sib.add_conditional_edges("agent", route, ["tools", END])
    sib.add_edge("tools", "agent")

    def make_input(item: str, i: int) -> Sib:
        text = "x " * 40000 if item == "too-long" else f"Explain {item}."
        return {"messages": [HumanMessage(text)], "item": item}

    def result(state: Sib) -> dict[str, Any]:
        tools = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        return {
            "item": state["item"],
            "tool": [t.content for t in tools],
            "n": len(state["messages"]),
        }

    parent = StateGraph(Parent)
    parent.add_node(
        "fan",
        fan_out(sib.compile(), items="items", into="results", make_input=make_input, result=result),
    )
    parent.add_edge(START, "fan")
    return parent.compile(), executions


async def test_coalesced_tools_ordered_results_and_an_isolated_failure(
    engine: VLLMCPUServer,
) -> None:
    graph, executions = build(engine)
    items = [f"topic {i}" for i in range(6)]
    items[3] = "too-long"
    results = (await graph.ainvoke({"items": items}))["results"]
    assert len(results) == len(items)
    failed = results[3]
    assert isinstance(failed, SiblingError)
    assert (failed.index, failed.item, failed.error_type) == (
        3,
        "too-long",
        "ContextLengthExceededError",
    )
    assert "x x x" not in failed.message  # no prompt content in the error
    for i, res in enumerate(results):
        if i == 3:
            continue
        # In input order; each sibling called the tool once and answered.
        assert res == {"item": items[i], "tool": ["docs about kv"], "n": 4}
    # Five identical calls from five siblings: the tool ran once.
    assert executions == Counter({"kv": 1})
