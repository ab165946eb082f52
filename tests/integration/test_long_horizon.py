"""Long-horizon agents against a real emulator whose KV cache cannot hold every context.

Twelve agents of eight turns each read ~800-token tool results into their
conversations: at the end each holds ~8k tokens of its own, ~100k together,
against a 48k-token cache. Plain LangGraph (`Send` + `ChatOpenAI`, no
admission) lets the engine evict and preempt; `fan_out` books each sibling's
context through its tool waits, pauses siblings when the contexts outgrow the
cache, and resumes them: no preemption, and the prefill the server computes
stays near the minimum (each context token computed once).

The faults of this regime end at the sibling they belong to: a server
restart mid-run (every context lost), a sibling whose context alone outgrows
the cache, a tool that never returns (LangGraph's node timeout); after each,
the server's KV ledger is empty again.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition
from langgraph.types import Send

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import ContextLengthExceededError
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.tools import BatchToolNode

pytestmark = pytest.mark.timeout(120)

MODEL = "emulated-llama-3-8b"
N = 12
TURNS = 8
KV_TOKENS = 48_000
SYSTEM = "You are a careful agent; read, then answer. " + " ".join(["rule"] * 1000)
WORDS = ("data", "row", "file", "line", "test", "pass", "fail", "log")


def task(i: int, turns: int = TURNS, extra: int = 0) -> str:
    return f"Task {i} key=t{i} turns={turns} think=20-60: fix it." + " note" * extra


@tool
async def read(query: str) -> str:
    """Read a file; returns ~800 tokens."""
    return f"{query}:" + "".join(f" {WORDS[(len(query) + k) % len(WORDS)]}" for k in range(800))


@tool
async def stuck(query: str) -> str:
    """A tool whose backend never answers."""
    # A future of the running loop that nothing resolves (a module-level Event would
    # bind to the first test's loop, and another test's loop would get a RuntimeError).
    await asyncio.get_running_loop().create_future()
    return "never"


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def agent_graph(llm: Any, tools: list[Any], *, tool_timeout: float | None = None) -> Any:
    bound = llm.bind_tools(tools)

    async def model(state: AgentState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", BatchToolNode(tools), timeout=tool_timeout)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile()


class Parent(TypedDict, total=False):
    tasks: list[str]
    results: list[Any]
    events: Annotated[list[Any], operator.add]


def stuck_first(llm: Any, *, tool_timeout: float) -> Any:
    """The agent graph, but sibling 0 (`Task 0 ...`) calls a tool that never returns."""
    stuck_agent = agent_graph(llm, [stuck], tool_timeout=tool_timeout)
    normal_agent = agent_graph(llm, [read])

    async def route(state: AgentState) -> dict[str, Any]:
        first = str(state["messages"][1].content)
        agent = stuck_agent if first.startswith("Task 0 ") else normal_agent
        return dict(await agent.ainvoke(state))

    g = StateGraph(AgentState)
    g.add_node("route", route)
    g.add_edge(START, "route")
    return g.compile()


def fan_out_graph(agent: Any) -> Any:
    g = StateGraph(Parent)
    g.add_node(
        "agents",
        fan_out(
            agent,
            items="tasks",
            into="results",
            make_input=lambda t, i: {"messages": [SystemMessage(SYSTEM), HumanMessage(t)]},
            result=lambda final: final["messages"],
        ),
    )
    g.add_edge(START, "agents")
    return g.compile()


def send_graph(agent: Any) -> Any:
    async def one(state: dict[str, Any]) -> dict[str, Any]:
        final = await agent.ainvoke(
            {"messages": [SystemMessage(SYSTEM), HumanMessage(state["task"])]}
        )
        return {"events": [final["messages"]]}

    g = StateGraph(Parent)
    g.add_node("one", one)  # type: ignore[type-var]
    g.add_conditional_edges(START, lambda s: [Send("one", {"task": t}) for t in s["tasks"]])
    g.add_edge("one", END)
    return g.compile()


def stats(url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(url + "/emulator/stats", timeout=10).json()
    return data


def minimum_prefill(conversations: list[list[Any]]) -> int:
    """Each context token computed once: the shared prompt, then every sibling's own part."""
    shared = 0
    own = 0
    for messages in conversations:
        calls = [m for m in messages if isinstance(m, AIMessage) and m.usage_metadata]
        first, last = calls[0].usage_metadata, calls[-1].usage_metadata
        assert first is not None
        assert last is not None
        cached = (first.get("input_token_details") or {}).get("cache_read") or 0
        shared = max(shared, cached)
        own += last["input_tokens"] + last["output_tokens"] - cached
    return shared + own


