"""A fan_out run's cost on the emulator: BatchedChatModel's usage (cached tokens included).

OpenAI-style prices (cached input at its own listed price,
https://platform.openai.com/docs/pricing): the siblings share a long
instruction, so all but the first read it from the emulated engine's prefix
cache, and the run's cost is the sum of every answer's usage priced so.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch import BatchedChatModel, fan_out
from langgraph_batch.pricing import PriceTable, Pricing, TokenUsage

MODEL = "emulated-llama-3-8b"
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
