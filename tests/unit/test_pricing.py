"""Pricing rules, checked against the providers' published rules.

- Anthropic, https://docs.claude.com/en/docs/about-claude/pricing: 5-minute cache
  writes 1.25x the base input price, 1-hour writes 2x, cache reads 0.1x; the
  Message Batches API 50% of standard prices, stacking with caching.
- OpenAI, https://platform.openai.com/docs/pricing: cached input at its own listed
  price; https://platform.openai.com/docs/guides/batch: the Batch API costs 50% less.

The prices below are made up (round numbers): only the rules are the providers'.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from langgraph_batch.pricing import (
    Cost,
    CostCallback,
    CostMeter,
    PriceTable,
    Pricing,
    TokenUsage,
    usage_of_message,
)

M = 1_000_000


def test_anthropic_rules_derive_cache_prices_from_the_base_input_price() -> None:
    p = Pricing.anthropic(input=4.0, output=20.0)
    assert p.cache_write_5m == pytest.approx(5.0)  # 1.25x
    assert p.cache_write_1h == pytest.approx(8.0)  # 2x
    assert p.cache_read == pytest.approx(0.4)  # 0.1x
    assert p.batch_discount == 0.5


def test_anthropic_cost_prices_each_kind_of_input_token_apart() -> None:
    p = Pricing.anthropic(input=4.0, output=20.0)
    usage = TokenUsage(
        input_tokens=4 * M, output_tokens=M, cache_read=M, cache_write_5m=M, cache_write_1h=M
    )
    cost = p.cost(usage)
    assert cost.input == pytest.approx(4.0)  # 1M uncached
    assert cost.cache_read == pytest.approx(0.4)
    assert cost.cache_write == pytest.approx(5.0 + 8.0)
    assert cost.output == pytest.approx(20.0)
    # Batches halve everything, cache traffic included (the discounts stack).
    assert p.cost(usage, batch=True).total == pytest.approx(cost.total / 2)


def test_openai_cached_input_at_its_listed_price_and_writes_at_the_input_price() -> None:
    p = Pricing.openai(input=2.0, output=8.0, cached_input=0.5)
    usage = TokenUsage(input_tokens=3 * M, output_tokens=M, cache_read=2 * M)
    cost = p.cost(usage)
    assert (cost.input, cost.cache_read, cost.output) == pytest.approx((2.0, 1.0, 8.0))
    assert p.cost(usage, batch=True).total == pytest.approx(5.5)
    # No cached price: a cache read costs the input price.
    plain = Pricing.openai(input=2.0, output=8.0, cached_input=None)
    assert plain.cost(usage).total == pytest.approx(6.0 + 8.0)


def test_batch_is_exactly_the_discount_of_the_same_usage() -> None:
    p = Pricing(input=1.7, output=9.1, cache_read=0.2, batch_discount=0.5)
    usage = TokenUsage(input_tokens=123_457, output_tokens=9_876, cache_read=100_000)
    assert p.cost(usage, batch=True).total == pytest.approx(0.5 * p.cost(usage).total, rel=1e-12)
    with pytest.raises(ValueError, match="no batch discount"):
        Pricing(input=1, output=1).cost(usage, batch=True)


@pytest.mark.parametrize(
    ("field", "value"), [("input", -1.0), ("cache_read", -0.1), ("batch_discount", 1.0)]
)
def test_bad_prices_fail_at_construction(field: str, value: float) -> None:
    kwargs = {"input": 1.0, "output": 1.0, field: value}
    with pytest.raises(ValueError, match=field):
        Pricing(**kwargs)  # type: ignore[arg-type]


def test_usage_from_langchain_metadata_splits_cache_writes_by_ttl() -> None:
    usage = TokenUsage.from_metadata(
        {
            "input_tokens": 1000,
            "output_tokens": 10,
            "total_tokens": 1010,
            "input_token_details": {
                "cache_read": 600,
                "cache_creation": 300,
                "ephemeral_1h_input_tokens": 100,
            },
        }
    )
    assert (usage.cache_read, usage.cache_write_5m, usage.cache_write_1h) == (600, 200, 100)
    assert usage.uncached_input == 100


def test_usage_from_the_providers_raw_usage() -> None:
    openai = TokenUsage.from_openai(
        {
            "prompt_tokens": 50,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 32},
        }
    )
    assert (openai.input_tokens, openai.cache_read, openai.uncached_input) == (50, 32, 18)
    # Anthropic's input_tokens excludes the cache traffic.
    anthropic = TokenUsage.from_anthropic(
        {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 30,
            "cache_creation_input_tokens": 20,
            "cache_creation": {"ephemeral_5m_input_tokens": 15, "ephemeral_1h_input_tokens": 5},
        }
    )
    assert anthropic.input_tokens == 60
    assert (anthropic.cache_write_5m, anthropic.cache_write_1h) == (15, 5)


def test_table_finds_models_by_name_then_longest_prefix(tmp_path: Path) -> None:
    table = PriceTable(
        {
            "claude-sonnet": Pricing.anthropic(input=3.0, output=15.0),
            "claude-sonnet-4-5": Pricing.anthropic(input=2.0, output=10.0),
        }
    )
    assert table.find("claude-sonnet-4-5-20250929") is table["claude-sonnet-4-5"]
    assert table.find("gpt-4.1") is None
    with pytest.raises(KeyError, match="no price"):
        table.cost("gpt-4.1", TokenUsage())
    # A one-model table prices every call.
    assert PriceTable({"x": Pricing(input=1, output=1)}).find(None) is not None


def test_table_loads_json_and_toml_with_rules(tmp_path: Path) -> None:
    data = {
        "models": {
            "a": {"rules": "anthropic", "input": 3, "output": 15},
            "o": {"rules": "openai", "input": 2, "output": 8, "cached_input": 0.5},
            "raw": {"input": 1, "output": 2},
        }
    }
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(data))
    table = PriceTable.load(path)
    assert table["a"] == Pricing.anthropic(input=3, output=15)
    assert table["o"].cache_read == 0.5
    assert table["raw"].batch_discount == 0
    toml = tmp_path / "prices.toml"
    toml.write_text('[models.m]\nrules = "openai"\ninput = 2\noutput = 8\ncached_input = 0.5\n')
    assert PriceTable.load(toml)["m"] == table["o"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"models": {"m": {"rules": "azure", "input": 1, "output": 1}}}')
    with pytest.raises(ValueError, match="unknown pricing rules"):
        PriceTable.load(bad)
    bad.write_text('{"models": {"m": {"input": 1, "outputs": 1}}}')
    with pytest.raises(ValueError, match="bad pricing entry"):
        PriceTable.load(bad)


def test_meter_adds_calls_by_model_and_batch() -> None:
    table = PriceTable({"m": Pricing.openai(input=2.0, output=8.0, cached_input=0.5)})
    meter = CostMeter(prices=table)
    answer = AIMessage(
        "x",
        usage_metadata={
            "input_tokens": M,
            "output_tokens": M,
            "total_tokens": 2 * M,
            "input_token_details": {"cache_read": M // 2},
        },
        response_metadata={"model_name": "m"},
    )
    CostCallback(meter).on_llm_end(LLMResult(generations=[[ChatGeneration(message=answer)]]))
    meter.add_message(answer, batch=True)
    summary = meter.summary()
    assert summary["usage"]["input_tokens"] == 2 * M
    sync = 1.0 + 0.25 + 8.0
    assert summary["cost"]["total"] == pytest.approx(sync * 1.5)
    assert summary["unpriced_models"] == []
    assert usage_of_message(AIMessage("no usage")) is None
    assert CostMeter().summary()["cost"] is None


def test_cost_adds_up() -> None:
    total = Cost(input=1, output=2) + Cost(cache_read=0.5, cache_write=0.25)
    assert total.total == 3.75
    assert total.to_dict()["total"] == 3.75
