"""fan_out(prices=..., cost_into=...): every model call of every sibling is counted and priced.

The usage comes from LangChain's `usage_metadata` (here Anthropic-shaped: cache
reads and 5-minute / 1-hour writes in `input_token_details`), priced by the
rules of https://docs.claude.com/en/docs/about-claude/pricing.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from typing_extensions import TypedDict

from langgraph_batch import fan_out
from langgraph_batch.pricing import PriceTable, Pricing

M = 1_000_000


class _CachingModel(BaseChatModel):
    """Answers with Anthropic-style usage: 1M prompt tokens, split by cache traffic."""

    @property
    def _llm_type(self) -> str:
        return "fake-caching"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        answer = AIMessage(
            "ok",
            usage_metadata={
                "input_tokens": 4 * M,
                "output_tokens": M,
                "total_tokens": 5 * M,
                "input_token_details": {
                    "cache_read": M,
                    "cache_creation": 2 * M,
                    "ephemeral_5m_input_tokens": M,
                    "ephemeral_1h_input_tokens": M,
                },
            },
            response_metadata={"model_name": "claude-test-20250101"},
        )
        return ChatResult(generations=[ChatGeneration(message=answer)])


class _Parent(TypedDict, total=False):
    items: list[str]
    out: list[Any]
    cost: dict[str, Any]


def _parent(prices: PriceTable | None) -> Any:
    model = _CachingModel()

    async def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    sub = StateGraph(MessagesState)
    sub.add_node("call", call)
    sub.add_edge(START, "call")
    sub.add_edge("call", END)
    builder = StateGraph(_Parent)
    builder.add_node(
        "fan",
        fan_out(
            sub.compile(),
            items="items",
            into="out",
            make_input=lambda text, i: {"messages": [("user", text)]},
            prices=prices,
            cost_into="cost",
        ),
    )
    builder.add_edge(START, "fan")
    builder.add_edge("fan", END)
    return builder.compile()


async def test_cost_into_prices_cache_reads_and_writes_as_anthropic_does() -> None:
    table = PriceTable({"claude-test": Pricing.anthropic(input=2.0, output=10.0)})
    graph = _parent(table)
    events = []
    final: dict[str, Any] = {}
    async for mode, chunk in graph.astream(
        {"items": ["a", "b", "c"]}, stream_mode=["custom", "values"]
    ):
        if mode == "custom":
            events.append(chunk)
        else:
            final = chunk
    # Per call: 1M uncached x 2 + 1M read x 0.2 + 1M 5m-write x 2.5 + 1M 1h-write x 4
    # + 1M output x 10 = 18.7 dollars; three siblings.
    assert final["cost"]["cost"]["total"] == pytest.approx(3 * 18.7)
    assert final["cost"]["usage"]["cache_write_1h"] == 3 * M
    assert final["cost"]["unpriced_models"] == []
    done = [e for e in events if e["event"] == "done"][-1]
    assert done["cost"] == final["cost"]
    finished = [e["cost"]["cost"]["total"] for e in events if e["event"] == "sibling_finished"]
    assert finished == sorted(finished)
    assert finished[-1] == pytest.approx(3 * 18.7)


async def test_without_prices_cost_into_counts_tokens_only() -> None:
    final = await _parent(None).ainvoke({"items": ["a"]})
    assert final["cost"]["cost"] is None
    assert final["cost"]["usage"]["input_tokens"] == 4 * M


async def test_a_model_missing_from_the_table_is_named() -> None:
    table = PriceTable({"gpt-x": Pricing(input=1, output=1), "gpt-y": Pricing(input=1, output=1)})
    final = await _parent(table).ainvoke({"items": ["a"]})
    assert final["cost"]["unpriced_models"] == ["claude-test-20250101"]
    assert final["cost"]["cost"]["total"] == 0


def test_cost_options_are_checked() -> None:
    with pytest.raises(TypeError, match="PriceTable"):
        fan_out(_CachingModel(), items="x", into="y", prices={"m": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost_into"):
        fan_out(_CachingModel(), items="x", into="y", cost_into="y")


def test_the_progress_bar_shows_the_run_cost() -> None:
    import io

    from langgraph_batch._observe.progress import ProgressBar, fan_out_event

    out = io.StringIO()
    bar = ProgressBar(stream=out, tty=False, width=4, min_interval=0)
    cost = {"usage": {}, "cost": {"total": 1.23456}, "unpriced_models": []}
    bar.update(fan_out_event("done", node="n", group="g", done=1, failed=0, total=1, cost=cost))
    assert "n [####] 1/1, $1.2346, done" in out.getvalue()


async def test_cache_writes_survive_batched_chat_model_over_langchain_backend() -> None:
    from langgraph_batch import BatchedChatModel
    from langgraph_batch.backends import LangChainBackend

    llm = BatchedChatModel(model="claude-test", backend=LangChainBackend(_CachingModel()))
    answer = await llm.ainvoke("hi")
    assert answer.usage_metadata is not None
    details = answer.usage_metadata.get("input_token_details") or {}
    assert details.get("cache_read") == M
    assert details.get("cache_creation") == 2 * M
    assert details.get("ephemeral_1h_input_tokens") == M
    assert details.get("ephemeral_5m_input_tokens") == M
    table = PriceTable({"claude-test": Pricing.anthropic(input=2.0, output=10.0)})
    from langgraph_batch.pricing import TokenUsage

    assert table.cost("claude-test", TokenUsage.from_metadata(answer.usage_metadata)).total == (
        pytest.approx(18.7)
    )
