"""The engine honours the priority the scheduler sends (`--scheduling-policy priority`).

The engine runs at most two requests (`max_num_seqs=2`) and is paused
(vLLM's dev-mode `POST /pause?mode=keep`: requests queue, no step runs).
Four fresh calls (turn 0) and one call of a conversation three turns
along (sent last) go out through BatchedChatModel; the scheduler's default `depth_first`
priority gives the last one `priority=-3` (lower runs sooner on vLLM), the
others 0. Once all five wait on the engine it is resumed: its first step
takes the two best, the deep call and one fresh call, and the other three
fresh calls wait for a place. So the deep call, sent last, finishes first or
second; under `fcfs` it would finish last. The pause is
the barrier that makes this deterministic: without it, when each request
reaches the engine on a loaded 2-core host decides the order (an earlier
version with long blocker requests failed 2 runs in 6 that way).

The same small engine (32,768 KV tokens, 32,736 usable) then shows a
preemption as the library reads it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel
from langgraph_batch.backends.vllm import VLLMBackend
from langgraph_batch.scheduler import BatchPolicy
from tests.engine._client import counter
from tests.faultproxy import FaultProxy, Seen

SMALL = {
    "scheduling_policy": "priority",
    "max_num_seqs": 2,
    "kv_tokens": 32768,
    "max_model_len": 16640,
    "env": (("VLLM_SERVER_DEV_MODE", "1"),),  # /pause and /resume
}


@pytest.fixture(scope="module")
def small(start_engine: Callable[..., VLLMCPUServer]) -> VLLMCPUServer:
    """A priority-scheduling engine with two places and 32,768 KV tokens."""
    return start_engine(**SMALL)


def model(url: str) -> BatchedChatModel:
    """A model whose scheduler sends every call at once (a fixed limit of 8).

    By default the scheduler stops adding to an engine that keeps a queue of
    its own (its adaptive limit grows only while `num_requests_waiting` is 0)
    and orders its own queue by the same priority; a fixed limit lets the
    calls reach the engine's queue, where the engine must order them.
    """
    backend = VLLMBackend(url, priority_scheduling=True)
    return BatchedChatModel(
        model="tiny-llama",
        backend=backend,
        policy=BatchPolicy(adaptive=False, inflight_limit=8, decode_cap=False),
        max_tokens=16,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )


def deep(text: str, turns: int) -> list[BaseMessage]:
    """A conversation `turns` model answers along, asking `text` next."""
    history: list[BaseMessage] = []
    for t in range(turns):
        history += [HumanMessage(f"step {t}"), AIMessage(f"done {t}")]
    return [*history, HumanMessage(text)]


SETTLE_S = 2.0
"""After the proxy forwarded the last call: time for the API server to hand it to the engine
core. A paused engine shows no queue (its gauges update only with a step), so nothing can be
awaited instead; a call that missed it would start late and fail the test, never pass it."""


async def run_order(server: VLLMCPUServer, proxy: FaultProxy) -> list[str]:
    """Queue four fresh calls, then a deep one, on the paused engine; resume; the finish order."""
    llm = model(proxy.url)
    done: list[str] = []
    calls: list[asyncio.Task[Any]] = []
    try:
        await llm.ainvoke("warm up")  # the scheduler and the engine's chat path are ready
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            (await client.post("/pause", params={"mode": "keep"})).raise_for_status()
            try:
                queue = [(f"fresh-{i}", f"fresh {i}", 0) for i in range(4)]
                queue.append(("deep", "deep question", 3))
                forwarded = asyncio.Event()
                wanted = {text for _, text, _ in queue}

                def note(seen: Seen) -> None:
                    wanted.difference_update(t for t in list(wanted) if t.encode() in seen.body)
                    if not wanted:
                        forwarded.set()

                proxy.decide = note
                for name, text, turns in queue:
                    task = asyncio.create_task(llm.ainvoke(deep(text, turns)))
                    task.add_done_callback(lambda _t, name=name: done.append(name))
                    calls.append(task)
                async with asyncio.timeout(60):
                    await forwarded.wait()  # every call reached the proxy
                await asyncio.sleep(SETTLE_S)
            finally:
                (await client.post("/resume")).raise_for_status()
        await asyncio.gather(*calls)
    finally:
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await llm.get_scheduler().aclose()
    return done


async def test_higher_priority_finishes_before_lower_ones_queued_earlier(
    small: VLLMCPUServer,
) -> None:
    async with FaultProxy(small.url) as proxy:  # records what the library sent
        order = await run_order(small, proxy)
        sent = [json.loads(s.body) for s in proxy.seen if s.path.startswith("/v1/chat")]
    # The deep call took one of the two places of the first step, ahead of the fresh
    # calls sent before it: it finishes first or second (under fcfs: last).
    assert order.index("deep") <= 1, order
    # The priorities on the wire are the scheduler's depth_first ones: -turns.
    # A batched call (/v1/chat/completions/batch) carries several conversations, and
    # the scheduler batches only calls of one priority.
    by_text = {
        conv[-1]["content"]: b["priority"]
        for b in sent
        for conv in (b["messages"] if isinstance(b["messages"][0], list) else [b["messages"]])
    }
    assert [by_text[f"fresh {i}"] for i in range(4)] == [0, 0, 0, 0]
    assert by_text["deep question"] == -3


async def test_preemptions_are_read_from_the_engine(small: VLLMCPUServer) -> None:
    # Two contexts of 16,500 tokens cannot both stay in 32,736 usable KV tokens: vLLM
    # preempts one (and recomputes it later). Sent past the library, whose KV-aware
    # admission would not send them together; the library reads the count.
    backend = VLLMBackend(small.url)
    before = await backend.metrics()
    assert before is not None
    assert before.num_preemptions_total is not None
    body = {"model": small.model, "max_tokens": 500, "ignore_eos": True}
    prompts = [[100 + (i + j) % 400 for j in range(16000)] for i in range(2)]
    async with httpx.AsyncClient(timeout=300) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{small.url}/v1/completions", json=body | {"prompt": p})
                for p in prompts
            )
        )
    assert [a.json()["usage"]["completion_tokens"] for a in answers] == [500, 500]
    after = await backend.metrics()
    assert after is not None
    assert after.num_preemptions_total is not None
    assert after.num_preemptions_total > before.num_preemptions_total
    assert await counter(small, "vllm:num_preemptions_total") == after.num_preemptions_total
    await backend.aclose()
