"""A minimal fan-out for LangGraph Studio: one single-call sibling per topic.

Registered in the repository's `langgraph.json` as `fan_out_demo`, next to the
`code_review` and `research` examples. Input: `{"topics": [...]}` or
`{"n": 20}`; output: `results` (one `{topic, answer}` per topic, in input
order, or a `SiblingError` record) and `summary`.

Like every example graph it talks to `LGB_BACKEND_URL` when set, else to the
built-in emulator, started on first use (see examples/_common.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from typing_extensions import TypedDict  # not typing's: see _common.py

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples import _common
from langgraph_batch.nodes.fan_out import SiblingError, fan_out


class AnswerState(TypedDict, total=False):
    topic: str
    answer: str


class DemoState(TypedDict, total=False):
    topics: list[str]
    n: int
    results: list[Any]
    summary: dict[str, int]


def build_answerer() -> CompiledStateGraph[Any, Any, Any, Any]:
    """The sibling: one LLM call that answers one topic."""
    llm = _common.chat_model(max_tokens=64, temperature=0.0)

    async def answer(state: AnswerState) -> dict[str, Any]:
        prompt = f"In two sentences, what matters most about {state['topic']}? key={state['topic']}"
        reply = await llm.ainvoke([HumanMessage(prompt)])
        return {"answer": str(reply.content)}

    builder = StateGraph(AnswerState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(name="answerer")


def build_graph() -> CompiledStateGraph[Any, Any, Any, Any]:
    """prepare -> fan_out(answerer) -> summarize."""

    async def prepare(state: DemoState) -> dict[str, Any]:
        await _common.ensure_backend()
        topics = state.get("topics") or [f"topic-{i}" for i in range(int(state.get("n") or 20))]
        return {"topics": topics}

    def summarize(state: DemoState) -> dict[str, Any]:
        failed = sum(isinstance(r, SiblingError) for r in state["results"])
        return {"summary": {"total": len(state["results"]), "failed": failed}}

    builder = StateGraph(DemoState)
    builder.add_node("prepare", prepare)
    builder.add_node(
        "fan_out",
        fan_out(
            build_answerer(),
            items="topics",
            into="results",
            scheduler=_common.SCHEDULER,
            make_input=lambda topic, _i: {"topic": topic},
            result=lambda final: {"topic": final["topic"], "answer": final["answer"]},
        ),
    )
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "fan_out")
    builder.add_edge("fan_out", "summarize")
    builder.add_edge("summarize", END)
    return builder.compile(name="fan_out_demo")


fan_out_demo = build_graph()

answerer = build_answerer()
"""The sibling graph alone: what `langgraph-batch worker ... examples.studio_graphs:answerer`
runs for a distributed fan_out (deploy/compose.yml, profile `distributed`)."""
