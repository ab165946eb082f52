"""A fan_out run's cost on the emulator: BatchedChatModel's usage (cached tokens included).

OpenAI-style prices (cached input at its own listed price,
https://platform.openai.com/docs/pricing): the siblings share a long
instruction, so all but the first read it from the emulated engine's prefix
cache, and the run's cost is the sum of every answer's usage priced so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch import BatchedChatModel, fan_out
from langgraph_batch.pricing import PriceTable, Pricing, TokenUsage
from langgraph_batch.record import FORMAT

MODEL = "emulated-llama-3-8b"
ROOT = Path(__file__).resolve().parents[2]
INSTRUCTION = "Summarise the ticket in one JSON object with fields a, b and c. " * 30


class _State(TypedDict, total=False):
    tickets: list[str]
    answers: list[Any]
    cost: dict[str, Any]


async def test_fan_out_cost_is_every_answer_priced_with_its_cache_hits(emulator_url: str) -> None:
    table = PriceTable({MODEL: Pricing.openai(input=2.0, output=8.0, cached_input=0.5)})
    llm = BatchedChatModel(model=MODEL, base_url=emulator_url, max_tokens=32)
    builder = StateGraph(_State)
    builder.add_node(
        "summarise",
        fan_out(
            llm,
            items="tickets",
            into="answers",
            make_input=lambda t, i: [("system", INSTRUCTION), ("user", t)],
            prices=table,
            cost_into="cost",
        ),
    )
    builder.add_edge(START, "summarise")
    builder.add_edge("summarise", END)
    graph = builder.compile()
    tickets = [f"ticket {i}: the printer on floor {i} is jammed" for i in range(16)]
    events: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    async for mode, chunk in graph.astream({"tickets": tickets}, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(chunk)
        else:
            final = chunk
    answers = final["answers"]
    usages = [TokenUsage.from_metadata(a.usage_metadata) for a in answers]
    expected = sum((table.cost(MODEL, u) for u in usages[1:]), table.cost(MODEL, usages[0]))
    summary = final["cost"]
    assert summary["cost"]["total"] == pytest.approx(expected.total, rel=1e-12)
    assert summary["usage"]["cache_read"] == sum(u.cache_read for u in usages) > 0
    # Cache hits make the run cheaper than the same tokens uncached.
    uncached = sum(u.input_tokens for u in usages) * 2.0 / 1e6
    assert summary["cost"]["input"] + summary["cost"]["cache_read"] < uncached
    done = next(e for e in events if e["event"] == "done")
    assert done["cost"] == summary


def _w7_recording(path: Path, n: int) -> None:
    """A W7-shaped job: one call per sibling, no tools, a shared instruction."""
    rows: list[dict[str, Any]] = [
        {"type": "header", "format": FORMAT, "version": 1, "model": "example-model"}
    ]
    rows += [
        {
            "type": "llm",
            "sibling": i,
            "turn": 0,
            "start_s": 0.0,
            "end_s": 1.0,
            "prompt_tokens": 2500,
            "cached_tokens": None,
            "output_tokens": 150,
            "messages": 2,
            "prefix_messages": 0,
            "first_messages": 2,
            "new": [["system", "instr", 4000], ["user", f"doc{i}", 6000]],
            "tools": None,
            "tools_chars": 0,
            "tool_calls": [],
            "finish_reason": "stop",
            "error": None,
        }
        for i in range(n)
    ]
    rows.append(
        {"type": "summary", "shared_prefix": {"messages": 1, "chars": 4000, "tokens": 1000}}
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.timeout(170)
def test_bench_replay_price_prints_the_three_costs(tmp_path: Path) -> None:
    job, prices = tmp_path / "job.jsonl", tmp_path / "prices.json"
    _w7_recording(job, 16)
    # Example prices only (the rules are Anthropic's: reads 0.1x, writes 1.25x, batch 0.5x).
    table = {"models": {"example-model": {"rules": "anthropic", "input": 3.0, "output": 15.0}}}
    prices.write_text(json.dumps(table))
    cmd = [
        sys.executable, "-m", "langgraph_batch.cli", "bench", "--replay", str(job),
        "--price", str(prices), "--contenders", "naive,langgraph-batch",
        "--time-scale", "20", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| provider batch API |" in proc.stdout
    result = json.loads((tmp_path / "out" / "replay.json").read_text())
    rows = result["cost"]["rows"]
    naive = rows["naive"]["usd"]
    # 16 x (2500 x 3 + 150 x 15) / 1e6 dollars, every prompt token uncached.
    assert naive == pytest.approx(16 * (2500 * 3.0 + 150 * 15.0) / 1e6)
    assert rows["provider batch API"]["usd"] == pytest.approx(0.5 * naive)
    assert rows["batched with caching"]["usd"] < naive
