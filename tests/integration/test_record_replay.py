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
from langchain_core.messages import AnyMessage, HumanMessage, RemoveMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.prebuilt import tools_condition

from langgraph_batch import BatchedChatModel, BatchToolNode, coalesce, fan_out
from langgraph_batch.bench.replay import plan as replay_plan
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
    # 1.0-1.8 s: a starved 2-core CI box delays a wait by ~0.1 s (a 0.3-0.6 s tool once
    # replayed at 1.24x its recorded wait); at this length that stays a few percent.
    await asyncio.sleep(1.0 + (sum(map(ord, query)) % 5) * 0.2)
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
        sys.executable, "-m", "benchmarks.bench", "--replay", str(path),
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
    assert fid["cached_tokens"] == pytest.approx(1.0, abs=0.05), fid
    # Tool waits are tools only on both sides (admission holds apart, `hold_mean_s`); a
    # sibling that joins another's coalesced call waits what is left of it, which depends
    # on sub-second model timings (0.999-1.026 in 12 runs, 3 at once beside 2 CPU hogs): 10%.
    assert fid["tool_wait_mean_s"] == pytest.approx(1.0, abs=0.10), fid
    assert lgb["hold_mean_s"] is not None
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


class _ResettingAgent(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    reset: bool


def build_resetting_job(url: str) -> tuple[Any, BatchedChatModel, list[str]]:
    """Siblings that start 0.4 s apart; the odd ones reset their context at their third call.

    Each sibling's first node waits its start; the model node of an odd sibling,
    after its second tool result, replaces the conversation with the system
    prompt, its task and a summary (what a compacting agent does): the summary
    asks for one more tool call (`turns=2`: none yet in the new context), then
    the answer. Every sibling asks its own questions (no coalescing), so each
    tool wait is its tool's latency and the replay's can be compared call for call.
    """
    rng = random.Random(1)
    system = SystemMessage(
        "You are a research agent. Use web_search, then answer."
        + "".join(" " + rng.choice(WORDS) for _ in range(500))
    )
    llm = BatchedChatModel(  # type: ignore[call-arg]
        model="emulated-llama-3-8b", base_url=url.replace("http://", "vllm://"), max_tokens=300
    )
    tools = [web_search]
    bound = llm.bind_tools(tools)

    async def begin(state: _ResettingAgent) -> dict[str, Any]:
        task = str(state["messages"][1].content)
        await asyncio.sleep(0.4 * int(task.split(":", 1)[0].split()[-1]))
        return {}

    async def model(state: _ResettingAgent) -> dict[str, Any]:
        messages = list(state["messages"])
        task = str(messages[1].content)
        update: list[Any] = []
        results = sum(1 for m in messages if m.type == "tool")
        if "reset" in task and results == 2 and not state.get("reset"):
            index = task.split(":", 1)[0].split()[-1]
            summary = HumanMessage(
                f"Summary so far: key=r{index} turns=2 think=5-40, then answer."
                + "".join(" " + rng.choice(WORDS) for _ in range(60))
            )
            messages = [*messages[:2], summary]
            update = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages]
        reply = await bound.ainvoke(messages)
        return {"messages": [*update, reply], "reset": bool(update) or state.get("reset", False)}

    g = StateGraph(_ResettingAgent)
    g.add_node("begin", begin)
    g.add_node("model", model)
    g.add_node("tools", BatchToolNode(tools))
    g.add_edge(START, "begin")
    g.add_edge("begin", "model")
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
        f"Task {i}: look up key=q{i} turns=3 think=5-40{' reset' if i % 2 else ''} and report."
        + "".join(" " + rng.choice(WORDS) for _ in range(80 + 20 * i))
        for i in range(4)
    ]
    return parent.compile(), llm, items


@pytest.mark.timeout(170)
async def test_resets_and_start_offsets_replay_within_two_percent(
    start_emulator: Callable[..., str], tmp_path: Path
) -> None:
    url = await asyncio.to_thread(start_emulator, time_scale=1.0)
    graph, llm, items = build_resetting_job(url)
    path = tmp_path / "job.jsonl"
    async with Recorder(path) as rec:
        out = await graph.ainvoke({"items": items}, config={"callbacks": [rec]})
    await llm.get_scheduler().aclose()
    assert len(out["results"]) == 4
    recording = await asyncio.to_thread(read_recording, path)
    # 4 siblings of 3 calls, the 2 resetting ones 4 (a tool call after the reset).
    assert len(recording.calls) == 14
    rp = replay_plan(recording)
    resets = [(s.index, k) for s in rp.siblings for k, t in enumerate(s.turns) if t.kept_tokens]
    assert resets == [(1, 2), (3, 2)], resets
    assert all(t.kept_estimated for s in rp.siblings for t in s.turns if t.kept_tokens)
    offsets = [s.start_s for s in rp.siblings]
    assert offsets == sorted(offsets), offsets
    assert offsets[3] > 1.0, offsets  # 0.4 s apart

    cmd = [
        sys.executable, "-m", "langgraph_batch.cli", "bench", "--replay", str(path),
        "--contenders", "naive,langgraph-batch", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=150, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(await asyncio.to_thread((tmp_path / "out" / "replay.json").read_text))
    assert result["params"]["resets"] == 2
    assert result["params"]["start"] == "recorded"
    # Tolerances: the token counts are reproduced exactly on the emulator (1.0 measured);
    # cached tokens differ by the kept prefix's estimate (a few tokens, inside one 16-token
    # block: 0.9975 measured); a replayed tool call is an HTTP request to the tool service
    # sleeping the recorded latency, where the recorded one ran in-process: 5-35 ms more
    # on 1.0-1.8 s tools (langgraph-batch 1.005-1.006 in 9 runs, 3 at once beside 2 CPU
    # hogs; naive 1.015-1.052), so 5%. The naive client's tool spans also hold its own
    # event-loop stalls while its first requests open connections (+0.1 to +0.5 s on a
    # first tool call, measured): only a floor is asserted there.
    for name in ("naive", "langgraph-batch"):
        entry = result["contenders"][name]
        fid = entry["fidelity"]
        sys.stderr.write(f"resets and offsets, {name} / recorded: {fid}\n")
        assert entry["failures"] == 0, entry["errors"]
        assert fid["llm_requests"] == 1.0
        assert fid["tool_calls_requested"] == 1.0
        for key in ("prompt_tokens", "generation_tokens"):
            assert fid[key] == pytest.approx(1.0, abs=0.01), (name, key, fid)
        assert fid["cached_tokens"] == pytest.approx(1.0, abs=0.02), (name, fid)
        assert fid["tool_wait_mean_s"] >= 0.98, (name, fid)
        # Each sibling's first model call comes no earlier than its recorded offset.
        for sid, events in entry["timeline"].items():
            first = min(t for t, what in events if what == "llm_start")
            assert first >= offsets[int(sid)] - 0.05, (name, sid, first, offsets)
    lgb = result["contenders"]["langgraph-batch"]
    assert lgb["fidelity"]["tool_wait_mean_s"] == pytest.approx(1.0, abs=0.05), lgb["fidelity"]
