"""`get_num_tokens*` ask the emulator's `/tokenize`: the counts are the ones a call costs."""

from __future__ import annotations

import asyncio
import logging

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages
from langchain_core.tools import tool

from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.chat_model import BatchedChatModel, _tokens
from langgraph_batch.emulator.tokenizer import count_tokens

MODEL = "emulated-llama-3-8b"


@tool
def lookup(city: str) -> str:
    """Look up the weather in a city."""
    return "sunny"


def _model(url: str) -> BatchedChatModel:
    return BatchedChatModel(
        model=MODEL, base_url=url, max_tokens=8, extra_body={"emulator": {"output_tokens": 4}}
    )


async def test_message_counts_match_the_prompt_tokens_of_a_call(emulator_url: str) -> None:
    llm = _model(emulator_url)
    messages = [SystemMessage("You review code."), HumanMessage("Is this loop correct? for i in x")]
    counted = await llm.aget_num_tokens_from_messages(messages)
    answer = await llm.ainvoke(messages)
    assert answer.usage_metadata is not None
    assert counted == answer.usage_metadata["input_tokens"] > 0
    # With tools: the template renders them into the prompt too.
    with_tools = await llm.aget_num_tokens_from_messages(messages, tools=[lookup])
    called = await llm.bind_tools([lookup]).ainvoke(messages)
    assert called.usage_metadata is not None
    assert with_tools == called.usage_metadata["input_tokens"] > counted


async def test_text_counts_cached_and_sync(
    emulator_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = OpenAICompatibleBackend.count_tokens

    async def spy(self: OpenAICompatibleBackend, model: str, **kw: object) -> int:
        calls.append(str(kw.get("prompt")))
        return await real(self, model, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(OpenAICompatibleBackend, "count_tokens", spy)
    llm = _model(emulator_url)
    text = "the quick brown fox jumps over the lazy dog, twice: the quick brown fox"
    assert await llm.aget_num_tokens(text) == count_tokens(text)
    # The sync method from a thread (as a sync graph calls it), served from the cache.
    assert await asyncio.to_thread(llm.get_num_tokens, text) == count_tokens(text)
    assert calls == [text]
    # trim_messages with the model as its token counter.
    history = [HumanMessage(f"message number {i} " * 20) for i in range(10)]
    per_message = await asyncio.to_thread(llm.get_num_tokens_from_messages, history[:1])
    kept = await asyncio.to_thread(
        trim_messages, history, max_tokens=3 * per_message, token_counter=llm, strategy="last"
    )
    assert 1 <= len(kept) < len(history)
    assert kept[-1] is history[-1]


async def test_a_server_that_cannot_count_gives_an_estimate_once_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing listens on port 9: the count falls back, says so once, caches nothing.
    llm = BatchedChatModel(model="m", base_url="vllm://127.0.0.1:9", timeout=2.0)
    with caplog.at_level(logging.WARNING, logger="langgraph_batch.chat_model"):
        first = await llm.aget_num_tokens("x" * 40)
        again = await llm.aget_num_tokens("y" * 80)
        messages = await llm.aget_num_tokens_from_messages([AIMessage("z" * 40)])
    assert (first, again) == (10, 20)
    assert messages == _tokens.estimate({"messages": [{"content": "z" * 40}]})
    warnings = [r for r in caplog.records if "get_num_tokens" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "BackendConnectionError" in warnings[0].getMessage()
    assert "127.0.0.1:9" not in warnings[0].getMessage()
    assert _tokens.cached(llm.scheduler_key, "m", {"prompt": "x" * 40}) is None
