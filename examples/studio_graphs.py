"""Graphs for LangGraph Studio (`langgraph dev`), registered in the repo's langgraph.json.

TEMPORARY: a trivial Send fan-out that proves the Studio harness until
`langgraph_batch.nodes.fan_out` lands.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send


class SiblingState(TypedDict):
    topic: str
    answer: str


class ParentState(TypedDict, total=False):
    topics: list[str]
    results: Annotated[list[str], operator.add]


async def _answer(state: SiblingState) -> dict[str, Any]:
    get_stream_writer()({"event": "sibling_finished", "topic": state["topic"]})
    return {"answer": state["topic"].upper()}


_sib = StateGraph(SiblingState)
_sib.add_node("answer", _answer)
_sib.add_edge(START, "answer")
_sib.add_edge("answer", END)
sibling = _sib.compile(name="sibling")


async def _run_sibling(state: SiblingState) -> dict[str, Any]:
    out = await sibling.ainvoke(state)
    return {"results": [out["answer"]]}


def _spread(state: ParentState) -> list[Send]:
    return [Send("work", {"topic": t, "answer": ""}) for t in state.get("topics", [])]


_par = StateGraph(ParentState)
_par.add_node("work", _run_sibling)
_par.add_conditional_edges(START, _spread, ["work"])
_par.add_edge("work", END)
fan_out_demo = _par.compile(name="fan_out_demo")
