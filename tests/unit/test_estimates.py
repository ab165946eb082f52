"""The one module of token and KV estimates, and every estimator reading it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from langgraph_batch import _estimates
from langgraph_batch._estimates import (
    CHARS_PER_TOKEN,
    CONTEXT_TOKENS_PRIOR,
    GENEROUS_BYTES_PER_TOKEN,
    KV_HEADROOM,
    TEMPLATE_TOKENS,
    generous_tokens,
    kv_budget,
    requests_fitting,
    typical_tokens,
)
from langgraph_batch.backends._batching import estimated_tokens
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.chat_model import _tokens
from langgraph_batch.nodes import SiblingAdmission, fan_out
from langgraph_batch.record._format import LLMCall, shared_prefix
from langgraph_batch.scheduler import BatchPolicy, KVLedger
from tests._parse import parse_source

PACKAGE = Path(_estimates.__file__).resolve().parent


def test_the_values_and_their_order() -> None:
    assert (CHARS_PER_TOKEN, GENEROUS_BYTES_PER_TOKEN, TEMPLATE_TOKENS) == (4, 3, 8)
    assert GENEROUS_BYTES_PER_TOKEN < CHARS_PER_TOKEN  # the generous one is never lower
    assert (CONTEXT_TOKENS_PRIOR, KV_HEADROOM) == (4096, 0.85)


@pytest.mark.parametrize("chars", [0, 1, 3, 4, 5, 399, 400, 401])
@pytest.mark.parametrize("messages", [0, 1, 5])
def test_estimates_round_up_and_the_generous_one_is_never_lower(chars: int, messages: int) -> None:
    typical = typical_tokens(chars, messages=messages)
    assert typical == -(-chars // 4) + 8 * messages
    assert generous_tokens(chars, messages=messages) == -(-chars // 3) + 8 * messages
    assert generous_tokens(chars, messages=messages) >= typical
    if chars:
        assert typical_tokens(chars) >= 1  # a non-empty text is at least one token


def test_the_kv_sizing_rules() -> None:
    assert requests_fitting(440_000, CONTEXT_TOKENS_PRIOR) == 107
    assert kv_budget(440_000, KV_HEADROOM) == 374_000
    assert kv_budget(1, 0.5) == 1  # never an empty budget


def test_the_template_allowance_is_the_emulators_chatml() -> None:
    # The emulator renders the ChatML its models' servers do: what one, two
    # and three messages add beyond their text is about 8 each.
    from langgraph_batch.emulator.tokenizer import tokenize, tokenize_chat

    text = "hello there friend"
    for n in (1, 2, 3):
        msgs = [{"role": ("user", "assistant")[i % 2], "content": text} for i in range(n)]
        template = len(tokenize_chat(msgs)) - n * len(tokenize(text))
        assert abs(template - TEMPLATE_TOKENS * n) <= 2 * n, (n, template)


def test_every_token_estimator_reads_it() -> None:
    # get_num_tokens's fallback
    assert _tokens.estimate({"prompt": "x" * 10}) == typical_tokens(10)
    payload = {"messages": [{"content": "z" * 40}, {"content": "y"}]}
    text = '["' + "z" * 40 + '", "y"]'
    assert _tokens.estimate(payload) == typical_tokens(len(text), messages=2)
    # the batch length pre-filter: generous, plus the answer's budget
    chat = ChatRequest(
        model="m", messages=[{"role": "user", "content": "é" * 10}], params={"max_tokens": 7}
    )
    assert estimated_tokens(chat) == generous_tokens(20, messages=1) + 7
    # a recording's shared prefix without usage
    call = LLMCall(sibling=0, turn=0, start_s=0, end_s=1, prompt_tokens=None, cached_tokens=None,
                   output_tokens=5, messages=2, prefix_messages=0, first_messages=2,
                   new=(("system", "h", 301), ("user", "u", 100)), tool_calls=())  # fmt: skip
    assert shared_prefix([call])["tokens"] == typical_tokens(301)


def test_both_kv_sizing_models_start_from_the_one_prior() -> None:
    # The scheduler's starting limit ...
    assert BatchPolicy().kv_tokens_per_request == CONTEXT_TOKENS_PRIOR
    # ... and fan_out's bookings (its option, and the gate built without it).
    graph = _Graph()
    spec = fan_out(graph, items="xs", into="out").spec
    assert (spec.sibling_tokens, spec.kv_headroom) == (CONTEXT_TOKENS_PRIOR, KV_HEADROOM)
    gate = SiblingAdmission(kv_ledger=KVLedger(100_000))
    assert gate.sibling_estimate == CONTEXT_TOKENS_PRIOR
    assert gate.kv_budget == kv_budget(100_000, KV_HEADROOM)
    assert KVLedger(100_000).budget(0.5) == kv_budget(100_000, 0.5)


def test_no_other_module_defines_an_estimate_constant() -> None:
    # One owner: a module-level name for a token ratio, the context prior or the
    # KV headroom is defined in `_estimates` only (others import it or alias it).
    markers = ("PER_TOKEN", "TOKENS_PRIOR", "HEADROOM", "TEMPLATE_TOKENS", "MESSAGE_TOKENS")
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_estimates.py":
            continue
        for node in parse_source(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if not isinstance(target, ast.Name) or not any(m in target.id for m in markers):
                    continue
                if isinstance(node.value, ast.Constant):  # a literal, not an alias
                    found.append(f"{path.relative_to(PACKAGE)}: {target.id}")
    assert found == []


class _Graph:
    name = "g"

    async def ainvoke(self, value: object, config: object = None) -> object:
        return value
