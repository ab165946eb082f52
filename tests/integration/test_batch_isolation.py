"""HTTP batching keeps isolation and usage (issue 10, item 6), against the emulator.

Eight single-turn prompts arrive together, so the scheduler merges them into
one `/v1/chat/completions/batch` call. One of them does not fit the server's
`max_model_len`. Before, the whole call failed and all eight callers got
`ContextLengthExceededError`; batched answers also carried no usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.emulator.tokenizer import tokenize_chat
from langgraph_batch.errors import ContextLengthExceededError
from tests.faultproxy import FaultProxy, Seen

MODEL = "emulated-llama-3-8b"


async def _eight_callers(url: str) -> tuple[list[Any], BatchedChatModel]:
    llm = BatchedChatModel(
        model=MODEL,
        base_url=url,
        max_tokens=16,
        extra_body={"emulator": {"output_tokens": 6}},
        max_retries=0,
    )
    prompts = [f"short prompt {i}" for i in range(8)]
    prompts[3] = " ".join(f"word{i}" for i in range(400))  # ~800 tokens > 256
    results = await asyncio.gather(*(llm.ainvoke(p) for p in prompts), return_exceptions=True)
    return results, llm


def _check(results: list[Any]) -> None:
    assert isinstance(results[3], ContextLengthExceededError), results[3]
    good = [r for i, r in enumerate(results) if i != 3]
    for msg in good:
        assert not isinstance(msg, BaseException), msg
        assert msg.text
        usage = msg.usage_metadata
        assert usage is not None
        assert usage["input_tokens"] > 0
        assert usage["output_tokens"] > 0


@pytest.mark.parametrize("models_known", [True, False])
async def test_one_oversized_prompt_fails_only_its_caller(
    start_emulator: Callable[..., str], models_known: bool
) -> None:
    url = await asyncio.to_thread(start_emulator, max_model_len=256, scenario="echo")

    def decide(seen: Seen) -> str | None:
        # Without max_model_len from /v1/models there is no pre-filter: the batched
        # call itself fails with a 400 and must be split.
        return None if models_known or seen.path != "/v1/models" else "html502"

    async with FaultProxy(url, decide=decide) as proxy:
        results, llm = await _eight_callers(proxy.url.replace("http://", "vllm://"))
        _check(results)
        batches = [s for s in proxy.seen if s.path == "/v1/chat/completions/batch"]
        assert batches  # the prompts did go out batched
        sizes = [len(json.loads(s.body)["messages"]) for s in batches]
        if models_known:
            assert sum(sizes) == 7  # the long one went alone from the start
        else:
            assert 8 in sizes  # one call with all eight, refused, then split
        stats = llm.get_scheduler().stats()
        assert (stats.completed, stats.failed, stats.batches) == (7, 1, len(batches))
        await llm.get_scheduler().aclose()


async def test_batched_usage_adds_up_to_the_servers_totals(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(start_emulator, scenario="echo")
    async with FaultProxy(url) as proxy:
        llm = BatchedChatModel(
            model=MODEL,
            base_url=proxy.url.replace("http://", "vllm://"),
            max_tokens=16,
            extra_body={"emulator": {"output_tokens": 6}},
        )
        prompts = [f"say {'word ' * (4 * i)}" for i in range(1, 9)]
        msgs = await asyncio.gather(*(llm.ainvoke(p) for p in prompts))
        batched = [
            (p, m)
            for p, m in zip(prompts, msgs, strict=True)
            if m.response_metadata.get("usage_estimated")
        ]
        assert len(batched) >= 2
        # The emulator's tokenizer is the server's: the exact prompt lengths are known.
        exact = [len(tokenize_chat([{"role": "user", "content": p}])) for p, _ in batched]
        shares = [m.usage_metadata["input_tokens"] for _, m in batched if m.usage_metadata]
        assert sum(shares) == sum(exact)  # the shares add up to the server's totals
        for share, true in zip(shares, exact, strict=True):
            assert abs(share - true) <= max(3, true // 4), (shares, exact)
        assert all(m.usage_metadata and m.usage_metadata["output_tokens"] > 0 for _, m in batched)
        await llm.get_scheduler().aclose()
