"""BatchedChatModel against the real engine: invoke, stream, batch, usage, raw prompts.

Random weights write noise, so each call's shape is forced: `max_tokens` with
`ignore_eos` (exactly that many tokens) and greedy sampling (the same noise
every time). Usage is checked against the engine's own counters
(`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`); the tests of this
module run one after another on the session's engine, so the counters' deltas
are theirs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel
from langgraph_batch.backends.base import ChatRequest
from tests.engine._client import GREEDY_NOISE, tokens_totals, vllm_url, wait_totals
from tests.faultproxy import FaultProxy


def model(server: VLLMCPUServer, **kw: Any) -> BatchedChatModel:
    """A model of the engine, greedy, answers of exactly `max_tokens` (default 8)."""
    kw.setdefault("max_tokens", 8)
    return BatchedChatModel(
        model=server.model, base_url=kw.pop("base_url", vllm_url(server)), **GREEDY_NOISE, **kw
    )


async def test_invoke_returns_the_engines_answer_and_usage(engine: VLLMCPUServer) -> None:
    llm = model(engine)
    before = await tokens_totals(engine)
    msg = await llm.ainvoke([SystemMessage("You review code."), HumanMessage("Review a.py")])
    usage = msg.usage_metadata
    assert usage is not None
    assert usage["output_tokens"] == 8
    assert usage["total_tokens"] == usage["input_tokens"] + 8
    assert isinstance(msg.content, str)
    assert msg.content
    meta = msg.response_metadata
    assert meta["finish_reason"] == "length"
    assert meta["model_name"] == engine.model
    # vLLM names its response after the request id the client sent (X-Request-Id).
    assert meta["id"] == f"chatcmpl-{meta['request_id']}"
    assert "usage_estimated" not in meta
    delta = await wait_totals(engine, before, usage["input_tokens"], 8)
    assert delta == (usage["input_tokens"], 8)
    await llm.get_scheduler().aclose()


async def test_stream_has_the_invoked_text_and_the_engines_usage(engine: VLLMCPUServer) -> None:
    llm = model(engine, max_tokens=12)
    prompt = "Summarise the design of a B-tree."
    invoked = await llm.ainvoke(prompt)
    before = await tokens_totals(engine)
    chunks: list[AIMessageChunk] = [c async for c in llm.astream(prompt, stream_usage=True)]
    assert len(chunks) >= 3  # content arrived in pieces, not as one blob
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.content == invoked.content  # greedy: the same tokens, streamed
    assert chunks[-1].chunk_position == "last"
    usage = whole.usage_metadata
    assert usage is not None
    assert usage == invoked.usage_metadata | {
        "input_token_details": usage.get("input_token_details", {})
    }
    assert usage["output_tokens"] == 12
    delta = await wait_totals(engine, before, usage["input_tokens"], 12)
    assert delta == (usage["input_tokens"], 12)
    # The prompt was served before: the engine's prefix cache answered part of it.
    assert usage.get("input_token_details", {}).get("cache_read", 0) > 0
    await llm.get_scheduler().aclose()


async def test_batch_goes_out_in_one_call_and_each_answer_has_its_usage(
    engine: VLLMCPUServer,
) -> None:
    async with FaultProxy(engine.url) as proxy:
        llm = model(engine, max_tokens=5, base_url=proxy.url.replace("http://", "vllm://"))
        prompts = ["a", "two words", "a somewhat longer prompt of several words", "x " * 60]
        before = await tokens_totals(engine)
        msgs = await llm.abatch(prompts)
        counted = model(engine)  # the engine itself: the proxy is gone after this block
        chat = [s for s in proxy.seen if s.path.startswith("/v1/chat/completions")]
    # The scheduler merged the four calls into one `/v1/chat/completions/batch` call.
    assert [s.path for s in chat] == ["/v1/chat/completions/batch"]
    assert len(json.loads(chat[0].body)["messages"]) == 4
    assert len(msgs) == 4
    for m in msgs:
        assert m.usage_metadata is not None
        assert m.usage_metadata["output_tokens"] == 5
        assert m.response_metadata["finish_reason"] == "length"
        assert m.response_metadata["usage_estimated"] is True
    shares = [m.usage_metadata["input_tokens"] for m in msgs if m.usage_metadata]
    assert shares == sorted(shares)  # longer prompts got larger shares
    # The shares add up exactly to what the engine counted for the call.
    delta = await wait_totals(engine, before, sum(shares), 20)
    assert delta == (sum(shares), 20)
    # The exact counts (/tokenize, the engine's template) add up to the same total;
    # each share is an estimate from the text's length (see backends/_batching.py).
    exact = [await counted.aget_num_tokens_from_messages([HumanMessage(p)]) for p in prompts]
    assert sum(exact) == sum(shares)
    for share, true in zip(shares, exact, strict=True):
        assert abs(share - true) <= max(10, true // 2), (shares, exact)
    await llm.get_scheduler().aclose()
    await counted.get_scheduler().aclose()


async def test_raw_prompts_share_one_list_prompt_call_with_exact_usage(
    engine: VLLMCPUServer,
) -> None:
    # Prompts of token ids (no chat template, no BOS added): their lengths are the
    # engine's prompt counts, so the per-prompt split of the call's usage is exact.
    lengths = [3, 17, 40, 96]
    async with FaultProxy(engine.url) as proxy:
        llm = model(engine, base_url=proxy.url.replace("http://", "vllm://"))
        scheduler = llm.get_scheduler()
        before = await tokens_totals(engine)
        params = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
        requests = [
            ChatRequest(
                model=engine.model,
                messages=(),
                params={**params, "prompt": [100 + (i * 7 + j) % 500 for j in range(n)]},
                batchable=True,
            )
            for i, n in enumerate(lengths)
        ]
        responses = await asyncio.gather(*(scheduler.submit(r) for r in requests))
        calls = [s for s in proxy.seen if s.path == "/v1/completions"]
    assert len(calls) == 1
    assert [len(p) for p in json.loads(calls[0].body)["prompt"]] == lengths
    for response, n in zip(responses, lengths, strict=True):
        assert response.usage is not None
        assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (n, 6)
        assert response.finish_reason == "length"
        assert response.content
    delta = await wait_totals(engine, before, sum(lengths), 6 * len(lengths))
    assert delta == (sum(lengths), 6 * len(lengths))
    await scheduler.aclose()


async def test_text_prompts_in_one_list_prompt_call_get_their_exact_usage(
    engine: VLLMCPUServer,
) -> None:
    # Text prompts: the backend asks for return_token_ids, so each member's usage is
    # its own (equal to the engine's /tokenize count of its text: no BOS is added).
    texts = ["a", "two words here", "a longer prompt " * 9]
    async with FaultProxy(engine.url) as proxy:
        llm = model(engine, base_url=proxy.url.replace("http://", "vllm://"))
        scheduler = llm.get_scheduler()
        params = {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True}
        requests = [
            ChatRequest(
                model=engine.model, messages=(), params={**params, "prompt": t}, batchable=True
            )
            for t in texts
        ]
        responses = await asyncio.gather(*(scheduler.submit(r) for r in requests))
        calls = [json.loads(s.body) for s in proxy.seen if s.path == "/v1/completions"]
    assert len(calls) == 1
    assert calls[0]["prompt"] == texts
    assert calls[0]["return_token_ids"] is True
    counter = model(engine)
    exact = [await counter.aget_num_tokens(t) for t in texts]
    await counter.get_scheduler().aclose()
    for response, n in zip(responses, exact, strict=True):
        assert response.usage is not None
        assert not response.usage.estimated
        assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (n, 5)
    await scheduler.aclose()
