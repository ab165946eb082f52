"""Research map-reduce: plan -> fan_out of research siblings -> synthesis.

    python examples/research.py --n 6                       # built-in emulator (EMULATED)
    python examples/research.py --n 16 --backend-url sglang://127.0.0.1:30000

The graph: `plan` (one structured LLM call: exactly n sub-questions) ->
`research` (`fan_out` of a hand-built ReAct sibling per sub-question: a model
node with a coalesced `search` tool behind `BatchToolNode`) -> `synthesize`
(one LLM call over every sibling's notes).

`search` is a simulated web search over a small built-in corpus, with network
latency; it is coalesced, so siblings issuing the same query share one call.
Sibling tasks carry a `key=<cluster>` tag (neighbouring sub-questions share a
cluster); the emulator derives its tool arguments from that tag, so under the
emulator siblings of one cluster issue identical searches.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition
from typing_extensions import TypedDict  # not typing's: see _common.py

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples import _common
from langgraph_batch.nodes.fan_out import SiblingError, fan_out
from langgraph_batch.tools import BatchToolNode, coalesce, reset_tool_stats, tool_stats

# ---------------------------------------------------------------------------------------
# The simulated search engine
# ---------------------------------------------------------------------------------------

_FACTS = (
    "Continuous batching lets an inference server add requests to a running batch each step.",
    "Prefix caching reuses the KV cache of a shared prompt prefix across requests.",
    "A KV cache that runs out forces the engine to preempt and later recompute requests.",
    "Decode steps are memory-bound: every step reads the weights and the batch's KV cache.",
    "Prefill is compute-bound: its cost grows with the number of prompt tokens.",
    "Agents spend wall-clock time in tools, during which their KV cache may be evicted.",
    "Priority scheduling can finish some agents sooner by serving their requests first.",
    "Identical tool calls from sibling agents can be executed once and shared.",
)


@tool
async def search(query: str) -> str:
    """Search the web; returns the three most relevant snippets."""
    await asyncio.sleep(0.1)  # a search API over the network, roughly
    words = {w.lower().strip(".,?") for w in query.split()}

    def score(fact: str) -> tuple[int, str]:
        overlap = len(words & {w.lower().strip(".,") for w in fact.split()})
        tiebreak = hashlib.sha256((query + fact).encode()).hexdigest()
        return (-overlap, tiebreak)

    return "\n".join(f"- {fact}" for fact in sorted(_FACTS, key=score)[:3])


SEARCH = coalesce(search)

# ---------------------------------------------------------------------------------------
# The sibling: a ReAct loop (model node + BatchToolNode)
# ---------------------------------------------------------------------------------------


class SiblingState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_researcher() -> CompiledStateGraph[Any, Any, Any, Any]:
    """One research sibling: model <-> tools until the model answers."""
    llm = _common.chat_model(max_tokens=384, temperature=0.0).bind_tools([SEARCH])

    async def model(state: SiblingState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(SiblingState)
    builder.add_node("model", model)
    builder.add_node("tools", BatchToolNode([SEARCH]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(name="researcher")


# ---------------------------------------------------------------------------------------
# The parent: plan -> research -> synthesize
# ---------------------------------------------------------------------------------------


class ResearchState(TypedDict, total=False):
    topic: str
    n: int
    """How many sub-questions (default 6)."""
    clusters: int
    """How many `key=` clusters the sub-questions fall in (default n // 2)."""
    questions: list[str]
    tasks: list[str]
    """One task text per sibling (the question plus its `key=` tag)."""
    notes: list[Any]
    report: str


def plan_schema(n: int) -> dict[str, Any]:
    """JSON schema of the plan: exactly `n` sub-questions."""
    return {
        "title": "ResearchPlan",
        "description": "Sub-questions that together answer the topic.",
        "type": "object",
        "properties": {
            "questions": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": n,
                "maxItems": n,
            }
        },
        "required": ["questions"],
    }


