"""`ignore_eos`, `max_tokens` and `min_tokens` on the emulated model's outputs (as vLLM)."""

from __future__ import annotations

import json

import pytest

from langgraph_batch.emulator.scenarios import (
    ScenarioOptions,
    fit_length,
    plan_chat,
    value_for_schema,
)
from langgraph_batch.emulator.tokenizer import count_tokens, split_pieces

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "web_search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["summary", "confidence"],
}
AGENT = ScenarioOptions(scenario="agent", output_tokens=64, turns=2)
USER = [{"role": "user", "content": "Task 3: look up key=k3 and report."}]
AFTER_TOOL = [
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"query": "k3"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "result"},
]


def _tool_turn() -> object:
    return plan_chat(USER, tools=TOOLS, tool_choice="auto", response_format=None, options=AGENT)


def _answer(response_format: object = None) -> object:
    return plan_chat(
        AFTER_TOOL, tools=TOOLS, tool_choice="auto", response_format=response_format, options=AGENT
    )


def test_ignore_eos_makes_a_free_text_answer_exactly_max_tokens() -> None:
    plan = _answer()
    assert plan.num_tokens == 64  # the scenario's own length, before the fix the only one
    out = fit_length(plan, max_tokens=200, ignore_eos=True)
    assert out.num_tokens == 200
    assert out.hidden_tokens == 0
    assert count_tokens(out.text) == 200 == len(out.pieces)
    assert out.text.startswith(plan.text)
    assert out.finish_reason == "length"


def test_ignore_eos_pads_a_tool_call_with_hidden_eos_and_keeps_it_valid() -> None:
    plan = _tool_turn()
    assert plan.tool_calls
    out = fit_length(plan, max_tokens=200, ignore_eos=True)
    assert out.num_tokens == 200
    assert out.text == plan.text  # the end-of-sequence tokens are not in the text
    assert out.hidden_tokens == 200 - len(plan.pieces)
    assert json.loads(out.tool_calls[0].arguments) == {"query": "k3"}
    assert out.finish_reason == "tool_calls"


def test_ignore_eos_keeps_schema_json_valid() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    plan = _answer(rf)
    out = fit_length(plan, max_tokens=300, ignore_eos=True)
    assert out.num_tokens == 300
    assert set(json.loads(out.content or "")) == {"summary", "confidence"}
    assert out.finish_reason == "length"


def test_without_ignore_eos_the_output_ends_where_the_model_stops() -> None:
    plan = _answer()
    assert fit_length(plan, max_tokens=200) is plan
    cut = fit_length(plan, max_tokens=10)
    assert cut.num_tokens == 10
    assert cut.finish_reason == "length"


def test_max_tokens_still_cuts_under_ignore_eos() -> None:
    plan = _answer()
    out = fit_length(plan, max_tokens=5, ignore_eos=True)
    assert out.num_tokens == 5
    assert out.text == "".join(split_pieces(plan.text)[:5])


def test_min_tokens_extends_but_keeps_the_natural_finish() -> None:
    plan = _answer()
    out = fit_length(plan, max_tokens=500, min_tokens=100)
    assert out.num_tokens == 100
    assert out.finish_reason == "stop"
    assert fit_length(plan, max_tokens=500, min_tokens=10) is plan


def test_extension_is_deterministic() -> None:
    plan = _answer()
    a = fit_length(plan, max_tokens=150, ignore_eos=True, seed=1)
    b = fit_length(plan, max_tokens=150, ignore_eos=True, seed=1)
    assert a.text == b.text


@pytest.mark.parametrize("key", ["k3", "k7"])
def test_an_enum_that_lists_the_task_key_picks_it(key: str) -> None:
    import random

    schema = {"type": "string", "enum": ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"]}
    assert value_for_schema(schema, key=key, rng=random.Random(0)) == key
    # a key the enum does not list: some member, deterministically
    value = value_for_schema(schema, key="zz", rng=random.Random(0))
    assert value in schema["enum"]


def test_ignore_eos_answer_of_exactly_max_tokens_finishes_by_length() -> None:
    # vLLM under ignore_eos stops only at max_tokens, so the finish reason is
    # `length` even when the model's natural answer had exactly that length.
    plan = _answer()
    assert plan.finish_reason == "stop"
    out = fit_length(plan, max_tokens=plan.num_tokens, ignore_eos=True)
    assert out.num_tokens == plan.num_tokens
    assert out.finish_reason == "length"
    assert fit_length(plan, max_tokens=plan.num_tokens).finish_reason == "stop"
