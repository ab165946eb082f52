"""`logprobs` / `top_logprobs` pass through, as ChatOpenAI returns them (against the emulator)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import BackendBadRequestError

MODEL = "emulated-llama-3-8b"


def _model(url: str, **kw: Any) -> BatchedChatModel:
    return BatchedChatModel(
        model=MODEL,
        base_url=url,
        max_tokens=16,
        extra_body={"emulator": {"output_tokens": 6, "scenario": "echo"}},
        **kw,
    )


def _check(content: list[dict[str, Any]], tokens: int, top: int) -> None:
    assert len(content) == tokens
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert -2.0 < entry["logprob"] <= 0.0
        assert bytes(entry["bytes"]).decode() == entry["token"]
        assert len(entry["top_logprobs"]) == top
        if top:
            assert entry["top_logprobs"][0]["token"] == entry["token"]


async def test_invoke_returns_logprobs_as_chatopenai_does(emulator_url: str) -> None:
    llm = _model(emulator_url, logprobs=True, top_logprobs=3)
    message = await llm.ainvoke("say something")
    content = message.response_metadata["logprobs"]["content"]
    assert message.usage_metadata is not None
    _check(content, message.usage_metadata["output_tokens"], 3)
    assert "".join(e["token"] for e in content) == message.content
    # Deterministic: the same text gives the same logprobs.
    again = await llm.ainvoke("say something")
    assert again.response_metadata["logprobs"] == message.response_metadata["logprobs"]
    # bind(logprobs=True) on a model without the field set, as ChatOpenAI's docs show.
    bound = await _model(emulator_url).bind(logprobs=True).ainvoke("say something")
    _check(bound.response_metadata["logprobs"]["content"], len(content), 0)
    # Not asked: not returned.
    plain = await _model(emulator_url).ainvoke("say something")
    assert "logprobs" not in plain.response_metadata


async def test_streamed_chunks_carry_their_tokens_logprobs(emulator_url: str) -> None:
    llm = _model(emulator_url, logprobs=True, top_logprobs=2)
    total: AIMessageChunk | None = None
    with_logprobs = 0
    async for chunk in llm.astream("say something"):
        if chunk.response_metadata.get("logprobs"):
            with_logprobs += 1
        total = chunk if total is None else total + chunk
    assert total is not None
    content = total.response_metadata["logprobs"]["content"]
    assert total.usage_metadata is not None
    _check(content, total.usage_metadata["output_tokens"], 2)
    assert "".join(e["token"] for e in content) == total.content
    assert with_logprobs >= 1


async def test_top_logprobs_without_logprobs_is_a_bad_request(emulator_url: str) -> None:
    llm = _model(emulator_url, top_logprobs=2, max_retries=0)
    with pytest.raises(BackendBadRequestError, match="logprobs"):
        await llm.ainvoke("say something")