def sibling_task(question: str, index: int, clusters: int) -> str:
    """A research sibling's task (carries the `key=<cluster>` tag)."""
    return (
        f"Research this question and answer it in a short paragraph, citing what you found "
        f"with search: {question}\n(sub-question {index + 1}) key=cluster-{index % clusters}"
    )


def notes_of(final: dict[str, Any]) -> str:
    """A finished sibling's answer: its last message."""
    return str(final["messages"][-1].content)


def build_graph() -> CompiledStateGraph[Any, Any, Any, Any]:
    """The research graph, for the backend in `_common.settings()`."""
    llm = _common.chat_model(max_tokens=512, temperature=0.0)
    researcher = build_researcher()

    async def plan(state: ResearchState) -> dict[str, Any]:
        await _common.ensure_backend()
        n = int(state.get("n") or 6)
        topic = state.get("topic") or "How do LLM inference servers serve many agents at once?"
        planner = llm.with_structured_output(plan_schema(n), method="json_schema")
        answer = await planner.ainvoke(
            [
                SystemMessage("You plan research. Split the topic into independent questions."),
                HumanMessage(f"Topic: {topic}\nWrite exactly {n} sub-questions."),
            ]
        )
        questions = [str(q) for q in answer["questions"]][:n]
        if len(questions) != n:
            raise ValueError(f"the planner returned {len(questions)} sub-questions, not {n}")
        clusters = max(1, int(state.get("clusters") or n // 2))
        tasks = [sibling_task(q, i, clusters) for i, q in enumerate(questions)]
        return {"topic": topic, "questions": questions, "tasks": tasks}

    async def synthesize(state: ResearchState) -> dict[str, Any]:
        sections = []
        for i, (question, notes) in enumerate(zip(state["questions"], state["notes"], strict=True)):
            body = f"(research failed: {notes})" if isinstance(notes, SiblingError) else notes
            sections.append(f"{i + 1}. {question}\n{body}")
        answer = await llm.ainvoke(
            [
                SystemMessage("Write a concise report from the research notes."),
                HumanMessage(f"Topic: {state['topic']}\n\n" + "\n\n".join(sections)),
            ]
        )
        return {"report": str(answer.content)}

    builder = StateGraph(ResearchState)
    builder.add_node("plan", plan)
    builder.add_node(
        "research",
        fan_out(
            researcher,
            items="tasks",
            into="notes",
            scheduler=_common.SCHEDULER,
            make_input=lambda task, _i: {"messages": [HumanMessage(task)]},
            result=notes_of,
        ),
    )
    builder.add_node("synthesize", synthesize)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "research")
    builder.add_edge("research", "synthesize")
    builder.add_edge("synthesize", END)
    return builder.compile(name="research")


# For `langgraph dev` / Studio (langgraph.json); see examples/_common.py.
graph = build_graph()


async def amain(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=6, help="sub-questions (siblings)")
    parser.add_argument("--clusters", type=int, default=None, help="key clusters (default n//2)")
    parser.add_argument("--topic", default=None)
    _common.add_backend_args(parser)
    args = parser.parse_args(argv)
    await _common.start(args)

    app = build_graph()
    reset_tool_stats()
    inputs: ResearchState = {"n": args.n}
    if args.topic:
        inputs["topic"] = args.topic
    if args.clusters:
        inputs["clusters"] = args.clusters
    final, last_event = await _common.run_with_progress(app, inputs, quiet=args.quiet)

    failed = [n for n in final["notes"] if isinstance(n, SiblingError)]
    stats = tool_stats()
    print(f"topic: {final['topic']}")
    print(
        f"sub-questions: {len(final['questions'])} researched: {len(final['notes'])} "
        f"failed: {len(failed)}"
    )
    print(
        f"tool calls: requested {stats.requested} executed {stats.executed} shared {stats.shared}"
    )
    print("report:")
    print(final["report"])
    _common.print_llm_stats(last_event)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