def answered(messages: list[Any], i: int) -> bool:
    last = messages[-1]
    return isinstance(last, AIMessage) and f"Final answer for t{i}" in str(last.content)


async def test_a_long_horizon_run_stays_within_the_cache_with_no_preemption(
    start_emulator: Callable[..., str],
) -> None:
    urls = await asyncio.gather(
        *(asyncio.to_thread(start_emulator, kv_tokens=KV_TOKENS) for _ in range(2))
    )
    tasks = [task(i) for i in range(N)]
    # Plain LangGraph: every agent at once, the engine alone decides what to evict.
    plain = await asyncio.to_thread(  # its first construction reads package files
        lambda: ChatOpenAI(model=MODEL, base_url=urls[0] + "/v1", api_key="x", max_retries=2)  # type: ignore[arg-type]
    )
    out = await send_graph(agent_graph(plain, [read])).ainvoke({"tasks": tasks})
    assert all(answered(m, int(str(m[1].content).split()[1])) for m in out["events"])
    naive = await asyncio.to_thread(stats, urls[0])
    # langgraph-batch: the same agents in a fan_out.
    llm = BatchedChatModel(model=MODEL, base_url=urls[1].replace("http", "vllm", 1))
    events: list[dict[str, Any]] = []
    graph = fan_out_graph(agent_graph(llm, [read]))
    final: dict[str, Any] = {}
    async for mode, data in graph.astream({"tasks": tasks}, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(data)
        else:
            final = data
    lgb = await asyncio.to_thread(stats, urls[1])
    assert all(answered(m, i) for i, m in enumerate(final["results"]))
    assert lgb["preemptions"] == 0
    done = next(e for e in events if e["event"] == "done")
    assert done["pauses"] > 0  # the contexts did outgrow the cache: the policy acted
    minimum = minimum_prefill(final["results"])
    # Pausing costs some recompute (a paused sibling's context may be evicted before it
    # resumes); on this tiny cache, 1.2-1.5x the minimum over runs.
    assert lgb["prefill_tokens_computed"] <= 1.6 * minimum, (lgb, minimum)
    # The pressure was real: left to the engine, the same job recomputed far more.
    assert naive["prefill_tokens_computed"] > 2.0 * minimum, (naive, minimum)
    assert naive["prefill_tokens_computed"] > 1.4 * lgb["prefill_tokens_computed"], (naive, lgb)
    ledger = await llm.get_scheduler().kv_ledger()
    assert ledger is not None
    assert ledger.resident_tokens() == 0
    assert ledger.members == 0
    await llm.get_scheduler().aclose()


async def test_faults_end_at_their_sibling_and_the_ledger_empties(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(start_emulator, kv_tokens=KV_TOKENS)
    llm = BatchedChatModel(model=MODEL, base_url=url.replace("http", "vllm", 1), max_retries=3)
    # Sibling 0 waits on a tool that never returns (the tools node's timeout ends it);
    # sibling 1's task alone is larger than the whole cache; the rest are ordinary.
    tasks = [task(0, turns=3), task(1, extra=KV_TOKENS), *(task(i) for i in range(2, N))]
    out = await fan_out_graph(stuck_first(llm, tool_timeout=2.0)).ainvoke({"tasks": tasks})
    results = out["results"]
    assert isinstance(results[0], SiblingError)
    assert results[0].error_type == "NodeTimeoutError"
    assert isinstance(results[1], SiblingError)
    assert results[1].error_type == ContextLengthExceededError.__name__
    assert all(answered(results[i], i) for i in range(2, N))
    ledger = await llm.get_scheduler().kv_ledger()
    assert ledger is not None
    assert ledger.resident_tokens() == 0
    assert ledger.members == 0
    await llm.get_scheduler().aclose()
