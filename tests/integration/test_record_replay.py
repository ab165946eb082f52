"""Record a fan_out run on the emulator, replay it with `bench --replay`, compare.

The recorded job is a user's graph: `fan_out` over a ReAct subgraph with
`BatchedChatModel` and a coalesced tool whose latency depends on its query;
siblings share a system prompt, ask overlapping questions (coalesced) and
make 1 or 2 tool calls with some reasoning text before each. The replay
must reproduce its token counts, cache hits and tool waits within a few
percent (the langgraph-batch contender is the recorded client).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition

from langgraph_batch import BatchedChatModel, BatchToolNode, coalesce, fan_out
from langgraph_batch.record import Recorder, read_recording

ROOT = Path(__file__).resolve().parents[2]
WORDS = [
    "data",
    "kv",
    "gpu",
    "page",
    "hit",
    "miss",
    "node",
    "edge",
    "tool",
    "call",
    "turn",
    "plan",
    "task",
    "goal",
    "step",
]


@tool
async def web_search(query: str) -> str:
    """Search the web for the query."""
    await asyncio.sleep(0.3 + (sum(map(ord, query)) % 5) * 0.08)
    return f"results for {query}:" + " alpha beta gamma" * (40 + len(query) * 5)


class _Agent(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


class _Parent(TypedDict, total=False):
    items: list[str]
    results: list[Any]


def build_job(url: str) -> tuple[Any, BatchedChatModel, list[str], SystemMessage]:
    rng = random.Random(0)
    system = SystemMessage(
        "You are a research agent. Use web_search, then answer."
        + "".join(" " + rng.choice(WORDS) for _ in range(600))
    )
    llm = BatchedChatModel(  # type: ignore[call-arg]
        model="emulated-llama-3-8b", base_url=url.replace("http://", "vllm://"), max_tokens=300
    )
    tools = [coalesce(web_search)]
    bound = llm.bind_tools(tools)

    async def model(state: _Agent) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    g = StateGraph(_Agent)
    g.add_node("model", model)
    g.add_node("tools", BatchToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, ["tools", END])
    g.add_edge("tools", "model")
    parent = StateGraph(_Parent)
    parent.add_node(
        "agents",
        fan_out(
            g.compile(),
            items="items",
            into="results",
            make_input=lambda item, i: {"messages": [system, HumanMessage(item)]},
        ),
    )
    parent.add_edge(START, "agents")
    parent.add_edge("agents", END)
    items = [
        f"Task {i}: look up key=k{i % 3} turns={3 - i % 2} think=5-40 and report."
        + "".join(" " + rng.choice(WORDS) for _ in range(100 + 20 * i))
        for i in range(6)
    ]
    return parent.compile(), llm, items, system


@pytest.mark.timeout(170)
async def test_a_recorded_fan_out_run_replays_within_a_few_percent(
    start_emulator: Callable[..., str], tmp_path: Path
) -> None:
    url = await asyncio.to_thread(start_emulator, time_scale=1.0)
    graph, llm, items, _ = build_job(url)
    path = tmp_path / "job.jsonl"
    async with Recorder(path) as rec:
        out = await graph.ainvoke({"items": items}, config={"callbacks": [rec]})
    await llm.get_scheduler().aclose()
    assert len(out["results"]) == 6
    recording = await asyncio.to_thread(read_recording, path)
    assert len(recording.siblings()) == 6
    assert len(recording.calls) == 15  # 3 siblings of 3 turns, 3 of 2
    assert 0 < len(recording.tools) < 9  # coalesced: fewer runs than the 9 calls

    cmd = [
        sys.executable, "-m", "langgraph_batch.cli", "bench", "--replay", str(path),
        "--contenders", "naive,langgraph-batch,ideal", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=150, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = await asyncio.to_thread((tmp_path / "out" / "replay.json").read_text)
    result = json.loads(text)
    rec = result["recorded"]
    assert (rec["siblings"], rec["llm_requests"], rec["tool_calls_requested"]) == (6, 15, 9)
    lgb = result["contenders"]["langgraph-batch"]
    fid = lgb["fidelity"]
    sys.stderr.write(f"replay fidelity (langgraph-batch / recorded): {fid}\n")
    assert lgb["failures"] == 0, lgb["errors"]
    assert fid["llm_requests"] == 1.0
    assert fid["tool_calls_requested"] == 1.0
    for key in ("prompt_tokens", "generation_tokens"):
        assert fid[key] == pytest.approx(1.0, abs=0.01), (key, fid)
    for key in ("cached_tokens", "tool_wait_mean_s"):
        assert fid[key] == pytest.approx(1.0, abs=0.05), (key, fid)
    assert fid["makespan_s"] == pytest.approx(1.0, abs=0.25)
    naive = result["contenders"]["naive"]
    assert naive["failures"] == 0, naive["errors"]
    assert naive["fidelity"]["prompt_tokens"] == pytest.approx(1.0, abs=0.01)
    assert naive["tool_calls_executed"] == 9  # no coalescing: every call runs
    assert lgb["tool_calls_executed"] < 9
    assert result["contenders"]["ideal"]["makespan_s"] > 0
    md = await asyncio.to_thread((tmp_path / "out" / "replay.md").read_text)
    assert "| recorded |" in md
    assert "Replayed / recorded" in md
