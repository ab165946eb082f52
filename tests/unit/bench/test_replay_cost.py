"""`bench --replay --price`: the three costs of a replayed job, from the user's prices.

Rules: Anthropic's (https://docs.claude.com/en/docs/about-claude/pricing: reads 0.1x,
5-minute writes 1.25x, batches 50% off) and OpenAI's
(https://platform.openai.com/docs/guides/batch: 50% off).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from langgraph_batch.bench.replay_cost import cost_markdown, replay_costs
from langgraph_batch.pricing import PriceTable, Pricing

M = 1_000_000


def _result(*, llm_requests: int = 10, tools: int = 0) -> dict[str, Any]:
    return {
        "params": {"n": 10, "shared_prefix_tokens": M // 10, "recording_header": {}},
        "recorded": {
            "siblings": 10,
            "llm_requests": llm_requests,
            "tool_calls_requested": tools,
            "prompt_tokens": 2 * M,
            "cached_tokens": None,
            "generation_tokens": M // 10,
        },
        "contenders": {
            "naive": {"prompt_tokens": 2 * M, "cached_tokens": 0, "generation_tokens": M // 10},
            "langgraph-batch": {
                "prompt_tokens": 2 * M,
                "cached_tokens": M,
                "generation_tokens": M // 10,
            },
        },
    }


def test_three_costs_of_a_single_turn_job_under_anthropic_rules() -> None:
    table = PriceTable({"m": Pricing.anthropic(input=3.0, output=15.0)})
    cost = replay_costs(_result(), table)
    rows = cost["rows"]
    assert cost["single_turn"] is True
    assert rows["naive"]["usd"] == pytest.approx(6.0 + 1.5)
    # 1M read at 0.3, 0.1M written at 3.75, 0.9M uncached at 3, output 1.5.
    assert rows["batched with caching"]["usd"] == pytest.approx(0.3 + 0.375 + 2.7 + 1.5)
    assert rows["provider batch API"]["usd"] == pytest.approx(0.5 * rows["naive"]["usd"])
    assert rows["provider batch API"]["vs_naive"] == pytest.approx(0.5)
    text = "\n".join(cost_markdown(cost))
    assert "| provider batch API | 3.750000 | 0.500x | naive |" in text


def test_no_batch_api_for_tools_or_several_turns_or_no_discount() -> None:
    table = PriceTable({"m": Pricing.openai(input=2.0, output=8.0, cached_input=0.5)})
    assert replay_costs(_result(tools=3), table)["rows"]["provider batch API"]["usd"] is None
    multi = replay_costs(_result(llm_requests=20), table)["rows"]["provider batch API"]
    assert "single-turn" in multi["why_not"]
    plain = PriceTable({"m": Pricing(input=1.0, output=1.0)})
    row = replay_costs(_result(), plain)["rows"]["provider batch API"]
    assert row["why_not"] == "the model has no batch discount"
    assert "n/a" in "\n".join(cost_markdown(replay_costs(_result(), plain)))


def test_missing_contenders_fall_back_to_the_recording() -> None:
    result = _result()
    result["contenders"] = {"naive": {"error": "boom"}}
    cost = replay_costs(result, PriceTable({"m": Pricing(input=1.0, output=1.0)}))
    assert cost["rows"]["naive"]["from"] == "recorded"
    assert cost["rows"]["batched with caching"]["from"] == "recorded"


def test_the_model_must_be_in_the_table() -> None:
    table = PriceTable({"a": Pricing(input=1, output=1), "b": Pricing(input=1, output=1)})
    with pytest.raises(ValueError, match="--price-model"):
        replay_costs(_result(), table)
    assert replay_costs(_result(), table, model="a")["model"] == "a"


def test_cli_price_misuse(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from langgraph_batch.bench.cli import main

    assert main(["W7", "--price", "p.json"]) == 2
    assert "--price and --price-model apply to --replay only" in capsys.readouterr().err
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"models": {"m": {"rules": "azure", "input": 1, "output": 1}}}))
    assert main(["--replay", str(tmp_path / "job.jsonl"), "--price", str(bad)]) == 2
    assert "unknown pricing rules" in capsys.readouterr().err
